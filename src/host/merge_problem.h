// The validated description of one merge_states call (include/mla/merge.h) that every backend
// consumes.
#pragma once

#include <cstdint>

#include "mla/merge.h"

namespace mla::detail {

struct MergeProblem {
  Backend backend = Backend::kCpu;  // resolved, never kAuto
  Device device{};
  DataType out_dtype{};  // bf16 or fp16: out_parts' and out's

  // Sizes.
  int64_t num_parts = 0;   // N
  int64_t num_tokens = 0;  // T
  int64_t num_heads = 0;   // H
  int64_t L = 0;           // value width

  // Element strides (the last dim of out_parts and out is contiguous).
  int64_t part_stride = 0, part_token = 0, part_head = 0;              // out_parts [N, T, H, L]
  int64_t lse_part_stride = 0, lse_part_token = 0, lse_part_head = 0;  // lse_parts [N, T, H]
  int64_t out_token = 0, out_head = 0;                                 // out [T, H, L]
  int64_t lse_token = 0, lse_head = 0;                                 // lse [T, H]
  int64_t sinks_stride = 0;                                            // sinks [H]

  bool has_lse = false;
  bool has_sinks = false;
  DataType sinks_dtype{};  // fp32, bf16 or fp16
};

}  // namespace mla::detail
