// The validated, derived description of one decode call that every backend consumes.
#pragma once

#include <cstdint>

#include "mla/decode.h"

namespace mla::detail {

// Element strides of a per-token tensor. The element of request b, query token i, head h sits at
//   b * batch + t * token + h * head,  with t = i (dense) or t = cum_seq_lens_q[b] + i (ragged).
// For ragged tensors batch is 0.
struct RowStrides {
  int64_t batch = 0;
  int64_t token = 0;
  int64_t head = 0;
};

enum class TopkLensMode { kNone, kPerRequest, kPerToken };

// How a kv_cache row is stored. kPlain: D values of kv_dtype. kFp8DsMla: DeepSeek-V3.2's 656-byte
// row (uint8 pool): 512 e4m3 values, 4 fp32 scales (one per 128 values, multiplied in), 64 bf16
// rope values; D is then 576 (L 512, R 64).
enum class KvFormat { kPlain, kFp8DsMla };
inline constexpr int64_t kDsMlaRowBytes = 656;

struct Problem {
  Backend backend = Backend::kCpu;  // resolved, never kAuto
  Device device{};                  // the query's (every tensor's) device
  DataType q_dtype{};
  DataType kv_dtype{};  // uint8 with KvFormat::kFp8DsMla
  KvFormat kv_format = KvFormat::kPlain;
  DataType out_dtype{};

  // Sizes.
  int64_t batch = 0;       // B
  bool ragged = false;     // cum_seq_lens_q given
  int64_t q_len = 0;       // dense query length; 0 when ragged
  int64_t num_tokens = 0;  // B * q_len, or T
  int64_t max_q_len = 0;   // q_len (dense), the host hint (ragged), or T when no hint
  int64_t num_heads = 0;   // H
  int32_t L = 0;           // kv_lora_rank (value width)
  int32_t R = 0;           // qk_rope_head_dim
  int32_t D = 0;           // L + R (key width)
  int64_t num_pages = 0;   // P
  int64_t page_size = 0;
  int64_t max_pages = 0;    // block_tables.shape[1]; 0 without block_tables (sparse mode)
  int64_t max_seq_len = 0;  // resolved upper bound of seq_lens
  bool sparse = false;
  int64_t top_k = 0;

  // Element strides.
  RowStrides q, out, lse, mask, sparse_indices, topk_lens;
  int64_t kv_page_stride = 0;      // between physical pages
  int64_t kv_row_stride = 0;       // between tokens of one page
  int64_t block_table_stride = 0;  // between requests
  // [B, 2, max_pages] block tables (separate K and V page tables; MLA reads row 0, the checked
  // mode verifies that row 1 equals it): the element stride from row 0 to row 1; 0 for [B,
  // max_pages].
  int64_t block_table_kv_stride = 0;
  bool kv_page_tables = false;  // block_tables is [B, 2, max_pages]
  int64_t mask_words = 0;       // uint32 words per mask row (uint16 masks: half their count)
  TopkLensMode topk_lens_mode = TopkLensMode::kNone;

  // Optional pieces.
  bool has_lse = false;
  bool has_sinks = false;
  DataType sinks_dtype{};  // fp32, bf16 or fp16
  bool has_mask = false;
  bool has_bmm1_tensor = false;
  bool has_bmm2_tensor = false;
  float skip_softmax_factor = 0.0f;  // 0: off
};

}  // namespace mla::detail
