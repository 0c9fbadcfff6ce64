// v0 combine kernel, out bf16.
#include "sm90/decode/v0/combine_kernel.cuh"

namespace mla::sm90::v0 {
template cudaError_t launch_combine<Elem::kBf16>(const DecodeKernelParams&, int, cudaStream_t,
                                                 bool);
}  // namespace mla::sm90::v0
