// The FP8 seesaw kernel: an e4m3 query over an e4m3 cache on the FP8 tensor cores.
#include "sm90/decode/seesaw/seesaw_fp8_kernel.cuh"

namespace mla::sm90::seesaw {
template cudaError_t launch_seesaw_fp8<Elem::kFp8E4M3, Elem::kFp8E4M3>(const DecodeKernelParams&,
                                                                       const CUtensorMap&,
                                                                       const CUtensorMap&, int,
                                                                       bool, cudaStream_t, bool);
}  // namespace mla::sm90::seesaw
