// The kv_cache tensor map of the TMA kernels, encoded on the host per call through the driver entry
// point the runtime hands out (no link against libcuda).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

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

cudaError_t make_query_tensor_map(const DecodeKernelParams& p, Elem q, CUtensorMap* map) {
  const bool sixteen = q == Elem::kBf16 || q == Elem::kFp16;
  const bool e4m3 = q == Elem::kFp8E4M3;
  const int64_t elem_bytes = e4m3 ? 1 : 2;
  const bool ragged = p.cum_seq_lens_q != nullptr;
  // A tile is 64 heads of one token, or 64 / H whole tokens; in the latter, a request's last tile
  // may run past its tokens, which must read as zeros: past q_len of a dense query (the box's
  // out-of-range rows), not the next request's tokens of a ragged one.
  const bool heads_whole = p.num_heads > 0 && p.num_heads % kTileRows == 0;
  const bool tokens_whole = p.num_heads > 0 && kTileRows % p.num_heads == 0 && !ragged;
  if (!(sixteen || e4m3) || p.kv_lora_rank != 512 || p.rope_dim != 64 ||
      !(heads_whole || tokens_whole) || p.num_tokens <= 0 ||
      reinterpret_cast<uintptr_t>(p.query) % 16 != 0) {
    return cudaErrorNotSupported;
  }
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  if (encode == nullptr) return cudaErrorNotSupported;
  // Ragged queries: token t = cum_seq_lens_q[b] + i of one flat run (batch stride 0); dense: token
  // i of request b.
  const int64_t tokens = ragged ? p.num_tokens : p.q_len;
  const int64_t requests = ragged ? 1 : p.batch;
  if (tokens <= 0 || requests <= 0) return cudaErrorNotSupported;
  const cuuint64_t dims[4] = {576, static_cast<cuuint64_t>(p.num_heads),
                              static_cast<cuuint64_t>(tokens), static_cast<cuuint64_t>(requests)};
  // NOTE: a dimension of one element still needs a stride the driver accepts: the run's extent.
  const int64_t batch_stride = ragged ? p.q_token * tokens : p.q_batch;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(p.q_head * elem_bytes),
                                 static_cast<cuuint64_t>(p.q_token * elem_bytes),
                                 static_cast<cuuint64_t>(batch_stride * elem_bytes)};
  for (const cuuint64_t st : strides) {
    if (st == 0 || st % 16 != 0) return cudaErrorNotSupported;
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(heads_whole ? kTileRows : p.num_heads),
                             static_cast<cuuint32_t>(heads_whole ? 1 : kTileRows / p.num_heads), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = e4m3               ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : q == Elem::kBf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // NOTE: 64 columns a box: 128 bytes of a 16-bit row (128-byte swizzle), 64 of an e4m3 row (the
  // FP8 seesaw kernels' 64-byte swizzle).
  const CUresult r = encode(map, type, 4, const_cast<void*>(p.query), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            e4m3 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace mla::sm90::tma
