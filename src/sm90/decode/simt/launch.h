// Host-side entry point of the SIMT decode kernel; definitions in simt_<q>_<kv>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::simt {

// Grid of the SIMT decode kernel: (query token, head group, split).
inline constexpr int kHeadsPerCta = 16;

// Computes the partials of every (split, token, head), or with params.direct_out (one split) out
// and lse; one explicit instantiation per supported (query, kv) element pair and head dims (L, R),
// in simt_<q>_<kv>.cu. Head dims other than (512, 64) run one split (direct_out).
template <Elem Q, Elem KV, int L = 512, int R = 64>
cudaError_t launch_simt(const DecodeKernelParams& params, cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::simt
