// v0 split-KV decode kernel, query fp16, kv_cache fp16.
#include "sm90/decode/v0/split_kv_kernel.cuh"

namespace mla::sm90::v0 {
template cudaError_t launch_split_kv<Elem::kFp16, Elem::kFp16>(const DecodeKernelParams&,
                                                               cudaStream_t, bool);
}  // namespace mla::sm90::v0
