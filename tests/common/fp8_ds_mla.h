// The fp8_ds_mla cache format (docs/contract.md section 1; DeepSeek-V3.2's layout as FlashMLA and
// vLLM store it) on the test side: an encoder from float data, quantizing each group of 128 latent
// values with scale = amax / 448 as DeepSeek does, and the switch of a built case to that cache.
// Decoding goes through the oracle's decoder.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// Encodes the 576 values `x` as one 656-byte row; returns through `decoded` what the row holds.
inline void encode_row(const double* x, uint8_t* row, double* decoded) {
  for (int g = 0; g < kLatent / kGroup; ++g) {
    double amax = 0.0;
    for (int k = g * kGroup; k < (g + 1) * kGroup; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float scale = static_cast<float>(std::max(amax, 1e-4) / kFp8Max);
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

// Switches a built case (L 512, R 64, bfloat16 query) to an fp8_ds_mla cache held in `storage`:
// every live row of the oracle's pool is quantized (and the oracle sees the decoded values), every
// NaN row stays NaN. The cache is [P, page_size, 656] (with c.kv4d [P, 1, page_size, 656]), its
// rows and pages padded with NaN bytes when c.strided.
inline void use_fp8_ds_mla(decode_case::Built& b, std::vector<uint8_t>& storage) {
  const decode_case::Case& c = b.c;
  if (c.L != kLatent || c.R != kValues - kLatent || c.q_dtype != mla::dtype::kBFloat16) {
    throw std::invalid_argument("use_fp8_ds_mla: needs L 512, R 64 and a bfloat16 query");
  }
  const int pad = c.strided ? 1 : 0;
  const int64_t ps = c.page_size, rs = kRowBytes + 48 * pad, pgs = ps * rs + 64 * pad;
  storage.assign(static_cast<size_t>(std::max<int64_t>(b.num_pages * pgs, 1)), 0xff);
  for (int64_t slot = 0; slot < static_cast<int64_t>(b.num_pages) * ps; ++slot) {
    double* x = &b.in.kv[static_cast<size_t>(slot) * kValues];
    uint8_t* row = storage.data() + (slot / ps) * pgs + (slot % ps) * rs;
    if (std::any_of(x, x + kValues, [](double v) { return std::isnan(v); })) {
      poison_row(row);
      continue;
    }
    std::vector<double> decoded(kValues);
    encode_row(x, row, decoded.data());
    std::copy(decoded.begin(), decoded.end(), x);
  }
  b.params.kv_cache =
      c.kv4d ? mla::TensorView::strided(storage.data(), mla::dtype::kUInt8,
                                        {b.num_pages, 1, ps, kRowBytes}, {pgs, ps * rs, rs, 1})
             : mla::TensorView::strided(storage.data(), mla::dtype::kUInt8,
                                        {b.num_pages, ps, kRowBytes}, {pgs, rs, 1});
}

}  // namespace mla_test::fp8_ds_mla
