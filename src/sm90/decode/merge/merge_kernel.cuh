// Merge kernel: N partial states (out_r, lse_r) of each (token, head) row into out and lse
// (include/mla/merge.h, docs/context-parallel.md).
//
// Per row, with M = max_r lse_r, w_r = exp(lse_r - M), S = sum_r w_r:
//   out = (sum_r w_r * out_r) / (S + exp(sink_h - M)),  lse = M + log(S)
// an empty row (every lse_r = -inf) gets out = 0, lse = -inf, a NaN (or +inf) lse_r a NaN row.
// Sums run in part order (bitwise identical run to run, and the cpu backend's order).
//
// Grid: rows = T x H in token-major order, cut into vectors of kVec values (8: one 16-byte load
// per part; 1 where L, a stride or an address is not a whole number of 16 bytes). A row's V
// vectors go to C = ceil(V / kVecsPerThread) thread columns: column c takes vectors c, c + C,
// c + 2C, c + 3C (those below V), so each load of a warp reads runs of consecutive vectors of one
// or more rows (L 512: C 16, a warp reads two rows' 256-byte runs per load). Block (chunk of
// columns, rows) of at most kMergeThreads threads (merge_shape); grid x over groups of block rows,
// y (and z past 65535) over a row's column chunks, usually one.
//
// One pass over the bytes: each part's vector is loaded once, the first kBatch parts' vectors all
// in flight before anything waits; the lse values of a row are read by each of its threads (one
// 32-byte sector, from L1 after the first).
#pragma once

#include <cstdint>

#include "sm90/common.cuh"
#include "sm90/decode/merge/launch.h"

namespace mla::sm90::merge {

inline constexpr int kMergeThreads = 256;
// NOTE: bytes in flight per SM set this kernel's speed (docs/perf-notes.md, the merge). With one
// vector per thread (32 bytes in flight per thread at 2 parts, 32 KB per SM) the merge ran at 55%
// of copy bandwidth on an H200: each thread also paid a 64-bit division, two dependent lse
// reads, a CTA launch and a DRAM round trip for 48 bytes moved. Reads at 80% of copy bandwidth
// (~2.3 TB/s) times ~1 us of loaded latency need ~17 KB per SM in flight at every moment on 132
// SMs; four vectors per thread put 128 bytes per thread (128 KB per SM at four CTAs) in flight and
// amortize the rest over four times the bytes. Eight would hold 32 more registers of vectors (two
// CTAs: the same bytes in flight, half the warps to hide the arithmetic).
inline constexpr int kVecsPerThread = 4;  // vectors of one row per thread
inline constexpr int kBatch = 2;          // parts whose vectors are in flight at once

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
    // NOTE: indexed in whole vectors (offset is a multiple of 8): through a uint16_t pointer the
    // compiler split the stores of several vectors per thread into 4-byte stores.
    static_cast<uint4*>(base)[offset >> 3] = make_uint4(w[0], w[1], w[2], w[3]);
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

// Thread columns of a row of `vecs_per_row` vectors (>= 1).
__host__ __device__ __forceinline__ int merge_columns(int vecs_per_row) {
  return (vecs_per_row - 1) / kVecsPerThread + 1;
}

// A thread's vectors of one part: vector u holds vector c + u * C of the row (values
// (c + u * C) * kVec onwards), present where has[u].
template <int kVec>
using Vectors = Packet<kVec>[kVecsPerThread];
using Present = bool[kVecsPerThread];

// The thread's vectors of one part at `src` (vector u at src + u * step), streamed.
template <int kVec>
__device__ __forceinline__ void load_vectors(Vectors<kVec>& a, const uint16_t* src, int64_t step,
                                             const Present& has) {
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    if (has[u]) a[u] = load_packet<kVec>(src + u * step);
  }
}

// acc += w_j * vector u of part j over the batch's parts, in part order; a part of weight 0 (empty,
// or past the last part) is skipped.
template <Elem Out, int kVec>
__device__ __forceinline__ void accumulate_batch(const Vectors<kVec> (&a)[kBatch], int u,
                                                 const float (&w)[kBatch], float* acc) {
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    if (w[j] != 0.0f) accumulate<Out, kVec>(a[j][u], w[j], acc);
  }
}

// out = acc * scale at `offset`; a NaN scale (a NaN row) stores NaN.
template <Elem Out, int kVec>
__device__ __forceinline__ void store_scaled(void* out, int64_t offset, const float* acc,
                                             float scale) {
  float v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = isnan(scale) ? scale : acc[k] * scale;
  store_packet<Out, kVec>(out, offset, v);
}

// kFewParts: num_parts <= kBatch, every part's vectors in flight at once and each vector's sum
// stored as soon as it is formed. Otherwise any num_parts, kBatch parts at a time, the sums of all
// of a thread's vectors held across the batches.
template <Elem Out, int kVec, bool kFewParts>
// NOTE: the few-parts kernel (the common case: two ranks) holds its 32 registers of vectors but no
// sums across batches, so four CTAs of 256 threads fit (at most 64 registers): 128 bytes in
// flight per thread, 128 KB per SM. The other holds 32 registers of sums beside them: two CTAs.
__global__ void __launch_bounds__(kMergeThreads, kFewParts ? 4 : 2)
    merge_kernel(const __grid_constant__ MergeKernelParams p) {
  // ---- prologue: indices only (32-bit: rows and vectors per row are within int32) ----
  const int cols = merge_columns(p.vecs_per_row);
  const unsigned row = blockIdx.x * blockDim.y + threadIdx.y;  // < 2^31 + 256
  // Column chunk blockIdx.y + gridDim.y * blockIdx.z (z > 0 only past 65535 chunks).
  const unsigned c = (blockIdx.z * gridDim.y + blockIdx.y) * blockDim.x + threadIdx.x;  // < 2^30
  const bool active = row < static_cast<unsigned>(p.rows) && c < static_cast<unsigned>(cols);
  const unsigned heads = static_cast<unsigned>(p.num_heads);
  const int t = active ? static_cast<int>(row / heads) : 0;
  const int h = active ? static_cast<int>(row % heads) : 0;
  const int n = kFewParts ? min(p.num_parts, kBatch) : p.num_parts;
  const float* lse_row = p.lse_parts + t * p.lse_part_token + h * p.lse_part_head;
  const uint16_t* src = static_cast<const uint16_t*>(p.out_parts) + t * p.part_token +
                        h * p.part_head + static_cast<int64_t>(c) * kVec;
  const int64_t o = t * p.out_token + h * p.out_head + static_cast<int64_t>(c) * kVec;
  const int64_t step = static_cast<int64_t>(cols) * kVec;  // between a thread's vectors
  bool has[kVecsPerThread];  // c + u * cols < vecs_per_row (below 2^32: no wrap)
#pragma unroll
  for (int u = 0; u < kVecsPerThread; ++u) {
    has[u] = c + u * static_cast<unsigned>(cols) < static_cast<unsigned>(p.vecs_per_row);
  }

  pdl_wait();  // the parts come from the previous kernels (decode, exchange)
  pdl_launch_dependents();
  if (!active) return;

  // NOTE: the lse values of the first kBatch parts, then all their vectors, then the sink are
  // loaded before anything waits: the weights are formed while the vectors are in flight. An
  // empty part's (w = 0) vectors are read but never used; a vector not loaded (past the row or
  // the parts) is never read.
  float l[kBatch];  // lse of the parts in a
#pragma unroll
  for (int j = 0; j < kBatch; ++j) l[j] = j < n ? lse_row[j * p.lse_part_stride] : kNegInf;
  Vectors<kVec> a[kBatch];
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    if (j < n) load_vectors<kVec>(a[j], src + j * p.part_stride, step, has);
  }
  const float sink = merge_sink(p, h);

  // ---- M over the parts (NaN wins) ----
  float m = kNegInf;
#pragma unroll
  for (int j = 0; j < kBatch; ++j) m = fmax_nan(m, l[j]);
  for (int r = kBatch; r < n; ++r) m = fmax_nan(m, lse_row[r * p.lse_part_stride]);

  // ---- weights w_r = exp(lse_r - M) (all 0 in an empty or NaN row), S, scale, lse ----
  bool live = false;
  float w[kBatch] = {};  // of the parts in a
  float scale = 0.0f, lse = kNegInf;
  if (isnan(m) || m == kInf) {
    scale = lse = __int_as_float(0x7fffffff);  // a NaN (or +inf) part: the row is NaN
  } else if (m != kNegInf) {
    live = true;
    float s = 0.0f;  // in part order
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (j < n) {
        w[j] = expf(l[j] - m);
        s += w[j];
      }
    }
    for (int r = kBatch; r < n; ++r) s += expf(lse_row[r * p.lse_part_stride] - m);
    float denom = s;
    if (sink != kNegInf) denom += expf(sink - m);
    scale = __fdiv_rn(1.0f, denom);
    lse = m + logf(s);
  }

  // ---- out = scale * sum_r w_r out_r, each value's sum in part order ----
  if constexpr (kFewParts) {
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      if (!has[u]) continue;
      float acc[kVec] = {};
      accumulate_batch<Out, kVec>(a, u, w, acc);
      store_scaled<Out, kVec>(p.out, o + u * step, acc, scale);
    }
  } else {
    float acc[kVecsPerThread][kVec] = {};
    for (int r0 = 0; r0 < n; r0 += kBatch) {
      if (r0 > 0) {  // the next batch (the first is in a)
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          w[j] = 0.0f;
          if (r0 + j < n) {
            load_vectors<kVec>(a[j], src + (r0 + j) * p.part_stride, step, has);
            if (live) w[j] = expf(lse_row[(r0 + j) * p.lse_part_stride] - m);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kVecsPerThread; ++u) {
        if (has[u]) accumulate_batch<Out, kVec>(a, u, w, acc[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      if (has[u]) store_scaled<Out, kVec>(p.out, o + u * step, acc[u], scale);
    }
  }
  if (p.lse != nullptr && c == 0) p.lse[t * p.lse_token + h * p.lse_head] = lse;
}

// Block and grid of a merge of `rows` rows of `vecs_per_row` vectors: a row's thread columns in
// the fewest chunks of at most kMergeThreads, as many rows per block as fit beside a chunk.
inline void merge_shape(int rows, int vecs_per_row, dim3& grid, dim3& block) {
  constexpr int kMaxGridY = 65535;
  const int cols = merge_columns(vecs_per_row);
  const int chunks = (cols - 1) / kMergeThreads + 1;
  const int chunk_cols = (cols - 1) / chunks + 1;
  const int block_rows = kMergeThreads / chunk_cols;
  const int64_t row_blocks = (static_cast<int64_t>(rows) + block_rows - 1) / block_rows;
  const int chunks_y = chunks < kMaxGridY ? chunks : kMaxGridY;
  block = dim3(static_cast<unsigned>(chunk_cols), static_cast<unsigned>(block_rows));
  grid = dim3(static_cast<unsigned>(row_blocks > 0 ? row_blocks : 1),
              static_cast<unsigned>(chunks_y), static_cast<unsigned>((chunks - 1) / chunks_y + 1));
}

template <Elem Out>
cudaError_t launch_merge(const MergeKernelParams& params, int vec, cudaStream_t stream, bool pdl) {
  if (params.rows < 0 || params.vecs_per_row < 1) return cudaErrorInvalidValue;
  dim3 grid, block;
  merge_shape(params.rows, params.vecs_per_row, grid, block);
  const bool few = params.num_parts <= kBatch;
  if (vec == kMergeWideVec) {
    return few ? launch(&merge_kernel<Out, kMergeWideVec, true>, grid, block, 0, stream, pdl,
                        params)
               : launch(&merge_kernel<Out, kMergeWideVec, false>, grid, block, 0, stream, pdl,
                        params);
  }
  return few ? launch(&merge_kernel<Out, 1, true>, grid, block, 0, stream, pdl, params)
             : launch(&merge_kernel<Out, 1, false>, grid, block, 0, stream, pdl, params);
}

}  // namespace mla::sm90::merge
