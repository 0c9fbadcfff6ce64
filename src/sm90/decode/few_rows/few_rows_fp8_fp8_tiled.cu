// Few-rows decode kernel, e4m3 query and kv_cache, 64-row tiles of the seesaw kernel's calls.
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows_tiled<Elem::kFp8E4M3, Elem::kFp8E4M3>(
    const DecodeKernelParams&, const CUtensorMap&, int, cudaStream_t, bool);
}  // namespace mla::sm90::few_rows
