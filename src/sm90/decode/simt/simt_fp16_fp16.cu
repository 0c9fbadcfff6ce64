// SIMT decode kernel, query fp16, kv_cache fp16.
#include "sm90/decode/simt/simt_kernel.cuh"

namespace mla::sm90::simt {
template cudaError_t launch_simt<Elem::kFp16, Elem::kFp16>(const DecodeKernelParams&, cudaStream_t,
                                                           bool);
// The other head dims FlashInfer's API takes: (256, 64) and (512, 0).
template cudaError_t launch_simt<Elem::kFp16, Elem::kFp16, 256, 64>(const DecodeKernelParams&,
                                                                    cudaStream_t, bool);
template cudaError_t launch_simt<Elem::kFp16, Elem::kFp16, 512, 0>(const DecodeKernelParams&,
                                                                   cudaStream_t, bool);
}  // namespace mla::sm90::simt
