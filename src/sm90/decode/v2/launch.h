// Host-side entry point of the v2 (seesaw) decode kernel; definitions in seesaw_<e>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::v2 {

// Computes the partials of every (split, token, head) as v1 did (same grid,
// tiles of 64 query rows, workspace layout and kv_cache tensor map); one explicit instantiation
// per supported element type (query and kv_cache alike).
template <Elem E>
cudaError_t launch_seesaw(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                          int num_tiles, cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::v2
