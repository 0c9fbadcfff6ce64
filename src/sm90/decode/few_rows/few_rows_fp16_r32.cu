// Few-rows decode kernel, query and kv_cache fp16, 32 padded query rows.
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows<Elem::kFp16, Elem::kFp16, 32>(const DecodeKernelParams&,
                                                                   const CUtensorMap&, cudaStream_t,
                                                                   bool, bool, bool, bool);
}  // namespace mla::sm90::few_rows
