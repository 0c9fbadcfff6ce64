// Host-side entry points of the v0 decode kernels (definitions in the .cu files of this folder).
#pragma once

#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::v0 {

// Grid of the split-KV decode kernel: (query token, head group, split).
inline constexpr int kHeadsPerCta = 16;

// Computes the partials of every (split, token, head); one explicit instantiation per supported
// (query, kv) element pair, in decode_<q>_<kv>.cu.
template <Elem Q, Elem KV>
cudaError_t launch_split_kv(const DecodeKernelParams& params, cudaStream_t stream, bool pdl);

// Merges the partials of each row into out (and lse), applying sinks and bmm2_scale; the CTA shape
// follows the rows, the splits and `sm_count`.
template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, int sm_count, cudaStream_t stream,
                           bool pdl);

// Checked mode: writes the smallest bad-entry key (IndexCheck) into params.record.
cudaError_t launch_index_check(const IndexCheckParams& params, cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::v0
