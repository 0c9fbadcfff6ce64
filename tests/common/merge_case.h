// Cases of merge_states (include/mla/merge.h) shared by the cpu and sm90 suites: random partial
// states in host buffers, the float64 reference (oracle::merge_reference), and the comparison with
// tolerances from the error model of docs/context-parallel.md.
//
// Hygiene: out and lse poisoned with NaN before each run; the padding of strided parts holds NaN
// (never read) and out's padding must stay untouched.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "mla/mla.h"
#include "oracle/oracle.h"

namespace mla_test::merge_case {

enum class Special {
  kNone,
  kEmptyParts,  // some parts and some whole rows without keys (lse -inf)
  kNanLse,      // a NaN lse part in some rows (with NaN out there, as the decode writes it)
  kWideRange,   // lse parts 60 apart: tiny weights, some underflowing in fp32
};

struct Case {
  int N = 2, T = 3, H = 16, L = 512;
  mla::DataType dtype = mla::dtype::kBFloat16;
  mla::DataType sinks = {};  // code 0: none
  bool with_lse = true;
  bool strided = false;  // padded rows and heads in every tensor
  Special special = Special::kNone;
  uint64_t seed = 1;
};

inline std::string case_name(const Case& c) {
  std::ostringstream s;
  s << "N" << c.N << "_T" << c.T << "_H" << c.H << "_L" << c.L << "_" << dtype_name(c.dtype)
    << (c.sinks.bits ? std::string("_sinks") + dtype_name(c.sinks) : "")
    << (c.with_lse ? "" : "_nolse") << (c.strided ? "_strided" : "")
    << (c.special == Special::kEmptyParts  ? "_empty"
        : c.special == Special::kNanLse    ? "_nan"
        : c.special == Special::kWideRange ? "_wide"
                                           : "");
  return s.str();
}

struct Built {
  Case c;
  int64_t part_L = 0, part_H = 0;  // padded widths of out_parts
  int64_t out_L = 0;               // padded row width of out
  int64_t lse_H = 0;               // padded head stride of lse / lse_parts
  Buffer parts, lse_parts, sinks, out, lse;
  oracle::MergeInput in;
  mla::MergeParams params;

  int64_t out_index(int64_t t, int64_t h, int64_t l) const { return (t * c.H + h) * out_L + l; }
  int64_t lse_index(int64_t t, int64_t h) const { return t * lse_H + h * (c.strided ? 2 : 1); }
};

inline std::unique_ptr<Built> build(const Case& c) {
  auto b = std::make_unique<Built>();
  b->c = c;
  Rng rng(c.seed);
  const int pad = c.strided ? 8 : 0;
  b->part_L = c.L + pad;
  b->part_H = c.H + (c.strided ? 1 : 0);
  b->out_L = c.L + pad;
  b->lse_H = c.strided ? 2 * c.H + 1 : c.H;
  const int64_t rows = static_cast<int64_t>(c.T) * c.H;
  b->parts = Buffer(c.dtype, int64_t{c.N} * c.T * b->part_H * b->part_L);
  b->lse_parts = Buffer(mla::dtype::kFloat32, int64_t{c.N} * c.T * b->lse_H);
  b->out = Buffer(c.dtype, int64_t{c.T} * c.H * b->out_L);
  b->lse = Buffer(mla::dtype::kFloat32, int64_t{c.T} * b->lse_H);
  oracle::MergeInput& in = b->in;
  in.parts = c.N;
  in.tokens = c.T;
  in.heads = c.H;
  in.width = c.L;
  in.out_parts.assign(static_cast<size_t>(c.N * rows * c.L), 0.0);
  in.lse_parts.assign(static_cast<size_t>(c.N * rows), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  for (int r = 0; r < c.N; ++r) {
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t t = row / c.H, h = row % c.H;
      double lse = rng.uniform(-4.0, 12.0);
      if (c.special == Special::kWideRange) lse = rng.coin(0.5) ? 70.0 : 10.0 - 50.0 * r;
      bool nan_row = false;
      if (c.special == Special::kEmptyParts && (rng.coin(0.3) || row % 5 == 0)) lse = -inf;
      if (c.special == Special::kNanLse && row % 4 == 1 && r == c.N - 1) nan_row = true;
      const int64_t lse_at = (r * c.T + t) * b->lse_H + h * (c.strided ? 2 : 1);
      // A NaN part's lse and out stay the buffers' NaN poison.
      in.lse_parts[r * rows + row] =
          nan_row ? std::numeric_limits<double>::quiet_NaN() : b->lse_parts.set(lse_at, lse);
      const int64_t part_at = ((r * c.T + t) * b->part_H + h) * b->part_L;
      for (int l = 0; l < c.L; ++l) {
        // An empty part's out is 0, as the decode writes it; a NaN part's is NaN.
        double v = lse == -inf ? 0.0 : rng.uniform(-2.0, 2.0);
        if (!nan_row) v = b->parts.set(part_at + l, v);
        in.out_parts[(r * rows + row) * c.L + l] = nan_row ? std::nan("") : v;
      }
    }
  }
  if (c.sinks.bits) {
    b->sinks = Buffer(c.sinks, c.H);
    in.has_sinks = true;
    for (int h = 0; h < c.H; ++h) in.sinks.push_back(b->sinks.set(h, rng.uniform(-2.0, 14.0)));
  }

  mla::MergeParams& p = b->params;
  p.out_parts =
      mla::TensorView::strided(b->parts.data(), c.dtype, {c.N, c.T, c.H, c.L},
                               {c.T * b->part_H * b->part_L, b->part_H * b->part_L, b->part_L, 1});
  const int64_t hs = c.strided ? 2 : 1;
  p.lse_parts = mla::TensorView::strided(b->lse_parts.data(), mla::dtype::kFloat32, {c.N, c.T, c.H},
                                         {c.T * b->lse_H, b->lse_H, hs});
  p.out = mla::TensorView::strided(b->out.data(), c.dtype, {c.T, c.H, c.L},
                                   {c.H * b->out_L, b->out_L, 1});
  if (c.with_lse) {
    p.lse =
        mla::TensorView::strided(b->lse.data(), mla::dtype::kFloat32, {c.T, c.H}, {b->lse_H, hs});
  }
  if (c.sinks.bits) p.sinks = mla::TensorView::contiguous(b->sinks.data(), c.sinks, {c.H});
  p.backend = mla::Backend::kCpu;
  return b;
}

// The error model (docs/context-parallel.md): the weights exp(lse_r - M) in fp32 are off by a few
// ulp plus |lse_r - M| ulp of the subtraction, the N-term fp32 sum adds N ulp of the terms' size,
// and out is rounded once to its dtype (half an ulp: 2^-9 bf16, 2^-12 fp16; we allow twice that).
// Terms size: out_abs = sum_r w_r |out_r|.
inline OutTolerance merge_out_tolerance(const Case& c, double max_abs_lse) {
  const double eps32 = std::ldexp(1.0, -24);
  OutTolerance t;
  t.rtol = c.dtype == mla::dtype::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
  t.atol_row = 0.0;
  t.atol_abs = c.dtype == mla::dtype::kFloat16 ? std::ldexp(1.0, -24) : 0.0;
  t.p_rel = eps32 * (2.0 * c.N + 16.0 + 4.0 * max_abs_lse);
  return t;
}

// Compares out (every element, and its padding untouched) and lse with the reference.
inline void check_against_oracle(const Built& b) {
  const Case& c = b.c;
  const oracle::MergeOutput ref = oracle::merge_reference(b.in);
  const int64_t rows = int64_t{c.T} * c.H;
  double max_abs_lse = 0.0;
  for (double l : b.in.lse_parts) {
    if (std::isfinite(l)) max_abs_lse = std::max(max_abs_lse, std::fabs(l));
  }
  auto nan_row = [&](int64_t row) { return std::isnan(ref.lse[row]); };
  // NaN rows: out and lse must be NaN.
  for (int64_t row = 0; row < rows; ++row) {
    if (!nan_row(row)) continue;
    const int64_t t = row / c.H, h = row % c.H;
    for (int l = 0; l < c.L; ++l) {
      ASSERT_TRUE(std::isnan(b.out.get(b.out_index(t, h, l)))) << "row " << row << " col " << l;
    }
    if (c.with_lse) {
      ASSERT_TRUE(std::isnan(b.lse.get(b.lse_index(t, h)))) << "lse row " << row;
    }
  }
  const OutTolerance tol = merge_out_tolerance(c, max_abs_lse);
  EXPECT_TRUE(compare_rows(
      "out", rows, c.L, tol,
      [&](int64_t r, int64_t l) {
        return nan_row(r) ? 0.0 : b.out.get(b.out_index(r / c.H, r % c.H, l));
      },
      [&](int64_t r, int64_t l) { return nan_row(r) ? 0.0 : ref.out[r * c.L + l]; },
      [&](int64_t r, int64_t l) { return nan_row(r) ? 0.0 : ref.out_abs[r * c.L + l]; },
      [&](int64_t r) {
        return nan_row(r) || ref.lse[r] == -std::numeric_limits<double>::infinity();
      }));
  // out's padding stays untouched.
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t l = c.L; l < b.out_L; ++l) {
      ASSERT_TRUE(b.out.is_poison(row * b.out_L + l)) << "out padding written at row " << row;
    }
  }
  if (!c.with_lse) return;
  // lse = M + log S in fp32: a few ulp of |M| and of log S.
  for (int64_t row = 0; row < rows; ++row) {
    if (nan_row(row)) continue;
    const double got = b.lse.get(b.lse_index(row / c.H, row % c.H));
    const double want = ref.lse[row];
    if (want == -std::numeric_limits<double>::infinity()) {
      ASSERT_EQ(got, want) << "lse row " << row << " (empty)";
      continue;
    }
    const double allowed = std::ldexp(1.0, -21) * (1.0 + std::fabs(want) + max_abs_lse);
    ASSERT_LE(std::fabs(got - want), allowed)
        << "lse row " << row << ": got " << got << ", expected " << want;
  }
}

}  // namespace mla_test::merge_case
