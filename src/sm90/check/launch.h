// Host-side entry point of the checked mode's index check (index_check_kernel.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "sm90/params.h"

namespace mla::sm90::check {

// Checked mode: writes the smallest bad-entry key (IndexCheck) into params.record.
cudaError_t launch_index_check(const IndexCheckParams& params, cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::check
