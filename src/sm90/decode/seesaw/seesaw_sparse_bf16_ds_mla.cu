// Seesaw decode kernel for sparse calls, bf16 query over an fp8_ds_mla kv_cache (bf16 GEMMs).
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw_sparse<Elem::kBf16, Elem::kFp8DsMla>(const DecodeKernelParams&,
                                                                        const CUtensorMap&, int,
                                                                        bool, bool, cudaStream_t,
                                                                        bool);
}  // namespace mla::sm90::seesaw
