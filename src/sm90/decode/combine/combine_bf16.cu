// Combine kernel, out bf16.
#include "sm90/decode/combine/combine_kernel.cuh"

namespace mla::sm90::combine {
template cudaError_t launch_combine<Elem::kBf16>(const DecodeKernelParams&, int, int, bool,
                                                 cudaStream_t, bool);
}  // namespace mla::sm90::combine
