// The fp8_ds_mla cache format (docs/contract.md section 1; DeepSeek-V3.2's layout as FlashMLA and
// vLLM store it) on the test side: an encoder from float data, quantizing each group of 128 latent
// values with scale = amax / 448 as DeepSeek does, the switch of a built case to that cache, its
// non-finite rows, and the tolerance the gather kernels' rounding of dequantized values needs.
// Decoding goes through the oracle's decoder.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "common/decode_case.h"
#include "common/test_util.h"
#include "oracle/oracle.h"

namespace mla_test::fp8_ds_mla {

constexpr int kRowBytes = oracle::kFp8DsMlaRowBytes;  // 656
constexpr int kValues = oracle::kFp8DsMlaValues;      // 576 = 512 latent + 64 rope
constexpr int kLatent = 512;
constexpr int kGroup = 128;  // latent values per fp32 scale
constexpr double kFp8Max = 448.0;

// How a row's group scales are chosen: amax / 448 (vLLM), that rounded up to a power of two
// (ue8m0: DeepSeek's and FlashMLA's quantizers), or by row, ue8m0 on even slots (mixed).
enum class Scales { kAmax, kUe8m0, kMixed };

// Encodes the 576 values `x` as one 656-byte row; returns through `decoded` what the row holds.
// ue8m0: each scale rounded up to a power of two.
inline void encode_row(const double* x, uint8_t* row, double* decoded, bool ue8m0 = false) {
  for (int g = 0; g < kLatent / kGroup; ++g) {
    double amax = 0.0;
    for (int k = g * kGroup; k < (g + 1) * kGroup; ++k) amax = std::max(amax, std::fabs(x[k]));
    float scale = static_cast<float>(std::max(amax, 1e-4) / kFp8Max);
    if (ue8m0) scale = std::exp2(std::ceil(std::log2(scale)));
    std::memcpy(row + kLatent + 4 * g, &scale, 4);
    for (int k = g * kGroup; k < (g + 1) * kGroup; ++k) {
      const double q = std::clamp(x[k] / scale, -kFp8Max, kFp8Max);
      row[k] = encode_fp8_e4m3fn(q);
    }
  }
  for (int k = 0; k < kValues - kLatent; ++k) {
    const uint16_t bits = encode_bf16(x[kLatent + k]);
    std::memcpy(row + kLatent + 16 + 2 * k, &bits, 2);
  }
  oracle::fp8_ds_mla_to_double(row, decoded);
}

// The row of a slot that must never be read: NaN in every value, scale and rope element.
inline void poison_row(uint8_t* row) { std::memset(row, 0xff, kRowBytes); }

// Byte offset of pool row `slot` in the storage of use_fp8_ds_mla (rows and pages padded with NaN
// bytes when c.strided).
inline int64_t row_offset(const decode_case::Case& c, int64_t slot) {
  const int pad = c.strided ? 1 : 0;
  const int64_t ps = c.page_size, rs = kRowBytes + 48 * pad, pgs = ps * rs + 64 * pad;
  return (slot / ps) * pgs + (slot % ps) * rs;
}

// Switches a built case (L 512, R 64, bfloat16 query) to an fp8_ds_mla cache held in `storage`:
// every live row of the oracle's pool is quantized (and the oracle sees the decoded values), every
// NaN row stays NaN. The cache is [P, page_size, 656] (with c.kv4d [P, 1, page_size, 656]), its
// rows and pages padded with NaN bytes when c.strided. `scales`: how each row's scales are chosen.
inline void use_fp8_ds_mla(decode_case::Built& b, std::vector<uint8_t>& storage,
                           Scales scales = Scales::kAmax) {
  const decode_case::Case& c = b.c;
  if (c.L != kLatent || c.R != kValues - kLatent || c.q_dtype != mla::dtype::kBFloat16) {
    throw std::invalid_argument("use_fp8_ds_mla: needs L 512, R 64 and a bfloat16 query");
  }
  const int pad = c.strided ? 1 : 0;
  const int64_t ps = c.page_size, rs = kRowBytes + 48 * pad, pgs = ps * rs + 64 * pad;
  storage.assign(static_cast<size_t>(std::max<int64_t>(b.num_pages * pgs, 1)), 0xff);
  for (int64_t slot = 0; slot < static_cast<int64_t>(b.num_pages) * ps; ++slot) {
    double* x = &b.in.kv[static_cast<size_t>(slot) * kValues];
    uint8_t* row = storage.data() + row_offset(c, slot);
    if (std::any_of(x, x + kValues, [](double v) { return std::isnan(v); })) {
      poison_row(row);
      continue;
    }
    std::vector<double> decoded(kValues);
    encode_row(x, row, decoded.data(),
               scales == Scales::kUe8m0 || (scales == Scales::kMixed && slot % 2 == 0));
    std::copy(decoded.begin(), decoded.end(), x);
  }
  b.params.kv_cache =
      c.kv4d ? mla::TensorView::strided(storage.data(), mla::dtype::kUInt8,
                                        {b.num_pages, 1, ps, kRowBytes}, {pgs, ps * rs, rs, 1})
             : mla::TensorView::strided(storage.data(), mla::dtype::kUInt8,
                                        {b.num_pages, ps, kRowBytes}, {pgs, rs, 1});
}

// Value d (0..575) of pool row `slot` becomes NaN, or +inf where the row stores it in bf16 (the
// rope values, d >= 512; e4m3 has no inf), in the cache and the oracle.
inline void poison_value(decode_case::Built& b, std::vector<uint8_t>& storage, int64_t slot, int d,
                         bool inf = false) {
  uint8_t* row = storage.data() + row_offset(b.c, slot);
  double& x = b.in.kv[static_cast<size_t>(slot) * kValues + d];
  if (d < kLatent) {
    row[d] = 0x7f;  // S.1111.111: NaN
    x = std::nan("");
    return;
  }
  const uint16_t bits = inf ? 0x7f80 : 0x7fc0;
  std::memcpy(row + kLatent + 16 + 2 * (d - kLatent), &bits, 2);
  x = inf ? std::numeric_limits<double>::infinity() : std::nan("");
}

// The fp32 scale of latent group g (values 128 g .. 128 g + 127) of pool row `slot` becomes +inf,
// in the cache and the oracle: each value of the group is then +-inf, or NaN where its e4m3 value
// is 0.
inline void poison_scale(decode_case::Built& b, std::vector<uint8_t>& storage, int64_t slot,
                         int g) {
  uint8_t* row = storage.data() + row_offset(b.c, slot);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(row + kLatent + 4 * g, &inf, 4);
  oracle::fp8_ds_mla_to_double(row, &b.in.kv[static_cast<size_t>(slot) * kValues]);
}

// ---- The gather kernels' rounding of dequantized values -----------------------------------------
//
// On the sm90 gather kernels (sparse calls: tma/gather.cuh) each latent value enters the bf16
// GEMMs as k~ = bf16(fp32(e4m3 * scale)): the fp32 product (within 2^-24 relative of the exact
// one) rounded to nearest even once more, to bf16 (half an ulp: 2^-9 relative). So
// |k~_d - k_d| <= u |k_d| with u = (1 + 2^-24) 2^-9 + 2^-24 < 2^-9 + 2^-23 = kDequantRoundRel; the
// 64 rope values are bf16 already (exact), and so is the query. The oracle decodes exactly, so
// against it the kernel's result moves, beyond the rounding the other tolerances already cover:
//
// - scores: s~_j = s_j + e_j with |e_j| <= E_j = |bmm1| u sum_{d < 512} |q_d| |k_jd|;
// - lse, a max-norm-1-Lipschitz function of the scores: |lse~ - lse| <= E = max_{j in A} E_j;
// - P (p_j = exp(s_j - m) / Z, Z with the sink's term): p~_j / p_j = exp(e_j) Z / Z~, and Z~ / Z
//   lies in [exp(-E), exp(E)] (the sink's term does not move), so |p~_j - p_j| <=
//   (exp(2E) - 1) p_j, and out moves by at most (exp(2E) - 1) |bmm2| sum_j p_j |v_jl| =
//   (exp(2E) - 1) out_abs_l (the oracle's out_abs);
// - V: v~ = v (1 + eta), |eta| <= u, moves out by at most u |bmm2| sum_j p~_j |v_jl| <=
//   u exp(2E) out_abs_l.
//
// Together: out_rel = (1 + u) exp(2E) - 1 (about 2E + u) and lse_abs = E, per row. The kernel's
// own rounding of P and of the split partials (p_rel) then applies to p~ and v~, whose magnitude
// sum is at most (1 + u) exp(2E) out_abs: the factor two in mla_test::p_rounding_rel covers that
// while E < 0.34. This is a worst case: for random inputs the roundings' signs vary and the score
// errors add up like a random walk. E is about 0.05 for the default scale and unit-range inputs;
// the rounding, emulated on the host over sparse_test.cc's shapes, moves lse and out by 1 to 11%
// of these bounds, which is still up to 5e-3 in lse and twice 2^-8 out_abs in out there.
constexpr double kDequantRoundRel = 1.0 / 512 + 1.0 / (1 << 23);

// The per-row allowances above for a call over an fp8_ds_mla cache (the oracle's decoded input):
// a row whose bound is not finite (a non-finite scale or latent value: the row is NaN, compared
// apart) gets none.
inline RowAllowance dequant_rounding_allowance(const oracle::Input& in) {
  const int H = in.num_heads, D = in.head_dim();
  const double u = kDequantRoundRel;
  RowAllowance a;
  a.out_rel.assign(static_cast<size_t>(in.num_tokens()) * H, 0.0);
  a.lse_abs.assign(a.out_rel.size(), 0.0);
  for (int b = 0; b < in.batch; ++b) {
    for (int i = 0; i < in.q_lens[b]; ++i) {
      const int t = in.first_token(b) + i;
      const std::vector<int64_t> slots = oracle::attended_slots(in, b, i);
      for (int h = 0; h < H; ++h) {
        const double* q = &in.query[(static_cast<size_t>(t) * H + h) * D];
        double e = 0.0;
        bool finite = std::isfinite(in.bmm1_scale) && std::isfinite(in.bmm2_scale);
        for (size_t j = 0; j < slots.size() && finite; ++j) {
          const double* k = &in.kv[static_cast<size_t>(slots[j]) * D];
          double sum = 0.0;
          for (int d = 0; d < kLatent; ++d) sum += std::fabs(q[d]) * std::fabs(k[d]);
          const double e_j = std::fabs(in.bmm1_scale) * u * sum;
          finite = std::isfinite(e_j);
          e = std::max(e, e_j);
        }
        if (!finite) continue;
        const size_t r = static_cast<size_t>(t) * H + h;
        a.lse_abs[r] = e;
        a.out_rel[r] = (1 + u) * std::exp(2 * e) - 1;
      }
    }
  }
  return a;
}

// ---- The direct route (the few-rows kernel's sparse calls of 16 rows: route.fp8_direct)
// ----------
//
// There the latent values stay e4m3 (widened exactly to fp16), each group's scores are scaled by
// the keys' scales in fp32, and P enters the group's P V GEMM as fp16(p s_jg 2^-E_g), 2^E_g a
// power of two at most twice the largest |s_jg| of the consumer's keys so far (few_rows_kernel.cuh,
// ds_inv_of). From 2^-14 up that is fp16's 2^-11 relative rounding, within the caller's p_rel;
// below, fp16 is subnormal and rounds by at most 2^-25 absolute in those units, so out_l moves by
// at most |bmm2| 2^-25 sum_j 2^E_g |e_jl| / Z <= |bmm2| 2^-24 max_j |s_jg| sum_j |e_jl| / Z (g the
// group of l, e_jl = v_jl / s_jg the e4m3 value, Z = sum_j exp(score_j - max score), to which the
// sink only adds). out_abs[r] is the largest of those over l. A row with a non-finite score or
// scale gets none (it is NaN, compared apart). `storage` holds the cache (use_fp8_ds_mla).
inline RowAllowance direct_p_allowance(const decode_case::Built& b,
                                       const std::vector<uint8_t>& storage) {
  const oracle::Input& in = b.in;
  const int H = in.num_heads, D = in.head_dim();
  RowAllowance a;
  a.out_abs.assign(static_cast<size_t>(in.num_tokens()) * H, 0.0);
  for (int bi = 0; bi < in.batch; ++bi) {
    for (int i = 0; i < in.q_lens[bi]; ++i) {
      const int t = in.first_token(bi) + i;
      const std::vector<int64_t> slots = oracle::attended_slots(in, bi, i);
      // Per latent column l: max_j |s_jg| sum_j |e_jl| (the head does not enter it).
      std::vector<double> col(kLatent, 0.0);
      bool finite = true;
      for (int g = 0; g < kLatent / kGroup && finite; ++g) {
        double s_max = 0.0;
        std::vector<double> e_sum(kGroup, 0.0);
        for (int64_t slot : slots) {
          float s;
          std::memcpy(&s, storage.data() + row_offset(b.c, slot) + kLatent + 4 * g, 4);
          finite = finite && std::isfinite(s);
          if (!finite || s == 0.0f) continue;
          s_max = std::max(s_max, std::fabs(static_cast<double>(s)));
          for (int k = 0; k < kGroup; ++k) {
            e_sum[k] += std::fabs(in.kv[static_cast<size_t>(slot) * D + g * kGroup + k] / s);
          }
        }
        for (int k = 0; k < kGroup; ++k) col[g * kGroup + k] = s_max * e_sum[k];
      }
      if (!finite) continue;
      const double col_max = *std::max_element(col.begin(), col.end());
      for (int h = 0; h < H; ++h) {
        const double* q = &in.query[(static_cast<size_t>(t) * H + h) * D];
        std::vector<double> score(slots.size());
        double m = -std::numeric_limits<double>::infinity();
        for (size_t j = 0; j < slots.size(); ++j) {
          const double* k = &in.kv[static_cast<size_t>(slots[j]) * D];
          double x = 0.0;
          for (int d = 0; d < D; ++d) x += q[d] * k[d];
          score[j] = in.bmm1_scale * x;
          m = std::max(m, score[j]);
        }
        if (slots.empty() || !std::isfinite(m)) continue;
        double z = 0.0;
        for (double x : score) z += std::exp(x - m);
        const double e = std::fabs(in.bmm2_scale) * std::ldexp(col_max, -24) / z;
        if (std::isfinite(e)) a.out_abs[static_cast<size_t>(t) * H + h] = e;
      }
    }
  }
  return a;
}

// The oracle's pool with every finite latent value rounded as the gather kernels round it,
// bf16(fp32(value)) (the decoded value is the exact product e4m3 * scale): the math the kernels
// do, for a check without the allowance above.
inline std::vector<double> gather_rounded_kv(const oracle::Input& in) {
  std::vector<double> kv = in.kv;
  const size_t rows = kv.size() / kValues;
  for (size_t slot = 0; slot < rows; ++slot) {
    for (int d = 0; d < kLatent; ++d) {
      double& x = kv[slot * kValues + d];
      if (std::isfinite(x)) x = oracle::bf16_to_double(encode_bf16(static_cast<float>(x)));
    }
  }
  return kv;
}

}  // namespace mla_test::fp8_ds_mla
