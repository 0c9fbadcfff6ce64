// The merge kernel's ABI and its host-side entry point; definitions in merge_<out>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "sm90/params.h"

namespace mla::sm90::merge {

// One merge_states call (include/mla/merge.h). Strides in elements; the last dim of out_parts and
// out is contiguous.
struct MergeKernelParams {
  const void* out_parts;   // [N, T, H, L] bf16 / fp16
  const float* lse_parts;  // [N, T, H] fp32
  const void* sinks;       // [H] fp32 / bf16 / fp16, or null
  void* out;               // [T, H, L] bf16 / fp16
  float* lse;              // [T, H] fp32, or null

  int num_parts;     // N >= 1
  int num_heads;     // H
  int L;             // values per row
  int rows;          // T * H
  int vecs_per_row;  // ceil(L / values per vector) >= 1

  int64_t part_stride, part_token, part_head;              // out_parts
  int64_t lse_part_stride, lse_part_token, lse_part_head;  // lse_parts
  int64_t out_token, out_head;                             // out
  int64_t lse_token, lse_head;                             // lse
  int64_t sinks_stride;                                    // sinks
  int sinks_elem;                                          // 0 fp32, 1 bf16, 2 fp16
};

// Values per vector: 8 (16 bytes) where L, every row stride and both base addresses allow 16-byte
// accesses; 1 otherwise. Each thread takes several vectors of a row (merge_kernel.cuh).
inline constexpr int kMergeWideVec = 8;

// Launches the merge kernel of out type Out with `vec` values per vector (kMergeWideVec or 1).
template <Elem Out>
cudaError_t launch_merge(const MergeKernelParams& params, int vec, cudaStream_t stream, bool pdl);

}  // namespace mla::sm90::merge
