// v0 split-KV decode kernel, query fp8, kv_cache fp8.
#include "sm90/decode/v0/split_kv_kernel.cuh"

namespace mla::sm90::v0 {
template cudaError_t launch_split_kv<Elem::kFp8E4M3, Elem::kFp8E4M3>(const DecodeKernelParams&,
                                                                     cudaStream_t, bool);
}  // namespace mla::sm90::v0
