// Seesaw decode kernel, query and kv_cache fp16.
#include "sm90/decode/seesaw/seesaw_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw<Elem::kFp16, Elem::kFp16>(const DecodeKernelParams&,
                                                             const CUtensorMap&, const CUtensorMap&,
                                                             int, bool, bool, bool, bool,
                                                             cudaStream_t, bool);
template int pair_clusters_resident<Elem::kFp16>();
}  // namespace mla::sm90::seesaw
