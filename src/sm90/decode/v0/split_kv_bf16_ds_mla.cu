// v0 split-KV decode kernel, query bf16, kv_cache fp8_ds_mla (656-byte rows).
#include "sm90/decode/v0/split_kv_kernel.cuh"

namespace mla::sm90::v0 {
template cudaError_t launch_split_kv<Elem::kBf16, Elem::kFp8DsMla>(const DecodeKernelParams&,
                                                                   cudaStream_t, bool);
}  // namespace mla::sm90::v0
