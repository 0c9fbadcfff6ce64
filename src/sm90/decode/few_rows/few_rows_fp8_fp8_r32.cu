// Few-rows decode kernel, e4m3 query and kv_cache, 32 padded query rows.
#include "sm90/decode/few_rows/few_rows_kernel.cuh"

namespace mla::sm90::few_rows {
template cudaError_t launch_few_rows<Elem::kFp8E4M3, Elem::kFp8E4M3, 32>(const DecodeKernelParams&,
                                                                         const CUtensorMap&,
                                                                         cudaStream_t, bool, bool,
                                                                         bool, bool);
}  // namespace mla::sm90::few_rows
