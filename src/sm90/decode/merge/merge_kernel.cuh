// Merge kernel: N partial states (out_r, lse_r) of each (token, head) row into out and lse
// (include/mla/merge.h, docs/context-parallel.md).
//
// Grid: one thread per (row, vector of kVec values), rows = T x H in token-major order, kVec
// consecutive values of a row per thread (8: one 16-byte load per part). Per row, with
// M = max_r lse_r, w_r = exp(lse_r - M), S = sum_r w_r:
//   out = (sum_r w_r * out_r) / (S + exp(sink_h - M)),  lse = M + log(S)
// an empty row (every lse_r = -inf) gets out = 0, lse = -inf, a NaN (or +inf) lse_r a NaN row.
// Sums run in part order (bitwise identical run to run, and the cpu backend's order).
//
// One pass over the bytes: each part's vector is loaded once, kBatch parts in flight per thread;
// the lse values of a row are read by each of its threads (one 32-byte sector, from L1 after the
// first).
#pragma once

#include <cstdint>

#include "sm90/common.cuh"
#include "sm90/decode/merge/launch.h"

namespace mla::sm90::merge {

inline constexpr int kMergeThreads = 256;
// NOTE: two parts in flight and at most 64 registers (four CTAs of 256 threads per SM): at 2 parts
// of [1024, 128, 512] bf16 on an H200 the merge ran at 43% of copy bandwidth with four parts in
// flight at 80 registers (three CTAs), 55% so (docs/perf-notes.md).
inline constexpr int kBatch = 2;  // parts whose vectors are in flight at once

// kVec 16-bit values of one row: one 16-byte vector (kVec 8) or one value.
template <int kVec>
struct Packet;
template <>
struct Packet<8> {
  uint4 bits;
};
template <>
struct Packet<1> {
  uint16_t bits;
};

// The packet at `p`, streamed (read once: evict first).
template <int kVec>
__device__ __forceinline__ Packet<kVec> load_packet(const uint16_t* p) {
  if constexpr (kVec == 8) {
    return {__ldcs(reinterpret_cast<const uint4*>(p))};
  } else {
    return {__ldcs(reinterpret_cast<const unsigned short*>(p))};
  }
}

template <Elem Out>
__device__ __forceinline__ float widen(uint32_t half_bits) {
  if constexpr (Out == Elem::kBf16) {
    return __uint_as_float(half_bits << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(half_bits)));
  }
}

template <Elem Out>
__device__ __forceinline__ uint32_t narrow(float v) {
  if constexpr (Out == Elem::kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
}

// acc[k] += w * value k of the packet.
template <Elem Out, int kVec>
__device__ __forceinline__ void accumulate(const Packet<kVec>& a, float w, float* acc) {
  if constexpr (kVec == 8) {
    const uint32_t words[4] = {a.bits.x, a.bits.y, a.bits.z, a.bits.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc[2 * k] = fmaf(widen<Out>(words[k] & 0xffffu), w, acc[2 * k]);
      acc[2 * k + 1] = fmaf(widen<Out>(words[k] >> 16), w, acc[2 * k + 1]);
    }
  } else {
    acc[0] = fmaf(widen<Out>(a.bits), w, acc[0]);
  }
}

template <Elem Out, int kVec>
__device__ __forceinline__ void store_packet(void* base, int64_t offset, const float* v) {
  if constexpr (kVec == 8) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = narrow<Out>(v[2 * k]) | (narrow<Out>(v[2 * k + 1]) << 16);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + offset) =
        make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    static_cast<uint16_t*>(base)[offset] = static_cast<uint16_t>(narrow<Out>(v[0]));
  }
}

__device__ __forceinline__ float merge_sink(const MergeKernelParams& p, int h) {
  if (p.sinks == nullptr) return kNegInf;
  const int64_t i = h * p.sinks_stride;
  if (p.sinks_elem == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p.sinks)[i]);
  if (p.sinks_elem == 2) return __half2float(static_cast<const __half*>(p.sinks)[i]);
  return static_cast<const float*>(p.sinks)[i];
}

template <Elem Out, int kVec>
__global__ void __launch_bounds__(kMergeThreads, 4)
    merge_kernel(const __grid_constant__ MergeKernelParams p) {
  // ---- prologue: indices only ----
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x;
  const bool active = item < p.items;
  const int row = active ? static_cast<int>(item / p.vecs_per_row) : 0;
  const int c =
      active ? static_cast<int>(item - static_cast<int64_t>(row) * p.vecs_per_row) * kVec : 0;
  const int t = row / p.num_heads, h = row - t * p.num_heads;
  const float* lse_row = p.lse_parts + t * p.lse_part_token + h * p.lse_part_head;
  const uint16_t* part_row =
      static_cast<const uint16_t*>(p.out_parts) + t * p.part_token + h * p.part_head + c;

  pdl_wait();  // the parts come from the previous kernels (decode, exchange)
  pdl_launch_dependents();
  if (!active) return;

  // NOTE: the first kBatch parts' vectors are loaded before anything waits on the lse reads, so
  // that the two latencies overlap; an empty part's (w = 0) vector is read but never used.
  Packet<kVec> first[kBatch] = {};
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    if (j < p.num_parts) first[j] = load_packet<kVec>(part_row + j * p.part_stride);
  }
  // ---- M over the parts (NaN wins) ----
  float m = kNegInf;
  for (int r = 0; r < p.num_parts; ++r) m = fmax_nan(m, lse_row[r * p.lse_part_stride]);

  float acc[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[k] = 0.0f;
  float scale = 0.0f, lse = kNegInf;
  if (isnan(m) || m == -kNegInf) {
    scale = lse = __int_as_float(0x7fffffff);  // a NaN (or +inf) part: the row is NaN
  } else if (m != kNegInf) {
    // ---- the parts' vectors, kBatch in flight; S and acc in part order ----
    float s = 0.0f;
    for (int r0 = 0; r0 < p.num_parts; r0 += kBatch) {
      Packet<kVec> a[kBatch] = {};
      float w[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (r0 == 0) {
          a[j] = first[j];
        } else if (r0 + j < p.num_parts) {
          a[j] = load_packet<kVec>(part_row + (r0 + j) * p.part_stride);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int r = r0 + j;
        w[j] = r < p.num_parts ? expf(lse_row[r * p.lse_part_stride] - m) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (r0 + j < p.num_parts) s += w[j];
        if (w[j] != 0.0f) accumulate<Out, kVec>(a[j], w[j], acc);
      }
    }
    float denom = s;
    const float sink = merge_sink(p, h);
    if (sink != kNegInf) denom += expf(sink - m);
    scale = __fdiv_rn(1.0f, denom);
    lse = m + logf(s);
  }

  // ---- out and lse ----
  float v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = isnan(scale) ? scale : acc[k] * scale;
  const int64_t o = t * p.out_token + h * p.out_head + c;
  store_packet<Out, kVec>(p.out, o, v);
  if (p.lse != nullptr && c == 0) p.lse[t * p.lse_token + h * p.lse_head] = lse;
}

template <Elem Out>
cudaError_t launch_merge(const MergeKernelParams& params, int vec, cudaStream_t stream, bool pdl) {
  const int64_t blocks = (params.items + kMergeThreads - 1) / kMergeThreads;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks > 0 ? blocks : 1)), block(kMergeThreads);
  if (vec == kMergeWideVec) {
    return launch(&merge_kernel<Out, kMergeWideVec>, grid, block, 0, stream, pdl, params);
  }
  return launch(&merge_kernel<Out, 1>, grid, block, 0, stream, pdl, params);
}

}  // namespace mla::sm90::merge
