// Host-side entry point of the combine kernel; definitions in combine_<out>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::combine {

// Merges the partials of each row into out (and lse), applying sinks and bmm2_scale; the CTA shape
// follows the rows, the splits and `sm_count`: one warp per row (combine_rows_kernel) where the
// call's rows have at most `rows_max_splits` splits and fill at least half the SMs with its CTAs
// (every call where `rows_max_splits` is kMaxSplits), else items of rows and column chunks
// (combine_kernel); where `one_batch` and a call in the uniform layout has at most kRowsBatch
// splits a row, the row kernel's one-pass form (combine_rows_one_batch_kernel). One explicit
// instantiation per out element type.
template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, int sm_count, int rows_max_splits,
                           bool one_batch, cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::combine
