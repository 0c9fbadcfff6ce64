// Seesaw decode kernel for sparse calls, fp16 query over an fp16 kv_cache.
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw_sparse<Elem::kFp16, Elem::kFp16>(const DecodeKernelParams&,
                                                                    const CUtensorMap&, int, bool,
                                                                    bool, cudaStream_t, bool);
}  // namespace mla::sm90::seesaw
