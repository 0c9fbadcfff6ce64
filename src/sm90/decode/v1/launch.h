// Host-side entry points of the v1 decode kernel (definitions in the .cu/.cc files of this
// folder).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::v1 {

// Query rows (token * H + head of one request) per CTA.
inline constexpr int kTileRows = 64;

// The 3-D tensor map (D, page_size, P) over kv_cache that the producer loads K blocks through:
// boxes of 64 columns x min(64, page_size) rows, 128-byte swizzle. Fails (no map) where the driver
// rejects the strides; the caller then takes v0.
cudaError_t make_kv_tensor_map(const DecodeKernelParams& params, Elem kv, CUtensorMap* map);

// Computes the partials of every (split, token, head) like v0::launch_split_kv; one explicit
// instantiation per supported element type (query and kv_cache alike), in split_kv_<e>.cu.
template <Elem E>
cudaError_t launch_split_kv(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                            int num_tiles, cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::v1
