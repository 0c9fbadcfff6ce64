// Few-rows decode kernel for sparse calls, bf16 query over an e4m3 kv_cache (bf16 GEMMs), 16 and 32
// padded query rows.
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows_sparse<Elem::kBf16, Elem::kFp8E4M3, 16>(
    const DecodeKernelParams&, cudaStream_t, bool, bool, bool, bool, bool);
template cudaError_t launch_few_rows_sparse<Elem::kBf16, Elem::kFp8E4M3, 32>(
    const DecodeKernelParams&, cudaStream_t, bool, bool, bool, bool, bool);
}  // namespace mla::sm90::few_rows
