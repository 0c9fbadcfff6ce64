// Seesaw decode kernel, query and kv_cache bf16.
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw<Elem::kBf16, Elem::kBf16>(const DecodeKernelParams&,
                                                             const CUtensorMap&, const CUtensorMap&,
                                                             int, bool, bool, bool, bool,
                                                             cudaStream_t, bool);
template int pair_clusters_resident<Elem::kBf16>();
}  // namespace mla::sm90::seesaw
