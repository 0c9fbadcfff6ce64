// Seesaw decode kernel, bf16 query over an fp8_ds_mla kv_cache (gathered and widened with its
// scales: tma/gather.cuh; bf16 GEMMs).
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw<Elem::kBf16, Elem::kFp8DsMla>(const DecodeKernelParams&,
                                                                 const CUtensorMap&,
                                                                 const CUtensorMap&, int, bool,
                                                                 bool, bool, bool, cudaStream_t,
                                                                 bool);
}  // namespace mla::sm90::seesaw
