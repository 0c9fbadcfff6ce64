// Merge kernel, out bf16.
#include "sm90/decode/merge/merge_kernel.cuh"

namespace mla::sm90::merge {
template cudaError_t launch_merge<Elem::kBf16>(const MergeKernelParams&, int, cudaStream_t, bool);
}  // namespace mla::sm90::merge
