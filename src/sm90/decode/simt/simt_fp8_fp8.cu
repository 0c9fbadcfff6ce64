// SIMT decode kernel, query fp8, kv_cache fp8.
#include "sm90/decode/simt/simt_kernel.cuh"

namespace mla::sm90::simt {
template cudaError_t launch_simt<Elem::kFp8E4M3, Elem::kFp8E4M3>(const DecodeKernelParams&,
                                                                 cudaStream_t, bool);
// The other head dims FlashInfer's API takes: (256, 64) and (512, 0).
template cudaError_t launch_simt<Elem::kFp8E4M3, Elem::kFp8E4M3, 256, 64>(const DecodeKernelParams&,
                                                                          cudaStream_t, bool);
template cudaError_t launch_simt<Elem::kFp8E4M3, Elem::kFp8E4M3, 512, 0>(const DecodeKernelParams&,
                                                                         cudaStream_t, bool);
}  // namespace mla::sm90::simt
