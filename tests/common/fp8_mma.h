// The error models of the few-rows kernel's routes over an e4m3 cache read as it lands
// (docs/sm90-fp8.md, Precision): the FP8 tensor cores (an e4m3 query), and fp16 GEMMs over a
// scaled bf16 query; per-row allowances against the float64 oracle.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/test_util.h"
#include "oracle/oracle.h"

namespace mla_test::fp8_mma {

// The FP8 tensor cores accumulate each product sum in a narrower format than fp32 (about 13
// fraction bits, truncated). The kernels start every partial sum from zero on the tensor cores and
// add it in fp32: a score's 192 columns of three chunks (six wgmma k steps; the few-rows kernel and
// the two-consumer FP8 seesaw kernel) or all its 576 columns (18 k steps; the three-consumer FP8
// seesaw kernel, route.fp8_three), a block's 64 keys of one V column tile (two k steps). We take
// each wgmma k step to come out within 2^-11 of the magnitude it aligns to, so a partial s =
// sum_k a_k b_k of n steps within n 2^-11 sum_k |a_k b_k|: score_accum_rel(n) for the scores (3
// 2^-10 or 9 2^-10), kPvAccumRel (2^-10) for P V; the fp32 additions are far below it.
constexpr double score_accum_rel(int steps) { return steps / 2048.0; }
constexpr int kScoreSteps = 6;        // a partial of three chunks
constexpr int kScoreStepsWhole = 18;  // one partial over the 576 columns
constexpr double kPvAccumRel = 2.0 / 2048;
// e4m3 P is taken as p' = 2^8 p (p <= 1, relative to the running max): below 2^-6, p' is
// subnormal, with spacing 2^-9; rounding to nearest moves p by at most min(p, 2^-18).
constexpr double kSubnormalAbs = 1.0 / (1 << 18);

// Against the oracle, per row (token, head) with attended keys A:
// - scores: s~_j = s_j + e_j, |e_j| <= E_j = |bmm1| score_accum_rel(steps) sum_d |q_d| |k_jd|
//   (steps: of the route's score partials, kScoreSteps or kScoreStepsWhole);
// - lse moves by at most E = max_{j in A} E_j (lse_abs);
// - P then moves by at most (exp(2E) - 1) p_j (fp8_ds_mla.h derives the same), and the P V
//   partials' accumulation by kPvAccumRel of sum_j p~_j |v_jl|: out_rel = exp(2E) (1 +
//   kPvAccumRel) - 1;
// - e4m3 P: half an ulp (2^-4 relative; the caller's p_rel, twice that) in the normal range, and
//   min(p_j, 2^-18) in the subnormal range, with p_j = exp(s_j - max_A s): out moves by at most
//   |bmm2| sum_j min(p_j, 2^-18) |v_jl| / Z, Z = sum_A p_j (+ the sink's term): out_abs, the
//   largest over the row's columns, twice that and times exp(2E) for the moved scores.
// A row with a non-finite score or value gets none (it is NaN, compared apart).
inline RowAllowance allowance(const oracle::Input& in, int score_steps = kScoreSteps) {
  const double score_rel = score_accum_rel(score_steps);
  const int H = in.num_heads, D = in.head_dim(), L = in.kv_lora_rank;
  RowAllowance a;
  const size_t rows = static_cast<size_t>(in.num_tokens()) * H;
  a.out_rel.assign(rows, 0.0);
  a.out_abs.assign(rows, 0.0);
  a.lse_abs.assign(rows, 0.0);
  for (int b = 0; b < in.batch; ++b) {
    for (int i = 0; i < in.q_lens[b]; ++i) {
      const int t = in.first_token(b) + i;
      const std::vector<int64_t> slots = oracle::attended_slots(in, b, i);
      if (slots.empty()) continue;
      for (int h = 0; h < H; ++h) {
        const double* q = &in.query[(static_cast<size_t>(t) * H + h) * D];
        std::vector<double> s(slots.size());
        double e = 0.0, m = -INFINITY;
        bool finite = std::isfinite(in.bmm1_scale) && std::isfinite(in.bmm2_scale);
        for (size_t j = 0; j < slots.size() && finite; ++j) {
          const double* k = &in.kv[static_cast<size_t>(slots[j]) * D];
          double dot = 0.0, mag = 0.0;
          for (int d = 0; d < D; ++d) {
            dot += q[d] * k[d];
            mag += std::fabs(q[d]) * std::fabs(k[d]);
          }
          s[j] = in.bmm1_scale * dot;
          e = std::max(e, std::fabs(in.bmm1_scale) * score_rel * mag);
          finite = std::isfinite(s[j]) && std::isfinite(mag);
          m = std::max(m, s[j]);
        }
        if (!finite) continue;
        double z = in.has_sinks ? std::exp(in.sinks[h] - m) : 0.0;
        for (double x : s) z += std::exp(x - m);
        std::vector<double> tail(L, 0.0);  // sum_j min(p_j, 2^-18) |v_jl|
        for (size_t j = 0; j < slots.size(); ++j) {
          const double w = std::min(std::exp(s[j] - m), kSubnormalAbs);
          const double* v = &in.kv[static_cast<size_t>(slots[j]) * D];
          for (int l = 0; l < L; ++l) tail[l] += w * std::fabs(v[l]);
        }
        const double tail_max = *std::max_element(tail.begin(), tail.end());
        const size_t r = static_cast<size_t>(t) * H + h;
        const double grow = std::exp(2 * e);
        a.lse_abs[r] = e;
        a.out_rel[r] = grow * (1 + kPvAccumRel) - 1;
        a.out_abs[r] = 2 * grow * std::fabs(in.bmm2_scale) * tail_max / z;
      }
    }
  }
  return a;
}

// A bf16 query over an e4m3 cache in fp16 GEMMs (the few-rows kernel's direct route, the seesaw
// kernel's dense calls: tests/common/device_call.h, sm90_scaled_query): the GEMMs run in fp16, each
// query row scaled by the power of two 2^s that puts its largest |value| M in [2^14, 2^15)
// (tma::load_query_tile_rows, kPermute16). A bf16 value is exact in fp16 from 2^-17 of that range
// down (fp16's subnormal spacing, 2^-24, is 2^(e - 38) in the row's own units, e = floor(log2 M));
// below, rounding moves a value by at most 2^(e - 39), and a row whose M is below 2^-126 is taken
// as zeros. So a score moves by at most E = |bmm1| delta max_j sum_d |k_jd| (delta = 2^(e - 39), or
// M for the zeroed rows): lse_abs = E and out_rel = exp(2E) - 1, as in allowance(); P is rounded to
// fp16 (the caller's p_rel), the products and sums are exact or fp32. A row with a non-finite query
// value, key value or scale gets none (it is NaN, compared apart).
inline RowAllowance scaled_query_allowance(const oracle::Input& in) {
  const int H = in.num_heads, D = in.head_dim();
  RowAllowance a;
  const size_t rows = static_cast<size_t>(in.num_tokens()) * H;
  a.out_rel.assign(rows, 0.0);
  a.lse_abs.assign(rows, 0.0);
  for (int b = 0; b < in.batch; ++b) {
    for (int i = 0; i < in.q_lens[b]; ++i) {
      const int t = in.first_token(b) + i;
      const std::vector<int64_t> slots = oracle::attended_slots(in, b, i);
      double k_sum = 0.0;  // max_j sum_d |k_jd|
      for (int64_t slot : slots) {
        double sum = 0.0;
        for (int d = 0; d < D; ++d) sum += std::fabs(in.kv[static_cast<size_t>(slot) * D + d]);
        k_sum = std::max(k_sum, sum);
      }
      for (int h = 0; h < H; ++h) {
        const double* q = &in.query[(static_cast<size_t>(t) * H + h) * D];
        double m = 0.0;
        bool finite = std::isfinite(in.bmm1_scale) && std::isfinite(in.bmm2_scale);
        for (int d = 0; d < D; ++d) {
          finite = finite && std::isfinite(q[d]);
          m = std::max(m, std::fabs(q[d]));
        }
        if (!finite || !std::isfinite(k_sum) || m == 0.0) continue;
        const double delta = m < std::ldexp(1.0, -126) ? m : std::ldexp(1.0, std::ilogb(m) - 39);
        const double e = std::fabs(in.bmm1_scale) * delta * k_sum;
        if (!std::isfinite(e)) continue;
        const size_t r = static_cast<size_t>(t) * H + h;
        a.lse_abs[r] = e;
        a.out_rel[r] = std::exp(2 * e) - 1;
      }
    }
  }
  return a;
}

}  // namespace mla_test::fp8_mma
