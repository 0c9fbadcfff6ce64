// Host-side pieces of the TMA kernels (seesaw/, few_rows/): the query-row tile of their grids and
// the kv_cache tensor map (tensor_map.cc).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::tma {

// Query rows (token * H + head of one request) per CTA.
inline constexpr int kTileRows = 64;

// The 3-D tensor map (D, page_size, P) over kv_cache that the producer loads K blocks through:
// boxes of 64 columns x min(64, page_size) rows, 128-byte swizzle (16-bit caches); e4m3 caches
// unswizzled (widened in shared memory: fp8_ring.cuh) or, with `e4m3_swizzled` (the few-rows
// kernel's FP8 tensor cores), in the 64-byte swizzle their GMMA operands read. Fails (no map)
// where the driver rejects the strides; the caller then runs the SIMT kernel.
cudaError_t make_kv_tensor_map(const DecodeKernelParams& params, Elem kv, CUtensorMap* map,
                               bool e4m3_swizzled = false);

// The 4-D tensor map (576, H, tokens, requests) over the query that the seesaw kernels load their
// query tiles through: boxes of 64 columns x 64 rows (64 heads of one token, or all H heads of
// 64 / H tokens), so that nine boxes write the tile in SmemLayoutQ: 128-byte swizzle for a 16-bit
// query `q`, 64-byte for an e4m3 one (the FP8 seesaw kernels). Only for those, head dims (512,
// 64), and H a multiple of 64, or a divisor of 64 with a dense query (a request's last tile then
// reads zeros past q_len); fails (no map) otherwise or where the driver rejects the strides, and
// the consumers load the tile themselves. The callers add what their kernels need: a cache of the
// query's type and a kernel that reads the map (dense), a uniform call of a 16-bit query, H a
// multiple of 64 (sparse).
cudaError_t make_query_tensor_map(const DecodeKernelParams& params, Elem q, CUtensorMap* map);

}  // namespace mla::sm90::tma
