// Exact widening of e4m3 values to 16-bit GEMM operands (fp8 queries and caches of the TMA
// kernels: docs/sm90-fp8.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace mla::sm90::tma {

// The e4m3 pair in half `kHigh` of `word` (the first value in the half's low byte) as two fp16
// values, the first in the low half: the cvt reads the half through F2FP's half selector, so the
// high half needs no shift. Exact: every e4m3 value, NaN included, is a value of fp16 and bf16.
template <bool kHigh>
__device__ __forceinline__ uint32_t widen_e4m3x2_half_of(uint32_t word) {
  uint32_t y;
  if constexpr (kHigh) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}"
        : "=r"(y)
        : "r"(word));
  } else {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}"
        : "=r"(y)
        : "r"(word));
  }
  return y;
}

// The e4m3 pair in half `kHigh` of `word` as two values of T (bf16 or fp16), exactly
// (widen_e4m3x2_half_of, then to bf16 through fp32).
template <typename T, bool kHigh>
__device__ __forceinline__ uint32_t widen_e4m3x2_of(uint32_t word) {
  const uint32_t h = widen_e4m3x2_half_of<kHigh>(word);
  if constexpr (std::is_same_v<T, __half>) {
    return h;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "16-bit element types");
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// 8 e4m3 values (`v.x` holds the first four) as 8 values of T.
template <typename T>
__device__ __forceinline__ uint4 widen_e4m3x8(const uint2& v) {
  return make_uint4(widen_e4m3x2_of<T, false>(v.x), widen_e4m3x2_of<T, true>(v.x),
                    widen_e4m3x2_of<T, false>(v.y), widen_e4m3x2_of<T, true>(v.y));
}

// 16 e4m3 values as 16 values of T: the low 8 in `lo`, the high 8 in `hi`.
template <typename T>
__device__ __forceinline__ void widen_e4m3x16(const uint4& v, uint4& lo, uint4& hi) {
  lo = widen_e4m3x8<T>(make_uint2(v.x, v.y));
  hi = widen_e4m3x8<T>(make_uint2(v.z, v.w));
}

// The e4m3 pair in half `kHigh` of `word` times `scale` as two bf16 values (the fp8_ds_mla
// cache): the product rounds to fp32, then to bf16, within 2^-9 + 2^-23 of the exact product
// (tests/common/fp8_ds_mla.h).
template <bool kHigh>
__device__ __forceinline__ uint32_t widen_scaled_e4m3x2_of(uint32_t word, float scale) {
  const uint32_t h = widen_e4m3x2_half_of<kHigh>(word);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  uint32_t out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(f.y * scale), "f"(f.x * scale));
  return out;
}

// 8 e4m3 values (`v.x` holds the first four) times `scale` as 8 bf16 values.
__device__ __forceinline__ uint4 widen_scaled_e4m3x8(const uint2& v, float scale) {
  return make_uint4(
      widen_scaled_e4m3x2_of<false>(v.x, scale), widen_scaled_e4m3x2_of<true>(v.x, scale),
      widen_scaled_e4m3x2_of<false>(v.y, scale), widen_scaled_e4m3x2_of<true>(v.y, scale));
}

// 16 e4m3 values times `scale` as 16 bf16 values: the low 8 in `lo`, the high 8 in `hi`.
__device__ __forceinline__ void widen_scaled_e4m3x16(const uint4& v, float scale, uint4& lo,
                                                     uint4& hi) {
  lo = widen_scaled_e4m3x8(make_uint2(v.x, v.y), scale);
  hi = widen_scaled_e4m3x8(make_uint2(v.z, v.w), scale);
}

}  // namespace mla::sm90::tma
