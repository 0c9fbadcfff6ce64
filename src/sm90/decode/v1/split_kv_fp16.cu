// v1 split-KV decode kernel, query and kv_cache fp16.
#include "sm90/decode/v1/split_kv_kernel.cuh"

namespace mla::sm90::v1 {
template cudaError_t launch_split_kv<Elem::kFp16>(const DecodeKernelParams&, const CUtensorMap&,
                                                  int, cudaStream_t, bool);
}  // namespace mla::sm90::v1
