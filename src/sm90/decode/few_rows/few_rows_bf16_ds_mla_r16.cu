// Few-rows decode kernel, bf16 query over an fp8_ds_mla kv_cache (gathered and widened with its
// scales: tma/gather.cuh), 16 padded query rows.
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows<Elem::kBf16, Elem::kFp8DsMla, 16>(const DecodeKernelParams&,
                                                                       const CUtensorMap&,
                                                                       cudaStream_t, bool, bool,
                                                                       bool, bool);
}  // namespace mla::sm90::few_rows
