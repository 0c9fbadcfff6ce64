// Seesaw decode kernel, bf16 query over an e4m3 kv_cache (fp16 GEMMs over the query scaled per
// row: seesaw_kernel.cuh, kScaledSeesawQuery).
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw<Elem::kBf16, Elem::kFp8E4M3>(const DecodeKernelParams&,
                                                                const CUtensorMap&,
                                                                const CUtensorMap&, int, bool, bool,
                                                                bool, bool, cudaStream_t, bool);
}  // namespace mla::sm90::seesaw
