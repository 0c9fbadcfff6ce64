// SIMT decode kernel, query bf16, kv_cache bf16.
#include "sm90/decode/simt/simt_kernel.cuh"

namespace mla::sm90::simt {
template cudaError_t launch_simt<Elem::kBf16, Elem::kBf16>(const DecodeKernelParams&, cudaStream_t,
                                                           bool);
// The other head dims FlashInfer's API takes: (256, 64) and (512, 0).
template cudaError_t launch_simt<Elem::kBf16, Elem::kBf16, 256, 64>(const DecodeKernelParams&,
                                                                    cudaStream_t, bool);
template cudaError_t launch_simt<Elem::kBf16, Elem::kBf16, 512, 0>(const DecodeKernelParams&,
                                                                   cudaStream_t, bool);
}  // namespace mla::sm90::simt
