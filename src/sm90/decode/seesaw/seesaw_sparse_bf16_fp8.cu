// Seesaw decode kernel for sparse calls, bf16 query over an e4m3 kv_cache (bf16 GEMMs).
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw_sparse<Elem::kBf16, Elem::kFp8E4M3>(const DecodeKernelParams&,
                                                                       const CUtensorMap&, int,
                                                                       bool, bool, cudaStream_t,
                                                                       bool);
}  // namespace mla::sm90::seesaw
