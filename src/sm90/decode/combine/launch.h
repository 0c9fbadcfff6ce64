// Host-side entry point of the combine kernel; definitions in combine_<out>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::combine {

// Merges the partials of each row into out (and lse), applying sinks and bmm2_scale; the CTA shape
// follows the rows, the splits and `sm_count`; each CTA takes at least `min_items` items where
// there are that many (1: the grid is one wave of resident CTAs, or the items if fewer). One
// explicit instantiation per out element type.
template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, int sm_count, int min_items,
                           cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::combine
