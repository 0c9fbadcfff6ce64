// Seesaw decode kernel for sparse calls, bf16 query over a bf16 kv_cache.
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw_sparse<Elem::kBf16, Elem::kBf16>(const DecodeKernelParams&,
                                                                    const CUtensorMap&, int, bool,
                                                                    bool, cudaStream_t, bool);
}  // namespace mla::sm90::seesaw
