// Host-side entry point of the few-rows decode kernel; definitions in few_rows_<e>_r<n>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::few_rows {

// Query rows (token * H + head of one request) one CTA can hold: calls with H x max_q_len up to
// this many rows per request run here, one tile per request.
inline constexpr int kMaxRows = 32;

// Computes the partials of every (split, token, head) exactly like tma::launch_seesaw (same
// workspace layouts and kv_cache tensor map), for calls whose requests have at most kRows = 16 or
// 32 query rows: on the balanced schedule where params.sched_requests is set (grid (1,
// num_parts)), else in the uniform layout (grid (1, B, num_splits)); one explicit instantiation
// per (query, kv_cache) pair of tma::Formats and kRows. fp8_direct (an e4m3 cache only): the GEMMs
// read the e4m3 blocks as they land, over a kv_map of 64-byte-swizzled boxes
// (tma::make_kv_tensor_map's e4m3_swizzled): both on the FP8 tensor cores with an e4m3 query, fp16
// GEMMs fed from registers with a bf16 query; else an e4m3 cache is widened in shared memory.
// deep_ring (fp8_direct with an e4m3 query only): the e4m3 blocks on four stages instead of two
// (the route's few_rows_deep). three (fp8_direct with a bf16 query, 16 rows): three consumer
// warpgroups instead of two (the route's few_rows_three).
template <Elem Q, Elem KV, int kRows>
cudaError_t launch_few_rows(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                            cudaStream_t stream, bool pdl, bool fp8_direct = false,
                            bool deep_ring = false, bool three = false);

// A sparse call: grid (1, params.num_tokens, params.num_splits), one token's H <= kRows heads per
// CTA, the blocks gathered by index (tma/gather.cuh); same workspace layout. fp8_direct (a
// per-tensor e4m3 cache only): the rows land as e4m3 (tma::gather_e4m3_direct) for the GEMMs of
// launch_few_rows' fp8_direct; else an e4m3 cache is widened in shared memory. deep_ring, three:
// as launch_few_rows'. pair_merge (kRows 16, params.num_splits 2, one token per CTA row): a
// token's two splits run as a cluster of two, and the first writes out and lse, merging the
// second's partial: no combine follows.
template <Elem Q, Elem KV, int kRows>
cudaError_t launch_few_rows_sparse(const DecodeKernelParams& params, cudaStream_t stream, bool pdl,
                                   bool fp8_direct = false, bool deep_ring = false,
                                   bool three = false, bool pair_merge = false);

}  // namespace mla::sm90::few_rows
