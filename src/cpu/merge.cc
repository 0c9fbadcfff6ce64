// cpu reference backend: the merge of partial states (include/mla/merge.h, docs/contract.md
// section 7), fp32 arithmetic in the sm90 kernel's order.
//
// Per row (token t, head h): M = max_r lse_r, w_r = exp(lse_r - M), S = sum_r w_r (in part order),
// acc = sum_r w_r * out_r (in part order), out = acc / (S + exp(sink_h - M)), lse = M + log S.
// Rows are independent: one thread computes a row, so results do not depend on the thread count.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include "cpu/numeric.h"
#include "host/backends.h"

namespace mla::detail::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kMaxWorkers = 64;
constexpr int64_t kRowsPerWorkerMin = 64;  // fewer rows per thread cost more than they save

float load_16bit(const uint16_t* p, bool fp16) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return fp16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

void store_16bit(uint16_t* p, float v, bool fp16) {
  const uint16_t bits = fp16 ? float_to_fp16(v) : float_to_bf16(v);
  std::memcpy(p, &bits, sizeof(bits));
}

float sink_of(const MergeProblem& p, const MergeParams& prm, int64_t h) {
  if (!p.has_sinks) return kNegInf;
  const int64_t i = h * p.sinks_stride;
  if (p.sinks_dtype == dtype::kFloat32) {
    float v;
    std::memcpy(&v, static_cast<const float*>(prm.sinks.data) + i, sizeof(v));
    return v;
  }
  return load_16bit(static_cast<const uint16_t*>(prm.sinks.data) + i,
                    p.sinks_dtype == dtype::kFloat16);
}

// Rows [begin, end) of T x H, with `acc` and `weight` the thread's scratch (L and N floats).
void merge_rows(const MergeProblem& p, const MergeParams& prm, int64_t begin, int64_t end,
                std::vector<float>& acc, std::vector<float>& weight) {
  const bool fp16 = p.out_dtype == dtype::kFloat16;
  const auto* parts = static_cast<const uint16_t*>(prm.out_parts.data);
  const auto* lse_parts = static_cast<const float*>(prm.lse_parts.data);
  auto* out = static_cast<uint16_t*>(prm.out.data);
  auto* lse_out = static_cast<float*>(prm.lse.data);
  for (int64_t row = begin; row < end; ++row) {
    const int64_t t = row / p.num_heads, h = row % p.num_heads;
    // ---- M: NaN wins, so a NaN part turns the row NaN ----
    float m = kNegInf;
    for (int64_t r = 0; r < p.num_parts; ++r) {
      const float l = lse_parts[r * p.lse_part_stride + t * p.lse_part_token + h * p.lse_part_head];
      weight[r] = l;
      m = (std::isnan(l) || std::isnan(m)) ? kNaN : std::max(m, l);
    }
    float scale = 0.0f, lse = kNegInf;
    std::fill(acc.begin(), acc.end(), 0.0f);
    if (std::isnan(m) || m == std::numeric_limits<float>::infinity()) {
      scale = lse = kNaN;  // +inf: exp(lse_r - M) is undefined; the row is NaN
    } else if (m != kNegInf) {
      // ---- weights, S and the weighted sum, in part order ----
      float s = 0.0f;
      for (int64_t r = 0; r < p.num_parts; ++r) {
        weight[r] = std::exp(weight[r] - m);
        s += weight[r];
      }
      for (int64_t r = 0; r < p.num_parts; ++r) {
        const float w = weight[r];
        if (w == 0.0f) continue;  // an empty part's out is not read
        const uint16_t* o = parts + r * p.part_stride + t * p.part_token + h * p.part_head;
        for (int64_t c = 0; c < p.L; ++c) acc[c] = std::fma(load_16bit(o + c, fp16), w, acc[c]);
      }
      float denom = s;
      const float sink = sink_of(p, prm, h);
      if (sink != kNegInf) denom += std::exp(sink - m);
      scale = 1.0f / denom;
      lse = m + std::log(s);
    }
    uint16_t* o = out + t * p.out_token + h * p.out_head;
    for (int64_t c = 0; c < p.L; ++c) store_16bit(o + c, acc[c] * scale, fp16);
    if (std::isnan(scale)) {
      for (int64_t c = 0; c < p.L; ++c) store_16bit(o + c, kNaN, fp16);
    }
    if (p.has_lse) lse_out[t * p.lse_token + h * p.lse_head] = lse;
  }
}

}  // namespace

void merge_states(const MergeProblem& p, const MergeParams& prm) {
  const int64_t rows = p.num_tokens * p.num_heads;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers =
      std::max<int64_t>(1, std::min({hardware, kMaxWorkers, rows / kRowsPerWorkerMin}));
  const int64_t per_worker = (rows + workers - 1) / workers;
  auto work = [&](int64_t w) {
    std::vector<float> acc(static_cast<size_t>(p.L)), weight(static_cast<size_t>(p.num_parts));
    merge_rows(p, prm, std::min(rows, w * per_worker), std::min(rows, (w + 1) * per_worker), acc,
               weight);
  };
  std::vector<std::thread> threads;
  int64_t started = 1;
  for (int64_t w = 1; w < workers; ++w, ++started) {
    try {
      threads.emplace_back(work, w);
    } catch (const std::system_error&) {
      break;
    }
  }
  work(0);
  for (std::thread& thread : threads) thread.join();
  // Slices whose thread could not start: this thread computes them.
  for (int64_t w = started; w < workers; ++w) work(w);
}

}  // namespace mla::detail::cpu
