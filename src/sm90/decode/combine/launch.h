// Host-side entry point of the combine kernel; definitions in combine_<out>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::combine {

// Merges the partials of each row into out (and lse), applying sinks and bmm2_scale; the CTA shape
// follows the rows, the splits and `sm_count`. One explicit instantiation per out element type.
template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, int sm_count, cudaStream_t stream,
                           bool pdl);

}  // namespace mla::sm90::combine
