// Few-rows decode kernel for sparse calls, fp16 query over an fp16 kv_cache, 16 and 32 padded query
// rows.
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows_sparse<Elem::kFp16, Elem::kFp16, 16>(const DecodeKernelParams&,
                                                                          cudaStream_t, bool, bool,
                                                                          bool, bool, bool);
template cudaError_t launch_few_rows_sparse<Elem::kFp16, Elem::kFp16, 32>(const DecodeKernelParams&,
                                                                          cudaStream_t, bool, bool,
                                                                          bool, bool, bool);
}  // namespace mla::sm90::few_rows
