// Seesaw decode kernel, e4m3 query and kv_cache (fp16 GEMMs).
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw<Elem::kFp8E4M3, Elem::kFp8E4M3>(const DecodeKernelParams&,
                                                                   const CUtensorMap&,
                                                                   const CUtensorMap&, int, bool,
                                                                   bool, bool, bool, cudaStream_t,
                                                                   bool);
}  // namespace mla::sm90::seesaw
