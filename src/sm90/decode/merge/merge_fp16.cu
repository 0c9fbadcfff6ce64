// Merge kernel, out fp16.
#include "sm90/decode/merge/merge_kernel.cuh"

namespace mla::sm90::merge {
template cudaError_t launch_merge<Elem::kFp16>(const MergeKernelParams&, int, cudaStream_t, bool);
}  // namespace mla::sm90::merge
