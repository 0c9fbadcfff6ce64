// Few-rows decode kernel for sparse calls, bf16 query over an fp8_ds_mla kv_cache, 16 padded query
// rows (17..32 heads take two tiles of 16 heads a token; route.cc, sparse_few_rows_tiles).
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows_sparse<Elem::kBf16, Elem::kFp8DsMla, 16>(
    const DecodeKernelParams&, cudaStream_t, bool, bool, bool, bool, bool);
}  // namespace mla::sm90::few_rows
