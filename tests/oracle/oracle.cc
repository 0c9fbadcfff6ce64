// float64 reference of MLA decode: docs/contract.md sections 1 and 2, evaluated literally.
#include "oracle/oracle.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace oracle {
namespace {

// A binary floating-point format with an implicit leading one for normal numbers.
double decode_ieee_like(uint32_t bits, int exp_bits, int man_bits) {
  const uint32_t man = bits & ((1u << man_bits) - 1);
  const uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const bool negative = (bits >> (man_bits + exp_bits)) & 1u;
  const int bias = (1 << (exp_bits - 1)) - 1;
  double magnitude;
  if (exp == 0) {
    magnitude = std::ldexp(static_cast<double>(man), 1 - bias - man_bits);  // subnormal
  } else {
    magnitude = std::ldexp(static_cast<double>(man + (1u << man_bits)), int(exp) - bias - man_bits);
  }
  return negative ? -magnitude : magnitude;
}

bool mask_bit(const Input& in, int t, int k) {
  if (k / 32 >= in.mask_words) return false;
  const uint32_t word = in.mask.at(static_cast<size_t>(t) * in.mask_words + k / 32);
  return (word >> (k % 32)) & 1u;
}

int64_t dense_slot(const Input& in, int b, int64_t j) {
  const int64_t logical_page = j / in.page_size;
  if (logical_page >= in.max_pages) throw std::out_of_range("oracle: key past block_tables row");
  const int32_t page = in.block_tables.at(static_cast<size_t>(b) * in.max_pages + logical_page);
  if (page < 0 || page >= in.num_pages) throw std::out_of_range("oracle: bad block_tables entry");
  return static_cast<int64_t>(page) * in.page_size + j % in.page_size;
}

}  // namespace

int Input::num_tokens() const {
  int t = 0;
  for (int n : q_lens) t += n;
  return t;
}

int Input::first_token(int b) const {
  int t = 0;
  for (int r = 0; r < b; ++r) t += q_lens.at(r);
  return t;
}

std::vector<int64_t> attended_slots(const Input& in, int b, int i) {
  std::vector<int64_t> slots;
  const int t = in.first_token(b) + i;
  const int64_t pool_rows = static_cast<int64_t>(in.num_pages) * in.page_size;

  if (in.sparse) {
    // The first min(top_k, topk_len, seq_len - n_b + i + 1) listed entries (the last term: the
    // keys visible to token i); -1 means no key.
    int64_t len = in.top_k;
    if (in.topk_lens_mode == TopkLens::kPerRequest)
      len = std::min<int64_t>(len, in.topk_lens.at(b));
    if (in.topk_lens_mode == TopkLens::kPerToken) len = std::min<int64_t>(len, in.topk_lens.at(t));
    len = std::min<int64_t>(len, int64_t{in.seq_lens.at(b)} - in.q_lens.at(b) + i + 1);
    for (int64_t e = 0; e < len; ++e) {
      const int32_t slot = in.sparse_indices.at(static_cast<size_t>(t) * in.top_k + e);
      if (slot == -1) continue;
      if (slot < 0 || slot >= pool_rows) throw std::out_of_range("oracle: bad sparse index");
      slots.push_back(slot);
    }
    return slots;
  }

  const int64_t seq_len = in.seq_lens.at(b);
  const int64_t n = in.q_lens.at(b);
  const int64_t first_query_pos = seq_len - n;  // p_0; may be negative
  for (int64_t j = 0; j < seq_len; ++j) {
    bool attended;
    if (in.has_mask) {
      attended = j < first_query_pos || mask_bit(in, t, static_cast<int>(j - first_query_pos));
    } else {
      attended = j <= first_query_pos + i;  // causal: keys 0 .. p_i
    }
    if (attended) slots.push_back(dense_slot(in, b, j));
  }
  return slots;
}

Output reference(const Input& in) {
  const int T = in.num_tokens();
  const int H = in.num_heads;
  const int L = in.kv_lora_rank;
  const int D = in.head_dim();
  Output result;
  result.out.assign(static_cast<size_t>(T) * H * L, 0.0);
  result.lse.assign(static_cast<size_t>(T) * H, -std::numeric_limits<double>::infinity());
  result.out_abs.assign(static_cast<size_t>(T) * H * L, 0.0);
  result.fp16_p_abs.assign(static_cast<size_t>(T) * H, 0.0);

  // Query tokens in order: (request, token within it).
  std::vector<std::pair<int, int>> tokens;
  for (int b = 0; b < in.batch; ++b) {
    for (int i = 0; i < in.q_lens.at(b); ++i) tokens.emplace_back(b, i);
  }

  auto finite = [](const double* x, int n) {
    for (int d = 0; d < n; ++d) {
      if (!std::isfinite(x[d])) return false;
    }
    return true;
  };
  const bool scales_finite = std::isfinite(in.bmm1_scale) && std::isfinite(in.bmm2_scale);

  // One query row (token t, head h) over its attended slots.
  auto row = [&](int t, int h, const std::vector<int64_t>& slots, std::vector<double>& s) {
    const double* q = &in.query.at((static_cast<size_t>(t) * H + h) * D);
    double* out = &result.out[(static_cast<size_t>(t) * H + h) * L];
    double* out_abs = &result.out_abs[(static_cast<size_t>(t) * H + h) * L];
    if (slots.empty()) return;  // out = 0, lse = -inf

    // A NaN or inf in the query row, an attended key or a scale: out and lse NaN.
    bool inputs_finite = scales_finite && finite(q, D);
    for (size_t a = 0; a < slots.size() && inputs_finite; ++a) {
      inputs_finite = finite(&in.kv.at(static_cast<size_t>(slots[a]) * D), D);
    }
    if (!inputs_finite) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      std::fill(out, out + L, nan);
      std::fill(out_abs, out_abs + L, nan);
      result.lse[static_cast<size_t>(t) * H + h] = nan;
      result.fp16_p_abs[static_cast<size_t>(t) * H + h] = nan;
      return;
    }

    // Pass 1: scores and their maximum.
    s.assign(slots.size(), 0.0);
    double s_max = -std::numeric_limits<double>::infinity();
    for (size_t a = 0; a < slots.size(); ++a) {
      const double* k = &in.kv.at(static_cast<size_t>(slots[a]) * D);
      double dot = 0.0;
      for (int d = 0; d < D; ++d) dot += q[d] * k[d];
      s[a] = in.bmm1_scale * dot;
      s_max = std::max(s_max, s[a]);
    }

    // lse over the keys alone (the sink is not part of it).
    double sum_keys = 0.0;
    for (double v : s) sum_keys += std::exp(v - s_max);
    result.lse[static_cast<size_t>(t) * H + h] = s_max + std::log(sum_keys);

    // Pass 2: probabilities against m (which includes the sink), and the weighted values.
    const double m = in.has_sinks ? std::max(s_max, in.sinks.at(h)) : s_max;
    double z = in.has_sinks ? std::exp(in.sinks.at(h) - m) : 0.0;
    for (double v : s) z += std::exp(v - m);
    std::vector<double> tiny;  // sum_j min(e_j, 2^-25) |v_jl| over the keys with e_j < 2^-14
    for (size_t a = 0; a < slots.size(); ++a) {
      const double e = std::exp(s[a] - m);
      const double p = e / z;
      const double* v = &in.kv.at(static_cast<size_t>(slots[a]) * D);
      for (int l = 0; l < L; ++l) {
        out[l] += p * v[l];
        out_abs[l] += p * std::fabs(v[l]);
      }
      if (e < std::ldexp(1.0, -14)) {
        if (tiny.empty()) tiny.assign(L, 0.0);
        const double w = std::min(e, std::ldexp(1.0, -25));
        for (int l = 0; l < L; ++l) tiny[l] += w * std::fabs(v[l]);
      }
    }
    if (!tiny.empty()) {
      result.fp16_p_abs[static_cast<size_t>(t) * H + h] =
          std::fabs(in.bmm2_scale) * *std::max_element(tiny.begin(), tiny.end()) / z;
    }
    for (int l = 0; l < L; ++l) {
      out[l] *= in.bmm2_scale;
      out_abs[l] *= std::fabs(in.bmm2_scale);
    }
  };

  // Rows t * H + h, strided over the threads: each row is computed by one thread from shared
  // read-only input into its own part of the result, so the values do not depend on the thread
  // count. An error (a bad block_tables entry, say) is rethrown after the join.
  const int64_t rows = static_cast<int64_t>(T) * H;
  const int64_t threads =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(rows, 1));
  std::vector<std::exception_ptr> errors(threads);
  auto work = [&](int64_t first) {
    try {
      std::vector<double> s;
      std::vector<int64_t> slots;
      int slots_token = -1;
      for (int64_t r = first; r < rows; r += threads) {
        const int t = static_cast<int>(r / H), h = static_cast<int>(r % H);
        if (t != slots_token) {
          slots = attended_slots(in, tokens[t].first, tokens[t].second);
          slots_token = t;
        }
        row(t, h, slots, s);
      }
    } catch (...) {
      errors[first] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int64_t k = 1; k < threads; ++k) pool.emplace_back(work, k);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return result;
}

MergeOutput merge_reference(const MergeInput& in) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t rows = static_cast<int64_t>(in.tokens) * in.heads;
  MergeOutput o;
  o.out.assign(static_cast<size_t>(rows * in.width), 0.0);
  o.out_abs.assign(o.out.size(), 0.0);
  o.lse.assign(static_cast<size_t>(rows), -inf);
  for (int64_t row = 0; row < rows; ++row) {
    const int h = static_cast<int>(row % in.heads);
    double* out = &o.out[row * in.width];
    double* out_abs = &o.out_abs[row * in.width];
    bool any = false, bad = false;
    for (int r = 0; r < in.parts; ++r) {
      const double l = in.lse_parts[r * rows + row];
      if (std::isnan(l) || l == inf) bad = true;
      if (l != -inf) any = true;
    }
    if (bad) {
      o.lse[row] = nan;
      for (int c = 0; c < in.width; ++c) out[c] = out_abs[c] = nan;
      continue;
    }
    if (!any) continue;  // no part saw a key: out 0, lse -inf
    // lse = log(sum_r exp(lse_r)), shifted by the largest for range.
    double m = -inf;
    for (int r = 0; r < in.parts; ++r) m = std::max(m, in.lse_parts[r * rows + row]);
    double sum = 0.0;
    for (int r = 0; r < in.parts; ++r) sum += std::exp(in.lse_parts[r * rows + row] - m);
    const double lse = m + std::log(sum);
    const double sink_factor = in.has_sinks ? 1.0 / (1.0 + std::exp(in.sinks[h] - lse)) : 1.0;
    for (int r = 0; r < in.parts; ++r) {
      const double l = in.lse_parts[r * rows + row];
      if (l == -inf) continue;
      const double w = std::exp(l - lse) * sink_factor;
      const double* part = &in.out_parts[(r * rows + row) * in.width];
      for (int c = 0; c < in.width; ++c) {
        out[c] += w * part[c];
        out_abs[c] += w * std::fabs(part[c]);
      }
    }
    o.lse[row] = lse;
  }
  return o;
}

void fp8_ds_mla_to_double(const uint8_t* row, double* key) {
  auto le = [row](int offset, int bytes) {
    uint32_t v = 0;
    for (int k = bytes - 1; k >= 0; --k) v = v << 8 | row[offset + k];
    return v;
  };
  for (int g = 0; g < 4; ++g) {
    const double scale = fp32_to_double(le(512 + 4 * g, 4));
    for (int k = 128 * g; k < 128 * (g + 1); ++k) key[k] = fp8_e4m3fn_to_double(row[k]) * scale;
  }
  for (int k = 0; k < 64; ++k)
    key[512 + k] = bf16_to_double(static_cast<uint16_t>(le(528 + 2 * k, 2)));
}

double bf16_to_double(uint16_t bits) {
  // bf16 is the upper half of an fp32.
  return fp32_to_double(static_cast<uint32_t>(bits) << 16);
}

double fp16_to_double(uint16_t bits) {
  if (((bits >> 10) & 0x1f) == 0x1f) {
    if (bits & 0x3ff) return std::numeric_limits<double>::quiet_NaN();
    return (bits & 0x8000) ? -std::numeric_limits<double>::infinity()
                           : std::numeric_limits<double>::infinity();
  }
  return decode_ieee_like(bits, 5, 10);
}

double fp8_e4m3fn_to_double(uint8_t bits) {
  if ((bits & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  return decode_ieee_like(bits, 4, 3);
}

double fp32_to_double(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return static_cast<double>(f);
}

}  // namespace oracle
