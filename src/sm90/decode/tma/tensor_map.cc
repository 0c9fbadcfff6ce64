// The kv_cache tensor map of the TMA kernels, encoded on the host per call through the driver entry
// point the runtime hands out (no link against libcuda).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "sm90/decode/tma/tensor_map.h"

namespace mla::sm90::tma {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

cudaError_t make_kv_tensor_map(const DecodeKernelParams& p, Elem kv, CUtensorMap* map,
                               bool e4m3_swizzled) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  if (encode == nullptr) return cudaErrorNotSupported;
  // NOTE: e4m3 boxes land unswizzled (64 bytes a row) and are widened by the producer warps
  // (fp8_ring.cuh); 16-bit boxes land in the 128-byte swizzle the GMMA operands read.
  const bool fp8 = kv == Elem::kFp8E4M3;
  const int64_t elem_bytes = fp8 ? 1 : 2;
  // NOTE: the row's own width (L + R): the boxes of tile chunks a row lacks start past it and
  // land as zeros (params.h, chunk_box).
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.kv_lora_rank + p.rope_dim),
                              static_cast<cuuint64_t>(p.page_size),
                              static_cast<cuuint64_t>(p.num_pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.kv_row_stride * elem_bytes),
                                 static_cast<cuuint64_t>(p.kv_page_stride * elem_bytes)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(std::min(64, p.page_size)), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  // NOTE: no L2 promotion. A box reads 128 bytes from each of 64 rows 1,152 bytes apart; with
  // 256-byte promotion the same stream of 72 KB blocks ran ~12% slower from DRAM (4.15 against
  // 4.65 TB/s, docs/sm90-tma.md, Files); 64 and 128 bytes read as none in the goal suite.
  const CUtensorMapDataType type = fp8                 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : kv == Elem::kBf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // NOTE: e4m3 boxes for the GEMMs (64 bytes of each row) with 128-byte promotion: their chunk
  // pairs fill whole lines (B128 q1 H16 fp8 -2.6%, B64 q2 varlen -1.7% on an H100).
  const CUtensorMapL2promotion promotion =
      fp8 && e4m3_swizzled ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_NONE;
  const CUresult r = encode(map, type, 3, const_cast<void*>(p.kv), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE,
                            !fp8            ? CU_TENSOR_MAP_SWIZZLE_128B
                            : e4m3_swizzled ? CU_TENSOR_MAP_SWIZZLE_64B
                                            : CU_TENSOR_MAP_SWIZZLE_NONE,
                            promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace mla::sm90::tma
