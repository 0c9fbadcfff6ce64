// Helpers shared by the tests: random numbers, encoders that round a double to a storage dtype
// (independent of the library's conversions), NaN poisoning, and comparison with per-dtype
// tolerances. Decoding goes through the oracle's decoders.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mla/tensor.h"
#include "oracle/oracle.h"

namespace mla_test {

// ---- Random numbers --------------------------------------------------------------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  // Uniform in [lo, hi], both ends included.
  int randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(engine_); }
  bool coin(double p_true) { return uniform(0.0, 1.0) < p_true; }
  uint32_t bits32() { return static_cast<uint32_t>(engine_()); }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

// ---- Encoders: double -> storage bits, round to nearest even ---------------------------------

// A binary format with `exp_bits` exponent bits (IEEE bias) and `man_bits` stored mantissa bits.
// Finite results only: throws when |x| rounds past the largest finite value `max_exp_field`.
inline uint32_t encode_binary(double x, int exp_bits, int man_bits, uint32_t max_exp_field,
                              uint32_t max_man_at_max_exp) {
  if (std::isnan(x)) throw std::invalid_argument("encode_binary: NaN");
  const uint32_t sign = std::signbit(x) ? 1u << (exp_bits + man_bits) : 0u;
  const double a = std::fabs(x);
  if (a == 0.0) return sign;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int min_exp = 1 - bias;
  int e2;
  std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1)
  int e = std::max(e2 - 1, min_exp);
  double q = std::nearbyint(std::ldexp(a, man_bits - e));  // significand in units of the quantum
  const double implicit_one = std::ldexp(1.0, man_bits);
  if (q >= 2 * implicit_one) {  // rounded up to the next binade
    q /= 2;
    e += 1;
  }
  const uint32_t exp_field = q >= implicit_one ? static_cast<uint32_t>(e + bias) : 0u;
  const uint32_t man_field = static_cast<uint32_t>(q - (exp_field ? implicit_one : 0.0));
  if (exp_field > max_exp_field || (exp_field == max_exp_field && man_field > max_man_at_max_exp)) {
    throw std::out_of_range("encode_binary: value out of range");
  }
  return sign | exp_field << man_bits | man_field;
}

inline uint16_t encode_bf16(double x) {
  return static_cast<uint16_t>(encode_binary(x, 8, 7, 254, 127));
}
inline uint16_t encode_fp16(double x) {
  return static_cast<uint16_t>(encode_binary(x, 5, 10, 30, 1023));
}
inline uint8_t encode_fp8_e4m3fn(double x) {
  return static_cast<uint8_t>(encode_binary(x, 4, 3, 15, 6));  // S.1111.111 is NaN, 448 the max
}

// ---- Typed element access in raw buffers ------------------------------------------------------

inline size_t dtype_bytes(mla::DataType dt) { return dt.bits / 8; }

inline const char* dtype_name(mla::DataType dt) {
  if (dt == mla::dtype::kBFloat16) return "bf16";
  if (dt == mla::dtype::kFloat16) return "fp16";
  if (dt == mla::dtype::kFloat32) return "fp32";
  if (dt == mla::dtype::kFloat8E4M3) return "fp8";
  return "other";
}

// Rounds `x` to `dt`, stores it at element `index` of `base`, returns the value now stored.
inline double store(void* base, mla::DataType dt, int64_t index, double x) {
  if (dt == mla::dtype::kBFloat16) {
    const uint16_t bits = encode_bf16(x);
    static_cast<uint16_t*>(base)[index] = bits;
    return oracle::bf16_to_double(bits);
  }
  if (dt == mla::dtype::kFloat16) {
    const uint16_t bits = encode_fp16(x);
    static_cast<uint16_t*>(base)[index] = bits;
    return oracle::fp16_to_double(bits);
  }
  if (dt == mla::dtype::kFloat8E4M3) {
    const uint8_t bits = encode_fp8_e4m3fn(x);
    static_cast<uint8_t*>(base)[index] = bits;
    return oracle::fp8_e4m3fn_to_double(bits);
  }
  if (dt == mla::dtype::kFloat32) {
    const float f = static_cast<float>(x);
    static_cast<float*>(base)[index] = f;
    return static_cast<double>(f);
  }
  throw std::invalid_argument("store: unsupported dtype");
}

// Reads element `index` of `base` as a double.
inline double load(const void* base, mla::DataType dt, int64_t index) {
  if (dt == mla::dtype::kBFloat16)
    return oracle::bf16_to_double(static_cast<const uint16_t*>(base)[index]);
  if (dt == mla::dtype::kFloat16)
    return oracle::fp16_to_double(static_cast<const uint16_t*>(base)[index]);
  if (dt == mla::dtype::kFloat8E4M3) {
    return oracle::fp8_e4m3fn_to_double(static_cast<const uint8_t*>(base)[index]);
  }
  if (dt == mla::dtype::kFloat32)
    return static_cast<double>(static_cast<const float*>(base)[index]);
  throw std::invalid_argument("load: unsupported dtype");
}

// A quiet-NaN bit pattern of `dt`, `dtype_bytes(dt)` bytes long (little-endian).
inline uint32_t nan_bits(mla::DataType dt) {
  if (dt == mla::dtype::kBFloat16) return 0x7fc0u;
  if (dt == mla::dtype::kFloat16) return 0x7e00u;
  if (dt == mla::dtype::kFloat8E4M3) return 0x7fu;
  if (dt == mla::dtype::kFloat32) return 0x7fc00000u;
  throw std::invalid_argument("nan_bits: unsupported dtype");
}

// A host buffer of `count` elements of `dt`, every element NaN until written.
class Buffer {
 public:
  Buffer() = default;
  Buffer(mla::DataType dt, int64_t count) : dtype_(dt), count_(count) {
    bytes_.resize(static_cast<size_t>(std::max<int64_t>(count, 1)) * dtype_bytes(dt));
    poison();
  }
  void poison() {
    const uint32_t nan = nan_bits(dtype_);
    for (int64_t i = 0; i < count_; ++i) std::memcpy(at(i), &nan, dtype_bytes(dtype_));
  }
  bool is_poison(int64_t i) const {
    const uint32_t nan = nan_bits(dtype_);
    return std::memcmp(static_cast<const uint8_t*>(data()) + i * dtype_bytes(dtype_), &nan,
                       dtype_bytes(dtype_)) == 0;
  }
  double set(int64_t i, double x) { return store(data(), dtype_, i, x); }
  double get(int64_t i) const { return load(data(), dtype_, i); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  int64_t count() const { return count_; }
  mla::DataType dtype() const { return dtype_; }

 private:
  void* at(int64_t i) { return bytes_.data() + i * dtype_bytes(dtype_); }
  mla::DataType dtype_{};
  int64_t count_ = 0;
  std::vector<uint8_t> bytes_;
};

// ---- Tolerances and comparison ----------------------------------------------------------------

// |got - ref| <= atol_row * max|ref over the row| + rtol * |ref| + atol_abs + p_rel * ref_abs,
// where a row is the L output values of one (token, head). rtol covers the final rounding to the
// output dtype (half an ulp is 2^-8 relative for bf16, 2^-11 for fp16; we allow twice that);
// atol_abs covers fp16's subnormal range, where the spacing is a fixed 2^-24 (bf16 has fp32's
// range: no floor needed); atol_row covers fp32 accumulation error in the softmax and the weighted
// sum, which scales with the row's magnitude rather than the element's.
//
// p_rel is for kernels that round each probability p_j to a 16-bit type before the weighted sum
// (the tensor-core PV product takes 16-bit operands). Rounding to nearest moves p_j by at most half
// an ulp, 2^-9 relative for bf16 (2^-12 for fp16, in its normal range), so out moves by at most
// 2^-9 * |bmm2_scale| * sum_j p_j |v_j| / Z = 2^-9 * ref_abs (the oracle's out_abs), which can be
// far above rtol * |ref| where the terms cancel. We allow twice that: p_rel = 2^-8 for bf16 P and
// 2^-11 for fp16 P; 0 where P stays fp32 (the cpu backend). fp16 P below 2^-14 of the running max
// is subnormal, where its rounding is absolute: the oracle's fp16_p_abs, which the checks add
// where a route rounds P to fp16 (decode_case::with_fp16_p). A kernel that also rounds partial
// results adds the same term for them: the sm90 split partials o_s = bmm2 * acc_s / z_s are
// rounded once to the out type, and out = sum_s w_s o_s with weights w_s >= 0 summing to at most
// 1 then moves by at most 2^-9 (bf16; 2^-12 fp16) * sum_s w_s |o_s| <= the same multiple of
// ref_abs, since |o_s| <= |bmm2_scale| * sum_{j in s} p_j |v_j| / z_s.
struct OutTolerance {
  double rtol;
  double atol_row;
  double atol_abs;
  double p_rel = 0.0;
};

inline OutTolerance out_tolerance(mla::DataType out_dtype) {
  if (out_dtype == mla::dtype::kBFloat16) return {1.0 / 128, 1e-4, 0.0};
  if (out_dtype == mla::dtype::kFloat16) return {1.0 / 1024, 1e-4, 1.0 / (1 << 24)};
  throw std::invalid_argument("out_tolerance: unsupported dtype");
}

// p_rel for probabilities rounded to `p_dtype` (see OutTolerance); fp32 P: 0. e4m3 P (the FP8
// tensor cores' P V) has 3 mantissa bits: half an ulp is 2^-4 relative in its normal range (its
// subnormal range adds an absolute term: tests/common/fp8_mma.h).
inline double p_rounding_rel(mla::DataType p_dtype) {
  if (p_dtype == mla::dtype::kFloat8E4M3) return 1.0 / 8;
  if (p_dtype == mla::dtype::kBFloat16) return 1.0 / 256;
  if (p_dtype == mla::dtype::kFloat16) return 1.0 / 2048;
  if (p_dtype == mla::dtype::kFloat32) return 0.0;
  throw std::invalid_argument("p_rounding_rel: unsupported dtype");
}

// Per-row additions to the tolerances, for a kernel that rounds its inputs before the math (an
// fp8_ds_mla cache's dequantized values: fp8_ds_mla::dequant_rounding_allowance derives them).
// out_rel[r] multiplies row r's ref_abs, as p_rel does; out_abs[r] adds to every out value of row
// r; lse_abs[r] adds to lse's allowance. Rows index (token, head) as t * H + h; empty vectors add
// nothing.
struct RowAllowance {
  std::vector<double> out_rel;
  std::vector<double> out_abs;
  std::vector<double> lse_abs;
  double out(int64_t r) const { return out_rel.empty() ? 0.0 : out_rel[r]; }
  double out_add(int64_t r) const { return out_abs.empty() ? 0.0 : out_abs[r]; }
  double lse(int64_t r) const { return lse_abs.empty() ? 0.0 : lse_abs[r]; }
};

// lse is fp32, from fp32 scores of D-term dot products. Measured on these sweeps, the cpu backend
// lands within 2e-6 of the float64 value for |lse| < 20 and within 1.5e-7 relative (about one fp32
// ulp) for peaky scores with lse up to ~160. 2e-5 absolute + 2e-5 relative leaves a 10-100x margin
// for other accumulation orders while still catching a missing or extra key, a dropped block, a
// wrong max or a sink wrongly included (those move lse by far more).
constexpr double kLseAtol = 2e-5;
constexpr double kLseRtol = 2e-5;

// Compares `count` rows of `width` values; got(r, c), ref(r, c) and ref_abs(r, c) give the
// values and the reference's magnitude scale (OutTolerance::p_rel). Empty rows (all reference
// values exactly 0 with `row_empty(r)` true) must be exactly 0. NaN never passes. `worst`
// (optional) receives the largest |err| / allowed over non-empty rows; `extra` (optional) adds
// its out_rel[r] * ref_abs and its out_abs[r] to row r's allowance.
template <typename Got, typename Ref, typename RefAbs, typename Empty>
::testing::AssertionResult compare_rows(const char* what, int64_t rows, int64_t width,
                                        OutTolerance tol, Got got, Ref ref, RefAbs ref_abs,
                                        Empty row_empty, double* worst_out = nullptr,
                                        const RowAllowance* extra = nullptr) {
  int64_t bad = 0;
  double worst = 0.0;  // largest |err| / allowed
  std::ostringstream msg;
  for (int64_t r = 0; r < rows; ++r) {
    double row_max = 0.0;
    for (int64_t c = 0; c < width; ++c) row_max = std::max(row_max, std::fabs(ref(r, c)));
    const bool empty = row_empty(r);
    const double rel = tol.p_rel + (extra != nullptr ? extra->out(r) : 0.0);
    const double add = extra != nullptr ? extra->out_add(r) : 0.0;
    for (int64_t c = 0; c < width; ++c) {
      const double g = got(r, c);
      const double x = ref(r, c);
      const double allowed = empty ? 0.0
                                   : tol.atol_row * row_max + tol.rtol * std::fabs(x) +
                                         tol.atol_abs + rel * ref_abs(r, c) + add;
      const double err = std::fabs(g - x);
      const bool ok = !std::isnan(g) && std::isfinite(x) && err <= allowed;
      if (!empty && allowed > 0) worst = std::max(worst, err / allowed);
      if (!ok) {
        if (bad < 8) {
          msg << "\n  " << what << " row " << r << " col " << c << ": got " << g << ", expected "
              << x << " (|err| " << err << " > allowed " << allowed << (empty ? ", empty row" : "")
              << ")";
        }
        ++bad;
      }
    }
  }
  if (worst_out) *worst_out = worst;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << rows * width << " " << what << " values out of tolerance (rtol "
         << tol.rtol << ", atol " << tol.atol_row << " * row max + " << tol.atol_abs << ", p_rel "
         << tol.p_rel << (extra != nullptr ? " + the row's rounding allowance" : "") << ")"
         << msg.str();
}

// lse: -inf exactly where the reference is -inf, else within kLseAtol + kLseRtol * |ref| (plus
// `extra`'s lse_abs[r], where given).
template <typename Got, typename Ref>
::testing::AssertionResult compare_lse(int64_t count, Got got, Ref ref, double* worst_out = nullptr,
                                       const RowAllowance* extra = nullptr) {
  int64_t bad = 0;
  double worst = 0.0;
  std::ostringstream msg;
  for (int64_t r = 0; r < count; ++r) {
    const double g = got(r);
    const double x = ref(r);
    bool ok;
    if (std::isinf(x)) {
      ok = g == x;
    } else {
      const double allowed =
          kLseAtol + kLseRtol * std::fabs(x) + (extra != nullptr ? extra->lse(r) : 0.0);
      ok = std::isfinite(g) && std::fabs(g - x) <= allowed;
      if (std::isfinite(g)) worst = std::max(worst, std::fabs(g - x) / allowed);
    }
    if (!ok) {
      if (bad < 8) msg << "\n  lse row " << r << ": got " << g << ", expected " << x;
      ++bad;
    }
  }
  if (worst_out) *worst_out = worst;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << count << " lse values out of tolerance (atol " << kLseAtol << ", rtol "
         << kLseRtol << (extra != nullptr ? ", + the row's rounding allowance" : "") << ")"
         << msg.str();
}

}  // namespace mla_test
