// Scalar conversions between fp32 and the 16/8-bit storage formats, round-to-nearest-even.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace mla::detail::cpu {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bfloat16: the high half of an fp32 ----

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits ----

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: inf
  if (magnitude < 0x38800000u) {
    // Subnormal result: adding 0.5 (ulp 2^-24) lets the fp32 adder round to a multiple of 2^-24.
    const float shifted = bits_float(magnitude) + 0.5f;
    return sign | static_cast<uint16_t>(float_bits(shifted) - float_bits(0.5f));
  }
  const uint32_t mantissa_odd = (magnitude >> 13) & 1u;
  magnitude -= 112u << 23;  // rebias exponent 127 -> 15
  magnitude += 0xfffu + mantissa_odd;
  return sign | static_cast<uint16_t>(magnitude >> 13);
}

// ---- fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf, S.1111.111 is NaN ----

inline float fp8_e4m3_decode(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exponent = (b >> 3) & 0xfu;
  const uint32_t mantissa = b & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return bits_float(sign | 0x7fc00000u);
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-9
    const float magnitude = static_cast<float>(mantissa) * 0.001953125f;
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

inline const std::array<float, 256>& fp8_e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_decode(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace mla::detail::cpu
