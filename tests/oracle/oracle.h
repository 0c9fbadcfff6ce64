// A float64 reference of MLA decode, written from docs/contract.md alone. It shares no code with
// the library: inputs arrive already decoded to double in plain vectors, and the element decoders
// below are independent of the library's.
#pragma once

#include <cstdint>
#include <vector>

namespace oracle {

// How sparse_topk_lens is given (docs/contract.md section 2, sparse mode).
enum class TopkLens { kNone, kPerRequest, kPerToken };

// One decode call. Query tokens are numbered globally: the n_b tokens of request b are tokens
// first_token(b) .. first_token(b) + n_b - 1 (for a dense [B, q_len] query, t = b * q_len + i).
struct Input {
  int batch = 0;              // B
  int num_heads = 0;          // H
  int kv_lora_rank = 0;       // L (value width)
  int rope_dim = 0;           // R; a key row has D = L + R values
  std::vector<int> q_lens;    // [B] n_b, query tokens of each request
  std::vector<double> query;  // [T, H, D]

  int page_size = 0;
  int num_pages = 0;       // P
  std::vector<double> kv;  // [P * page_size, D]; row `slot` = page * page_size + offset

  int max_pages = 0;                  // dense mode
  std::vector<int32_t> block_tables;  // [B, max_pages] (row 0 of separate K/V page tables)
  std::vector<int32_t> seq_lens;      // [B]; sparse mode: the causal bound of each token's list

  bool has_mask = false;
  int mask_words = 0;          // W, uint32 words per row
  std::vector<uint32_t> mask;  // [T, W], little-endian packed bits

  bool has_sinks = false;
  std::vector<double> sinks;  // [H], natural-log logits, not scaled

  bool sparse = false;
  int top_k = 0;
  std::vector<int32_t> sparse_indices;  // [T, top_k] flat slots, -1: no key
  TopkLens topk_lens_mode = TopkLens::kNone;
  std::vector<int32_t> topk_lens;  // [B] (kPerRequest) or [T] (kPerToken)

  double bmm1_scale = 1.0;
  double bmm2_scale = 1.0;
  // Skip-softmax is an approximation of the exact result; the oracle always computes the exact one
  // (which f = 1e-30 must reproduce), so this field is informational.
  double skip_softmax_factor = 0.0;

  int head_dim() const { return kv_lora_rank + rope_dim; }
  int num_tokens() const;        // T = sum of q_lens
  int first_token(int b) const;  // sum of q_lens[0 .. b)
};

struct Output {
  std::vector<double> out;  // [T, H, L]
  std::vector<double> lse;  // [T, H]; -inf for an empty attended set
  // A row whose query row, attended keys or scales hold a NaN or inf has NaN in out, lse and
  // out_abs (docs/contract.md section 1); an empty row stays out 0, lse -inf.
  // [T, H, L] |bmm2_scale| * sum_j p_j |v_jl| / Z (Z with the sink, as for out): the size of the
  // terms that out sums, an error scale for kernels that round each p_j (0 for an empty set).
  std::vector<double> out_abs;
  // [T, H] |bmm2_scale| * max_l sum_j min(e_j, 2^-25) |v_jl| / Z over the keys whose e_j =
  // exp(s_j - m) is below 2^-14 (m the row's largest score or sink): how far rounding each e_j to
  // fp16 can move out beyond the 2^-11 relative that out_abs carries, fp16 being subnormal there
  // (spacing 2^-24; a kernel's P is relative to a running max at most m, so its rounding moves
  // e_j by at most min(e_j, 2^-25)). 0 where no key is that small; NaN for a NaN row.
  std::vector<double> fp16_p_abs;
};

// The attended key set of query token i of request b as KV pool rows (duplicates kept, in order).
// Throws std::out_of_range when the set would reach outside the pool (a bug in the test).
std::vector<int64_t> attended_slots(const Input& in, int b, int i);

// docs/contract.md section 1 over the sets of section 2, in double, with a two-pass softmax.
Output reference(const Input& in);

// The merge of partial states (docs/contract.md section 7). Part r holds (out_r, lse_r) over a
// disjoint key set of each (token, head) row.
struct MergeInput {
  int parts = 0;                  // N
  int tokens = 0;                 // T
  int heads = 0;                  // H
  int width = 0;                  // L
  std::vector<double> out_parts;  // [N, T, H, L]
  std::vector<double> lse_parts;  // [N, T, H]; -inf: the part saw no key
  bool has_sinks = false;
  std::vector<double> sinks;  // [H]
};

struct MergeOutput {
  std::vector<double> out;  // [T, H, L]
  std::vector<double> lse;  // [T, H]
  // [T, H, L] sum_r exp(lse_r - lse) |out_r| (times the sink factor): the size of the terms out
  // sums, an error scale for its fp32 arithmetic.
  std::vector<double> out_abs;
};

// lse = log(sum_r exp(lse_r)), out = sum_r exp(lse_r - lse) out_r, then with sinks out times
// 1 / (1 + exp(sink_h - lse)). A part with lse_r = -inf takes no part; all parts -inf: out 0, lse
// -inf; a NaN or +inf lse_r: the row is NaN.
MergeOutput merge_reference(const MergeInput& in);

// The fp8_ds_mla cache row of one token (docs/contract.md section 1; DeepSeek-V3.2's layout): 656
// bytes = 512 float8_e4m3fn values, 4 little-endian fp32 scales (scale g multiplies values [128g,
// 128g + 128)), 64 little-endian bf16 rope values.
inline constexpr int kFp8DsMlaRowBytes = 656;
inline constexpr int kFp8DsMlaValues = 576;  // the key: 512 dequantized values, then 64 rope values

// The 576 key values of one fp8_ds_mla row, into `key`.
void fp8_ds_mla_to_double(const uint8_t* row, double* key);

// Bit patterns to values.
double bf16_to_double(uint16_t bits);
double fp16_to_double(uint16_t bits);
double fp8_e4m3fn_to_double(uint8_t bits);  // no infinities; S.1111.111 is NaN
double fp32_to_double(uint32_t bits);

}  // namespace oracle
