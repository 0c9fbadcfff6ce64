// The FP8 seesaw kernel with three consumer warpgroups: an e4m3 query over an e4m3 cache.
#include "sm90/decode/seesaw/seesaw_fp8_three_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw_fp8_three<Elem::kFp8E4M3, Elem::kFp8E4M3>(
    const DecodeKernelParams&, const CUtensorMap&, const CUtensorMap&, int, cudaStream_t, bool);
}  // namespace mla::sm90::seesaw
