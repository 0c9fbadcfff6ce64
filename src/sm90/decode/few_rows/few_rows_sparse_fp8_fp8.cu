// Few-rows decode kernel for sparse calls, e4m3 query over an e4m3 kv_cache (fp16 GEMMs), 16 and 32
// padded query rows.
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows_sparse<Elem::kFp8E4M3, Elem::kFp8E4M3, 16>(
    const DecodeKernelParams&, cudaStream_t, bool, bool, bool, bool, bool);
template cudaError_t launch_few_rows_sparse<Elem::kFp8E4M3, Elem::kFp8E4M3, 32>(
    const DecodeKernelParams&, cudaStream_t, bool, bool, bool, bool, bool);
}  // namespace mla::sm90::few_rows
