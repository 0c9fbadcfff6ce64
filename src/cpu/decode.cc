// cpu reference backend: MLA decode with fp32 accumulation (docs/contract.md sections 1-2).
//
// Work mapping: one task per query token (b, i) computes all H heads of that token, so each block
// of 64 keys is converted to fp32 once and shared by every head. Workers take tasks from an atomic
// counter; each row is computed by one thread in a fixed order, so results are bitwise identical
// run to run and independent of the worker count.
//
// Non-finite inputs (docs/contract.md section 1): a NaN or inf in a query row, in an attended key
// row or in a scale makes out and lse NaN for exactly the rows it touches (a query row: its own
// row; a key: every head of each token attending it; a scale: every row with keys). Rows without
// keys stay empty (out 0, lse -inf). Keys that are not attended are never read.

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cpu/numeric.h"
#include "host/backends.h"
#include "host/bad_index.h"
#include "host/check.h"

namespace mla::detail::cpu {
namespace {

constexpr int kBlockKeys = 64;       // keys per online-softmax block and skip-softmax decision
constexpr int64_t kMaxWorkers = 64;  // fixed, so the workspace size does not depend on the machine
constexpr size_t kScratchAlign = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// fp8_ds_mla row (docs/contract.md section 1): byte offsets of its three parts.
constexpr int kDsMlaLatent = 512;      // float8_e4m3 values, at byte 0
constexpr int kDsMlaGroup = 128;       // values per fp32 scale
constexpr int64_t kDsMlaScales = 512;  // 4 fp32 scales
constexpr int64_t kDsMlaRope = 528;    // 64 bf16 rope values
constexpr int kDsMlaRopeValues = 64;

// ---- element formats ----

enum class Format { kBf16, kFp16, kFp8E4M3, kFp32 };

Format format_of(DataType type, const char* what) {
  if (type == dtype::kBFloat16) return Format::kBf16;
  if (type == dtype::kFloat16) return Format::kFp16;
  if (type == dtype::kFloat8E4M3) return Format::kFp8E4M3;
  if (type == dtype::kFloat32) return Format::kFp32;
  throw Error(ErrorCode::kTypeError, std::string("cpu backend: unsupported ") + what + " dtype");
}

template <typename T>
T load(const uint8_t* base, int64_t index) {
  T value;
  std::memcpy(&value, base + index * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return value;
}

template <typename T>
void store(uint8_t* base, int64_t index, T value) {
  std::memcpy(base + index * static_cast<int64_t>(sizeof(T)), &value, sizeof(T));
}

// dst[0, n) = src[offset, offset + n) decoded to fp32.
void convert_row(const uint8_t* src, Format format, int64_t offset, int n, float* dst) {
  switch (format) {
    case Format::kBf16:
      for (int k = 0; k < n; ++k) dst[k] = bf16_to_float(load<uint16_t>(src, offset + k));
      break;
    case Format::kFp16:
      for (int k = 0; k < n; ++k) dst[k] = fp16_to_float(load<uint16_t>(src, offset + k));
      break;
    case Format::kFp8E4M3: {
      const std::array<float, 256>& table = fp8_e4m3_table();
      for (int k = 0; k < n; ++k) dst[k] = table[src[offset + k]];
      break;
    }
    case Format::kFp32:
      std::memcpy(dst, src + offset * 4, static_cast<size_t>(n) * sizeof(float));
      break;
  }
}

// dst[0, 576) = the key of one fp8_ds_mla row: 512 e4m3 values times their group's fp32 scale,
// then 64 bf16 rope values.
void convert_ds_mla_row(const uint8_t* row, float* dst) {
  const std::array<float, 256>& table = fp8_e4m3_table();
  for (int g = 0; g < kDsMlaLatent / kDsMlaGroup; ++g) {
    const float scale = load<float>(row + kDsMlaScales, g);
    for (int k = g * kDsMlaGroup; k < (g + 1) * kDsMlaGroup; ++k) dst[k] = table[row[k]] * scale;
  }
  for (int k = 0; k < kDsMlaRopeValues; ++k) {
    dst[kDsMlaLatent + k] = bf16_to_float(load<uint16_t>(row + kDsMlaRope, k));
  }
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    if (!std::isfinite(x[k])) return false;
  }
  return true;
}

// dst[offset, offset + n) = scale * src[0, n), rounded to nearest even.
void store_row(const float* src, float scale, int n, Format format, uint8_t* dst, int64_t offset) {
  if (format == Format::kBf16) {
    for (int k = 0; k < n; ++k) store<uint16_t>(dst, offset + k, float_to_bf16(src[k] * scale));
  } else {
    for (int k = 0; k < n; ++k) store<uint16_t>(dst, offset + k, float_to_fp16(src[k] * scale));
  }
}

// ---- the call, resolved to raw pointers ----

struct Inputs {
  const Problem* problem = nullptr;
  const uint8_t* query = nullptr;  // [B, q_len, H, D] / [T, H, D]
  Format query_format = Format::kFp32;
  const uint8_t* kv = nullptr;       // [P, page_size, D], or [P, page_size, 656] bytes (fp8_ds_mla)
  Format kv_format = Format::kFp32;  // plain rows only
  bool kv_ds_mla = false;            // KvFormat::kFp8DsMla
  const int32_t* block_tables = nullptr;    // [B, max_pages] or [B, 2, max_pages]; dense mode
  const int32_t* seq_lens = nullptr;        // [B]
  const int32_t* cum_seq_lens_q = nullptr;  // [B + 1]; ragged queries only
  const uint8_t* sinks = nullptr;           // [H] fp32, bf16 or fp16, optional
  Format sinks_format = Format::kFp32;
  int64_t sinks_stride = 0;
  const uint8_t* mask = nullptr;  // [B, q_len, W] / [T, W], optional (dense mode)
  int64_t mask_element_bytes = 4;
  const int32_t* sparse_indices = nullptr;  // [B, q_len, top_k] / [T, top_k]; sparse mode
  const int32_t* topk_lens = nullptr;       // [B] or [B, q_len] / [T], optional
  uint8_t* out = nullptr;                   // [B, q_len, H, L] / [T, H, L]
  Format out_format = Format::kBf16;
  float* lse = nullptr;  // [B, q_len, H] / [T, H], optional
  float bmm1_scale = 1.0f;
  float bmm2_scale = 1.0f;
  bool scales_finite = true;  // false: every row with keys is NaN

  float sink(int64_t h) const {
    float value;
    convert_row(sinks, sinks_format, h * sinks_stride, 1, &value);
    return value;
  }
};

Inputs resolve_inputs(const Problem& p, const DecodeParams& params) {
  Inputs in;
  in.problem = &p;
  in.query = static_cast<const uint8_t*>(params.query.data);
  in.query_format = format_of(p.q_dtype, "query");
  in.kv = static_cast<const uint8_t*>(params.kv_cache.data);
  in.kv_ds_mla = p.kv_format == KvFormat::kFp8DsMla;
  if (!in.kv_ds_mla) in.kv_format = format_of(p.kv_dtype, "kv_cache");
  if (!p.sparse) in.block_tables = static_cast<const int32_t*>(params.block_tables.data);
  if (params.seq_lens.defined()) in.seq_lens = static_cast<const int32_t*>(params.seq_lens.data);
  if (p.ragged) in.cum_seq_lens_q = static_cast<const int32_t*>(params.cum_seq_lens_q.data);
  if (p.has_sinks) {
    in.sinks = static_cast<const uint8_t*>(params.sinks.data);
    in.sinks_format = format_of(p.sinks_dtype, "sinks");
    in.sinks_stride = params.sinks.ndim >= 1 ? params.sinks.strides[0] : 1;
  }
  if (p.has_mask && !p.sparse) {
    in.mask = static_cast<const uint8_t*>(params.mask.data);
    in.mask_element_bytes = params.mask.dtype.bits / 8;
  }
  if (p.sparse) {
    in.sparse_indices = static_cast<const int32_t*>(params.sparse_indices.data);
    if (p.topk_lens_mode != TopkLensMode::kNone) {
      in.topk_lens = static_cast<const int32_t*>(params.sparse_topk_lens.data);
    }
  }
  in.out = static_cast<uint8_t*>(params.out.data);
  in.out_format = format_of(p.out_dtype, "out");
  if (p.has_lse) in.lse = static_cast<float*>(params.lse.data);
  in.bmm1_scale = p.has_bmm1_tensor ? *static_cast<const float*>(params.bmm1_scale_tensor.data)
                                    : params.bmm1_scale;
  in.bmm2_scale = p.has_bmm2_tensor ? *static_cast<const float*>(params.bmm2_scale_tensor.data)
                                    : params.bmm2_scale;
  in.scales_finite = std::isfinite(in.bmm1_scale) && std::isfinite(in.bmm2_scale);
  return in;
}

// One query token of one request.
struct Token {
  int64_t b = 0;        // request
  int64_t i = 0;        // token within the request
  int64_t t = 0;        // row index of per-token tensors: i (dense) or cum_seq_lens_q[b] + i
  int64_t n = 0;        // query tokens of the request
  int64_t seq_len = 0;  // seq_lens[b]
};

Token token_of(const Inputs& in, int64_t task) {
  const Problem& p = *in.problem;
  Token tok;
  if (p.ragged) {
    // The request whose query range [cum[b], cum[b + 1]) holds task (cum is non-decreasing).
    const int32_t* cum = in.cum_seq_lens_q;
    tok.b = (std::upper_bound(cum, cum + p.batch + 1, task) - cum) - 1;
    tok.i = task - cum[tok.b];
    tok.t = task;
    tok.n = cum[tok.b + 1] - cum[tok.b];
  } else {
    tok.b = task / p.q_len;
    tok.i = task % p.q_len;
    tok.t = tok.i;
    tok.n = p.q_len;
  }
  tok.seq_len = in.seq_lens ? in.seq_lens[tok.b] : 0;
  return tok;
}

int64_t row_offset(const RowStrides& s, const Token& tok) {
  return tok.b * s.batch + tok.t * s.token;
}

int64_t topk_len_offset(const Problem& p, const Token& tok) {
  return p.topk_lens_mode == TopkLensMode::kPerRequest ? tok.b * p.topk_lens.batch
                                                       : row_offset(p.topk_lens, tok);
}

// ---- the attended key set ----

// Sparse mode: the entries of the token's index list that count,
// min(top_k, topk_len, seq_len - n + i + 1), none when that is not positive (docs/contract.md
// section 2).
int64_t counted_entries(const Inputs& in, const Token& tok) {
  const Problem& p = *in.problem;
  int64_t count = p.top_k;
  if (in.topk_lens) count = std::min<int64_t>(count, in.topk_lens[topk_len_offset(p, tok)]);
  count = std::min(count, tok.seq_len - tok.n + tok.i + 1);  // causal: the keys visible to i
  return std::max<int64_t>(0, count);
}

// Keys are visited in blocks of 64: key positions [64k, 64k + 64) in dense mode, entries
// [64k, 64k + 64) of the index list in sparse mode. `extent` is the end of that range.
int64_t attended_extent(const Inputs& in, const Token& tok) {
  const Problem& p = *in.problem;
  if (p.sparse) return counted_entries(in, tok);
  if (in.mask) return tok.seq_len;
  const int64_t position = tok.seq_len - tok.n + tok.i;  // causal: keys 0 .. position
  return std::max<int64_t>(0, position + 1);
}

bool mask_bit(const uint8_t* row, int64_t bit) { return (row[bit >> 3] >> (bit & 7)) & 1; }

// Writes the element offsets (bytes for fp8_ds_mla) of the cache rows of the attended keys of one
// block into `rows`, in visiting order; returns their count. Separate K/V page tables: row 0
// names the pages (the index check made sure row 1 names the same).
int gather_block(const Inputs& in, const Token& tok, int64_t block, int64_t extent, int64_t* rows) {
  const Problem& p = *in.problem;
  const int64_t begin = block * kBlockKeys;
  const int64_t end = std::min(extent, begin + kBlockKeys);
  int n = 0;
  if (p.sparse) {
    const int32_t* entries = in.sparse_indices + row_offset(p.sparse_indices, tok);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t slot = entries[k];
      if (slot < 0) continue;  // -1: no key
      rows[n++] = (slot / p.page_size) * p.kv_page_stride + (slot % p.page_size) * p.kv_row_stride;
    }
    return n;
  }
  if (begin >= end) return n;  // no key: no row pointer formed (block_tables may be empty)
  const int32_t* pages = in.block_tables + tok.b * p.block_table_stride;
  const uint8_t* mask_row =
      in.mask ? in.mask + row_offset(p.mask, tok) * in.mask_element_bytes : nullptr;
  const int64_t first_query_position = tok.seq_len - tok.n;
  for (int64_t j = begin; j < end; ++j) {
    if (mask_row && j >= first_query_position && !mask_bit(mask_row, j - first_query_position)) {
      continue;
    }
    rows[n++] = pages[j / p.page_size] * p.kv_page_stride + (j % p.page_size) * p.kv_row_stride;
  }
  return n;
}

// ---- per-worker scratch ----

size_t align_up(size_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

struct ScratchLayout {
  size_t query = 0, keys = 0, scores = 0, row_max = 0, row_sum = 0, acc = 0;  // byte offsets
  size_t query_nonfinite = 0;
  size_t bytes = 0;  // one worker's slice, a multiple of kScratchAlign
};

ScratchLayout scratch_layout(const Problem& p) {
  const size_t H = static_cast<size_t>(p.num_heads);
  const size_t D = static_cast<size_t>(p.D);
  const size_t L = static_cast<size_t>(p.L);
  ScratchLayout s;
  size_t offset = 0;
  auto take = [&offset](size_t floats) {
    const size_t at = offset;
    offset = align_up(offset + floats * sizeof(float));
    return at;
  };
  s.query = take(H * D);
  s.keys = take(kBlockKeys * D);
  s.scores = take(H * kBlockKeys);
  s.row_max = take(H);
  s.row_sum = take(H);
  s.acc = take(H * L);
  s.query_nonfinite = take((H + sizeof(float) - 1) / sizeof(float));  // H bytes
  s.bytes = offset;
  return s;
}

struct Scratch {
  float* query;              // [H, D] the token's query rows
  float* keys;               // [64, D] attended keys of one block, compacted
  float* scores;             // [H, 64] bmm1_scale * q . k
  float* row_max;            // [H] running max of the scores, sink excluded
  float* row_sum;            // [H] running sum of exp(score - row_max)
  float* acc;                // [H, L] running sum of exp(score - row_max) * v
  uint8_t* query_nonfinite;  // [H] the head's query row holds a NaN or inf: its row is NaN
};

Scratch scratch_for(uint8_t* base, const ScratchLayout& layout, int64_t worker) {
  uint8_t* slice = base + static_cast<size_t>(worker) * layout.bytes;
  auto at = [slice](size_t offset) { return reinterpret_cast<float*>(slice + offset); };
  return {at(layout.query),
          at(layout.keys),
          at(layout.scores),
          at(layout.row_max),
          at(layout.row_sum),
          at(layout.acc),
          slice + layout.query_nonfinite};
}

int64_t workspace_workers(const Problem& p) { return std::min(kMaxWorkers, p.num_tokens); }

// ---- the math ----

// fp32 dot product with eight fixed partial sums (a fixed order, vectorizable).
float dot(const float* a, const float* b, int n) {
  float lanes[8] = {};
  int d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int u = 0; u < 8; ++u) lanes[u] += a[d + u] * b[d + u];
  }
  for (; d < n; ++d) lanes[d & 7] += a[d] * b[d];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// Converts the token's query rows and marks the heads whose row is not all finite.
void load_query_rows(const Inputs& in, const Token& tok, float* query, uint8_t* nonfinite) {
  const Problem& p = *in.problem;
  const int64_t base = row_offset(p.q, tok);
  for (int64_t h = 0; h < p.num_heads; ++h) {
    float* row = query + h * p.D;
    convert_row(in.query, in.query_format, base + h * p.q.head, p.D, row);
    nonfinite[h] = !all_finite(row, p.D);
  }
}

// Converts the block's key rows; false when one of them holds a NaN or inf.
bool load_key_block(const Inputs& in, const int64_t* rows, int n, float* keys) {
  const int D = in.problem->D;
  for (int j = 0; j < n; ++j) {
    if (in.kv_ds_mla) {
      convert_ds_mla_row(in.kv + rows[j], keys + j * D);
    } else {
      convert_row(in.kv, in.kv_format, rows[j], D, keys + j * D);
    }
  }
  return all_finite(keys, static_cast<int64_t>(n) * D);
}

// scores[h][j] = bmm1_scale * dot(q_h, k_j), for the heads with a finite query row.
void score_block(const float* query, const float* keys, int n, int64_t num_heads, int D,
                 float bmm1_scale, const uint8_t* skip_head, float* scores) {
  for (int64_t h = 0; h < num_heads; ++h) {
    if (skip_head[h]) continue;
    for (int j = 0; j < n; ++j) {
      scores[h * kBlockKeys + j] = bmm1_scale * dot(query + h * D, keys + j * D, D);
    }
  }
}

float block_max(const float* scores, int n) {
  float m = kNegInf;
  for (int j = 0; j < n; ++j) m = std::max(m, scores[j]);
  return m;
}

// Skip-softmax: the block is dropped when exp(block_max - running_max) < threshold for every head
// (heads whose row is NaN anyway need no block). A row's first non-empty block gives exp(+inf)
// and is never dropped.
bool block_negligible(const float* scores, int n, const float* row_max, int64_t num_heads,
                      const uint8_t* skip_head, float threshold) {
  for (int64_t h = 0; h < num_heads; ++h) {
    if (skip_head[h]) continue;
    const float ratio = std::exp(block_max(scores + h * kBlockKeys, n) - row_max[h]);
    if (!(ratio < threshold)) return false;
  }
  return true;
}

// Folds one block into each head's running max, sum and accumulator (scores are finite here).
void online_softmax_update(const float* scores, const float* keys, int n, const Problem& p,
                           const uint8_t* skip_head, float* row_max, float* row_sum, float* acc) {
  const int D = p.D;
  const int L = p.L;
  for (int64_t h = 0; h < p.num_heads; ++h) {
    if (skip_head[h]) continue;
    const float* s = scores + h * kBlockKeys;
    const float m_new = std::max(row_max[h], block_max(s, n));
    if (m_new == kNegInf) continue;  // every score so far is -inf: nothing contributes
    float* acc_h = acc + h * L;
    const float rescale = std::exp(row_max[h] - m_new);  // 0 for the first block
    if (rescale != 1.0f) {
      row_sum[h] *= rescale;
      for (int l = 0; l < L; ++l) acc_h[l] *= rescale;
    }
    float sum = row_sum[h];
    for (int j = 0; j < n; ++j) {
      const float weight = std::exp(s[j] - m_new);
      sum += weight;
      const float* v = keys + j * D;
      for (int l = 0; l < L; ++l) acc_h[l] += weight * v[l];
    }
    row_sum[h] = sum;
    row_max[h] = m_new;
  }
}

// What a token's rows come to: no attended key (out 0, lse -inf), NaN (a non-finite input touches
// every row), or each head's softmax.
enum class TokenRows { kEmpty, kNaN, kSoftmax };

// out = bmm2_scale * acc / (Z' + exp(sink - m')), lse = m' + log(Z'); a head whose query row is
// not finite gets NaN.
void finalize_rows(const Inputs& in, const Token& tok, TokenRows rows, const Scratch& s) {
  const Problem& p = *in.problem;
  const int64_t out_base = row_offset(p.out, tok);
  const int64_t lse_base = in.lse ? row_offset(p.lse, tok) : 0;
  for (int64_t h = 0; h < p.num_heads; ++h) {
    float* acc_h = s.acc + h * p.L;
    float out_scale = 1.0f, lse = kNaN;
    if (rows == TokenRows::kEmpty) {
      std::fill(acc_h, acc_h + p.L, 0.0f);
      lse = kNegInf;
    } else if (rows == TokenRows::kNaN || s.query_nonfinite[h]) {
      std::fill(acc_h, acc_h + p.L, kNaN);
    } else {
      const float m = s.row_max[h];
      const float z = s.row_sum[h];
      float denom = z;
      if (in.sinks) denom += std::exp(in.sink(h) - m);  // inf: out = 0
      out_scale = in.bmm2_scale / denom;
      lse = m + std::log(z);
    }
    store_row(acc_h, out_scale, p.L, in.out_format, in.out, out_base + h * p.out.head);
    if (in.lse) in.lse[lse_base + h * p.lse.head] = lse;
  }
}

void decode_token(const Inputs& in, int64_t task, const Scratch& s) {
  const Problem& p = *in.problem;
  const Token tok = token_of(in, task);
  const int64_t H = p.num_heads;
  load_query_rows(in, tok, s.query, s.query_nonfinite);
  std::fill(s.row_max, s.row_max + H, kNegInf);
  std::fill(s.row_sum, s.row_sum + H, 0.0f);
  std::fill(s.acc, s.acc + H * p.L, 0.0f);

  const int64_t extent = attended_extent(in, tok);
  // Threshold f / seq_len; in sparse mode the token's key list (its counted entries) plays the
  // role of the sequence. An empty sequence has nothing to skip.
  const int64_t skip_len = p.sparse ? extent : tok.seq_len;
  const bool skip_softmax = p.skip_softmax_factor > 0.0f && skip_len > 0;
  const float skip_threshold =
      skip_softmax ? p.skip_softmax_factor / static_cast<float>(skip_len) : 0.0f;

  // A non-finite scale or key makes every row NaN once the token has a key; the blocks after
  // that need no math.
  TokenRows rows_kind = TokenRows::kEmpty;
  int64_t rows[kBlockKeys];
  for (int64_t block = 0; block * kBlockKeys < extent; ++block) {
    const int n = gather_block(in, tok, block, extent, rows);
    if (n == 0) continue;
    rows_kind = TokenRows::kSoftmax;
    if (!in.scales_finite || !load_key_block(in, rows, n, s.keys)) {
      rows_kind = TokenRows::kNaN;
      break;
    }
    score_block(s.query, s.keys, n, H, p.D, in.bmm1_scale, s.query_nonfinite, s.scores);
    if (skip_softmax &&
        block_negligible(s.scores, n, s.row_max, H, s.query_nonfinite, skip_threshold)) {
      continue;
    }
    online_softmax_update(s.scores, s.keys, n, p, s.query_nonfinite, s.row_max, s.row_sum, s.acc);
  }
  finalize_rows(in, tok, rows_kind, s);
}

// ---- index checks ----
// The checks and their order are the sm90 checked mode's (src/sm90/check/); the messages are
// shared with it (host/bad_index.h).

void check_seq_lens(const Problem& p, const int32_t* seq_lens) {
  const int64_t capacity = p.max_pages * p.page_size;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = seq_lens[b];
    if (len < 0 || len > p.max_seq_len || (!p.sparse && len > capacity)) {
      bad_index::fail(bad_index::seq_len(p, b, len));
    }
  }
}

void check_cum_seq_lens_q(const Problem& p, const int32_t* cum) {
  if (cum[0] != 0) bad_index::fail(bad_index::cum_seq_lens_q_first(cum[0]));
  const bool dense_mask = p.has_mask && !p.sparse;
  const int64_t mask_bits = p.mask_words * 32;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n = static_cast<int64_t>(cum[b + 1]) - cum[b];
    if (n < 0 || n > p.max_q_len || (dense_mask && n > mask_bits)) {
      bad_index::fail(bad_index::cum_seq_lens_q_request(p, b, cum[b], cum[b + 1]));
    }
  }
  if (cum[p.batch] != p.num_tokens) {
    bad_index::fail(bad_index::cum_seq_lens_q_last(p, cum[p.batch]));
  }
}

// Only the pages each request needs are read, so only those entries are checked: first every
// request's row 0, then, for separate K/V page tables, row 1 against row 0 (MLA reads K and V
// from one row, so row 1 must name the same pages).
void check_block_tables(const Problem& p, const int32_t* block_tables, const int32_t* seq_lens) {
  auto pages_needed = [&](int64_t b) {
    return (static_cast<int64_t>(seq_lens[b]) + p.page_size - 1) / p.page_size;
  };
  // NOTE: a request without a needed page forms no row pointer (block_tables may be empty).
  for (int64_t b = 0; b < p.batch; ++b) {
    if (pages_needed(b) <= 0) continue;
    const int32_t* k_row = block_tables + b * p.block_table_stride;
    for (int64_t k = 0; k < pages_needed(b); ++k) {
      if (k_row[k] < 0 || k_row[k] >= p.num_pages) {
        bad_index::fail(bad_index::page(p, b, k, k_row[k]));
      }
    }
  }
  if (!p.kv_page_tables) return;
  for (int64_t b = 0; b < p.batch; ++b) {
    if (pages_needed(b) <= 0) continue;
    const int32_t* k_row = block_tables + b * p.block_table_stride;
    const int32_t* v_row = k_row + p.block_table_kv_stride;
    for (int64_t k = 0; k < pages_needed(b); ++k) {
      if (v_row[k] != k_row[k]) bad_index::fail(bad_index::kv_page(b, k, k_row[k], v_row[k]));
    }
  }
}

// Only the entries each token counts are read (counted_entries), so only those are checked.
void check_sparse(const Problem& p, const Inputs& in) {
  if (in.topk_lens) {
    if (p.topk_lens_mode == TopkLensMode::kPerRequest) {
      for (int64_t b = 0; b < p.batch; ++b) {
        const int64_t len = in.topk_lens[b * p.topk_lens.batch];
        if (len < 0 || len > p.top_k) bad_index::fail(bad_index::topk_len(p, b, len));
      }
    } else {
      for (int64_t task = 0; task < p.num_tokens; ++task) {
        const int64_t len = in.topk_lens[row_offset(p.topk_lens, token_of(in, task))];
        if (len < 0 || len > p.top_k) bad_index::fail(bad_index::topk_len(p, task, len));
      }
    }
  }
  const int64_t num_slots = p.num_pages * p.page_size;
  for (int64_t task = 0; task < p.num_tokens; ++task) {
    const Token tok = token_of(in, task);
    const int64_t count = counted_entries(in, tok);
    const int32_t* entries = in.sparse_indices + row_offset(p.sparse_indices, tok);
    for (int64_t k = 0; k < count; ++k) {
      if (entries[k] < -1 || entries[k] >= num_slots) {
        bad_index::fail(bad_index::sparse_index(p, task, k, entries[k]));
      }
    }
  }
}

}  // namespace

size_t workspace_size(const Problem& problem) {
  if (problem.batch == 0 || problem.num_tokens == 0) return 0;
  // NOTE: validation bounds T x H and D by int32, not H x D: a view of H and D near 2^31 (stride-0
  // heads) would wrap the scratch size. One worker's slice is bounded first, in floats.
  const double floats = static_cast<double>(problem.num_heads) * (problem.D + problem.L + 72) +
                        static_cast<double>(kBlockKeys) * problem.D;
  constexpr double kMaxSliceFloats = static_cast<double>(int64_t{1} << 40);
  MLA_CHECK_ARG(floats <= kMaxSliceFloats, ErrorCode::kInvalidArgument,
                "query: the cpu backend's scratch for " << problem.num_heads << " heads of D "
                                                        << problem.D << " exceeds 2^40 floats");
  // Slack for aligning the base pointer, then one slice per worker.
  return kScratchAlign +
         static_cast<size_t>(workspace_workers(problem)) * scratch_layout(problem).bytes;
}

void check_indices(const Problem& problem, const DecodeParams& params) {
  const Inputs in = resolve_inputs(problem, params);
  if (in.seq_lens) check_seq_lens(problem, in.seq_lens);
  if (problem.ragged) check_cum_seq_lens_q(problem, in.cum_seq_lens_q);
  if (problem.sparse) {
    check_sparse(problem, in);
  } else {
    check_block_tables(problem, in.block_tables, in.seq_lens);
  }
}

void run(const Problem& problem, const DecodeParams& params) {
  check_indices(problem, params);
  if (problem.batch == 0 || problem.num_tokens == 0) return;
  const Inputs in = resolve_inputs(problem, params);

  const ScratchLayout layout = scratch_layout(problem);
  const uintptr_t raw = reinterpret_cast<uintptr_t>(params.workspace.data);
  uint8_t* base = static_cast<uint8_t*>(params.workspace.data) +
                  (align_up(raw) - raw);  // first 64-byte boundary

  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t num_workers = std::min({hardware, workspace_workers(problem), problem.num_tokens});

  std::atomic<int64_t> next_task{0};
  auto work = [&](int64_t worker) {
    const Scratch scratch = scratch_for(base, layout, worker);
    for (int64_t task = next_task.fetch_add(1); task < problem.num_tokens;
         task = next_task.fetch_add(1)) {
      decode_token(in, task, scratch);
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(num_workers - 1));
  for (int64_t w = 1; w < num_workers; ++w) {
    try {
      threads.emplace_back(work, w);
    } catch (const std::system_error&) {
      break;  // fewer threads; the result does not depend on their number
    }
  }
  work(0);
  for (std::thread& thread : threads) thread.join();
}

}  // namespace mla::detail::cpu
