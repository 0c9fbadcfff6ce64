// Combine kernels: merge the split partials of each (token, head) row into out and lse. Two
// kernels: the row kernel (combine_rows_kernel, below: one warp per row) where the call's rows have
// few splits, in one pass (combine_rows_one_batch_kernel) where they have at most three in the
// uniform layout, and the item kernel (combine_kernel) otherwise; launch_combine picks.
//
// The item kernel.
// Work: items (token t, R consecutive heads h0 .. h0 + R - 1, column chunk of 512 / chunks columns)
// over every token, or with the balanced schedule over the tokens the plan kernel listed (the
// others have one segment, whose out and lse the seesaw kernel wrote; a CTA stops at the first
// record past the list). The grid is sized by occupancy, not by the items: each CTA takes items
// blockIdx.x, blockIdx.x + gridDim.x, ... A row's splits are at [num_splits, T, H] or, with the
// balanced schedule, where the token's schedule::Token says; the R rows of an item are consecutive
// there. The CTA's threads form split groups of (128 / chunks) threads, 4 columns (one 8-byte
// vector of the 16-bit o) of each of the item's rows each; group g takes splits g, g + G, g + 2G,
// ... (G = groups per CTA). Rows per item (R > 1 only with one group) put more vectors in flight
// where a row has few splits. With M = max over splits of the split max m_s (splits without keys
// excluded), z_s the split's sum and o_s = bmm2_scale * acc_s / z_s its 16-bit partial (params.h):
//   w_s = z_s * exp(m_s - M),  Z = sum_s w_s,  acc = sum_s w_s * o_s
//   out = acc / (Z + exp(sink_h - M)),  lse = M + log(Z)
// and an empty row (no split saw a key) gets out = 0, lse = -inf.
//
// Order of the sums (fixed by the shapes, so results are bitwise identical run to run): Z over
// warp r's lanes for row r (split s on lane s % 32, then a butterfly); acc per group in split
// order, then the groups in order 0 .. G-1.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>

#include "sm90/common.cuh"
#include "sm90/decode/combine/launch.h"
#include "sm90/decode/combine/traits.h"
#include "sm90/decode/output.cuh"

namespace mla::sm90::combine {

// Four 16-bit values of type Out (the first in the low half of v.x) as floats.
template <Elem Out>
__device__ __forceinline__ float4 widen(uint2 v) {
  if constexpr (Out == Elem::kBf16) {
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                       __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
  } else {
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
}

template <Elem Out, int R>
// NOTE: two CTAs of the most threads per SM cap the registers at 64: the kernel is latency-bound,
// and resident CTAs are what hides it. Rows per item (one group: at most 128 threads) hold R
// vectors per split; eight CTAs of 128 threads per SM leave them 64 registers (no spills), so
// that B32 H128's 1,024 four-row items fit one wave of 1,056 CTAs (seven at 72 registers: 924).
__global__ void __launch_bounds__(R == 1 ? kCombineMaxThreads : kCombineL / 4, R == 1 ? 2 : 8)
    combine_kernel(const __grid_constant__ DecodeKernelParams p, int chunks) {
  constexpr int kL = kCombineL;
  constexpr int kSplitsPerLane = kMaxSplits / 32;
  constexpr int kPerBatch = kCombineBatch / R;  // splits per batch of loads, R vectors each
  static_assert(kMaxSplits % 32 == 0, "warp r holds kMaxSplits / 32 splits per lane");
  static_assert(R >= 1 && kCombineBatch % R == 0, "a batch holds whole splits");

  __shared__ float weight[R][kMaxSplits];  // w_s per row, 0 for an empty split
  // Each thread's group sum, for the final merge (one row per item where there are groups).
  __shared__ float4 part[R == 1 ? kCombineMaxThreads : 1];
  __shared__ float row_max[R], row_z[R];

  // ---- prologue: indices only ----
  const int group_threads = (kL / 4) / chunks;
  const int groups = blockDim.x / group_threads;
  const int g = threadIdx.x / group_threads;
  const int lane_in_group = threadIdx.x - g * group_threads;
  const int head_groups = (p.num_heads + R - 1) / R;
  const int per_token = head_groups * chunks;
  // NOTE: 32-bit item indices: the host launches no combine of 2^30 items or more.
  const bool listed = p.sched_tokens != nullptr;
  const int items = p.num_tokens * per_token;

  // One item: its (token, first head, columns, rows) and where its rows are (row r of split s at
  // row + r + s * stride); splits < 0 past the combine's list (so is every later item of the CTA).
  struct Item {
    int t, h, chunk, c, rows, num_splits;
    int64_t stride, row;
  };
  auto resolve = [&](int item) {
    Item it;
    const int token_item = item / per_token;
    const int rest = item - token_item * per_token;
    it.h = (rest % head_groups) * R;
    it.rows = min(R, p.num_heads - it.h);
    it.chunk = rest / head_groups;
    it.c = it.chunk * (kL / chunks) + 4 * lane_in_group;
    if (listed) {
      const schedule::Token st = p.sched_tokens[token_item];
      it.t = st.token;
      it.num_splits = st.splits;
      it.stride = st.stride;
      it.row = st.base_row + it.h;
    } else {
      it.t = token_item;
      it.num_splits = p.num_splits;
      it.stride = static_cast<int64_t>(p.num_tokens) * p.num_heads;
      it.row = static_cast<int64_t>(it.t) * p.num_heads + it.h;
    }
    return it;
  };
  // NOTE: the first item is resolved before the wait, so that the partials' loads follow it at
  // once; its record is safe to read: the plan kernel finished before the decode grid passed its
  // own wait, which is before this grid could launch.
  int item = blockIdx.x;
  Item it{};
  if (item < items) it = resolve(item);

  pdl_wait();  // the partials come from the decode grid
  pdl_launch_dependents();

  for (; item < items; item += gridDim.x) {
    if (item != static_cast<int>(blockIdx.x)) it = resolve(item);
    if (it.num_splits < 0) break;
    const int t = it.t, h = it.h, chunk = it.chunk, c = it.c, rows = it.rows;
    const int num_splits = it.num_splits;
    const int64_t stride = it.stride, row = it.row;
    const uint16_t* o_base = static_cast<const uint16_t*>(p.partial_o) + row * kL + c;

    // ---- the group's first batch of o: in flight while warps 0 .. R-1 find the weights ----
    uint2 a[kCombineBatch];
    auto load_batch = [&](int k0) {
#pragma unroll
      for (int j = 0; j < kPerBatch; ++j) {
        const int s = g + (k0 + j) * groups;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (s < num_splits && r < rows && c < p.kv_lora_rank) {
            a[j * R + r] = __ldcs(reinterpret_cast<const uint2*>(o_base + (s * stride + r) * kL));
          }
        }
      }
    };
    load_batch(0);
    // The CTA's next item's record goes to L1 while this item's loads are in flight, so that the
    // next item's loads follow its start after an L1 hit, not an L2 round trip (a prefetch: no
    // registers held across the item).
    if (const int next = item + static_cast<int>(gridDim.x); listed && next < items) {
      if (threadIdx.x == 0) prefetch_l1(&p.sched_tokens[next / per_token]);
    }

    // ---- warp r: all split maxima of row r at once, M, the weights and Z ----
    if (const int r = threadIdx.x / 32; r < rows) {
      const int lane = threadIdx.x & 31;
      const int64_t row_r = row + r;
      float m_s[kSplitsPerLane], sum_s[kSplitsPerLane];
      float m = kNegInf;
#pragma unroll
      for (int j = 0; j < kSplitsPerLane; ++j) {
        const int s = lane + 32 * j;
        m_s[j] = kNegInf;
        sum_s[j] = 0.0f;
        if (32 * j < num_splits) {  // NOTE: a warp-uniform bound: no loads past the last split
          m_s[j] = s < num_splits ? __ldcs(&p.partial_max[s * stride + row_r]) : kNegInf;
          sum_s[j] = s < num_splits ? __ldcs(&p.partial_sum[s * stride + row_r]) : 0.0f;
        }
        m = fmaxf(m, m_s[j]);
      }
#pragma unroll
      for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
      float z = 0.0f;
#pragma unroll
      for (int j = 0; j < kSplitsPerLane; ++j) {
        // NOTE: a split without a finite score has sum 0 (no key: weight 0) or NaN (NaN scores:
        // the row turns NaN, contract section 1), so sum * 0 is its weight.
        const float w = m_s[j] == kNegInf ? sum_s[j] * 0.0f : sum_s[j] * expf(m_s[j] - m);
        z += w;
        if (lane + 32 * j < num_splits) weight[r][lane + 32 * j] = w;
      }
#pragma unroll
      for (int d = 16; d > 0; d /= 2) z += __shfl_xor_sync(0xffffffffu, z, d);
      if (lane == 0) {
        row_max[r] = m;
        row_z[r] = z;
      }
    }
    __syncthreads();

    // ---- the group's splits, kPerBatch x R vectors in flight at a time ----
    float4 acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int k0 = 0; g + k0 * groups < num_splits; k0 += kPerBatch) {
      if (k0 > 0) load_batch(k0);
#pragma unroll
      for (int j = 0; j < kPerBatch; ++j) {
        const int s = g + (k0 + j) * groups;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (s < num_splits && r < rows) {
            const float w = weight[r][s];
            // NOTE: an empty split's o holds nothing (possibly garbage): never read it.
            if (w != 0.0f) {
              const float4 v = widen<Out>(a[j * R + r]);
              acc[r].x = fmaf(v.x, w, acc[r].x);
              acc[r].y = fmaf(v.y, w, acc[r].y);
              acc[r].z = fmaf(v.z, w, acc[r].z);
              acc[r].w = fmaf(v.w, w, acc[r].w);
            }
          }
        }
      }
    }
    if constexpr (R == 1) {
      if (groups > 1) {
        part[threadIdx.x] = acc[0];
        __syncthreads();
        if (g == 0) {
          for (int k = 1; k < groups; ++k) {
            const float4 b = part[k * group_threads + lane_in_group];
            acc[0].x += b.x;
            acc[0].y += b.y;
            acc[0].z += b.z;
            acc[0].w += b.w;
          }
        }
      }
    }

    // ---- out and lse: group 0 ----
    if (g == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          // NOTE: bmm2_scale is in o already; a non-finite one still turns the row NaN.
          const float bmm2_ok = isfinite(bmm2_scale_of(p)) ? 1.0f : __int_as_float(0x7fffffff);
          const RowOutput ro = row_output(bmm2_ok, sink_of(p, h + r), row_max[r], row_z[r]);
          float4 v = acc[r];
          if (ro.scale == 0.0f) v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // no key: acc is garbage
          const int64_t o = out_offset(p, t, h + r) + c;
          if (c < p.kv_lora_rank) {  // out rows are L wide, the partial rows 512
            // NOTE: one 8-byte store where out allows it (p.out_vec8): each 32-byte sector of out
            // written once, whole, rather than in four 2-byte parts (c is a multiple of 4 values).
            store_out4(p, o,
                       make_uint2(pack_out(p, v.x * ro.scale, v.y * ro.scale),
                                  pack_out(p, v.z * ro.scale, v.w * ro.scale)));
          }
          if (p.lse != nullptr && threadIdx.x == 0 && chunk == 0) {
            p.lse[lse_offset(p, t, h + r)] = ro.lse;
          }
        }
      }
    }
    __syncthreads();  // weight, part, row_max and row_z are the next item's
  }
}

// Row kernel: one warp per row (token, head), for rows of few splits. Lane l holds columns 8 l ..
// 8 l + 7 and 256 + 8 l .. 256 + 8 l + 7 of the row (16-byte vectors of the 16-bit o; the second
// only where L is 512), so a row's partial is read and its out written in whole 32-byte sectors,
// and nothing is shared between the warps: no CTA barrier, and a row's index math is done once
// per warp, not once per thread and row. The same formulas as combine_kernel: M over the splits'
// maxima (split s on lane s % 32, then a butterfly), w_s and Z (lanes in split order, then a
// butterfly), acc in split order; kRowsBatch splits' vectors in flight per lane before the first
// is used. Rows at blockIdx.x * kRowsWarps + warp, then + gridDim.x * kRowsWarps, ...; with the
// balanced schedule, a warp stops at the first token record past the list.
inline constexpr int kRowsWarps = 8;
inline constexpr int kRowsBatch = 3;
// NOTE: 64 registers (four CTAs of 256 threads per SM): B32 H128's 4,096 rows fit one wave of
// 528 CTAs.
template <Elem Out>
__global__ void __launch_bounds__(kRowsWarps * 32, 4)
    combine_rows_kernel(const __grid_constant__ DecodeKernelParams p) {
  constexpr int kL = kCombineL;
  static_assert(kL == 512, "two 8-column vectors per lane: 512 columns");
  // Per warp: the row's split maxima, then their weights w_s (0 for an empty split); the sums.
  __shared__ float weight[kRowsWarps][kMaxSplits];
  __shared__ float split_sum[kRowsWarps][kMaxSplits];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int c0 = 8 * lane;
  const bool has0 = c0 < p.kv_lora_rank, has1 = c0 + 256 < p.kv_lora_rank;
  const bool listed = p.sched_tokens != nullptr;
  const int rows_total = p.num_tokens * p.num_heads;  // NOTE: below 2^30 (the host's check)
  const int step = static_cast<int>(gridDim.x) * kRowsWarps;

  struct Row {
    int t, h, num_splits;
    int64_t stride, row;
  };
  auto resolve = [&](int r) {
    Row it;
    const int token_item = r / p.num_heads;
    it.h = r - token_item * p.num_heads;
    if (listed) {
      const schedule::Token st = p.sched_tokens[token_item];
      it.t = st.token;
      it.num_splits = st.splits;
      it.stride = st.stride;
      it.row = static_cast<int64_t>(st.base_row) + it.h;
    } else {
      it.t = token_item;
      it.num_splits = p.num_splits;
      it.stride = static_cast<int64_t>(p.num_tokens) * p.num_heads;
      it.row = r;
    }
    return it;
  };
  // NOTE: the first row's record is read before the wait, as in combine_kernel.
  int r = blockIdx.x * kRowsWarps + warp;
  Row it{};
  if (r < rows_total) it = resolve(r);

  pdl_wait();  // the partials come from the decode grid
  pdl_launch_dependents();

  for (; r < rows_total; r += step) {
    if (r != static_cast<int>(blockIdx.x) * kRowsWarps + warp) it = resolve(r);
    if (it.num_splits < 0) break;  // past the list: so is every later row of the warp
    const int num_splits = it.num_splits;
    const uint16_t* o_base = static_cast<const uint16_t*>(p.partial_o) + it.row * kL + c0;
    const int64_t split_step = it.stride * kL;

    uint4 a[kRowsBatch][2];
    auto load_batch = [&](int s0) {
#pragma unroll
      for (int j = 0; j < kRowsBatch; ++j) {
        const int s = s0 + j;
        if (s < num_splits) {
          const uint16_t* src = o_base + s * split_step;
          if (has0) a[j][0] = __ldcs(reinterpret_cast<const uint4*>(src));
          if (has1) a[j][1] = __ldcs(reinterpret_cast<const uint4*>(src + 256));
        }
      }
    };
    load_batch(0);

    // ---- every split's max and sum at once (split s on lane s % 32, kept in shared memory by
    // the lane that loaded it), M, the weights and Z ----
    float m = kNegInf;
    for (int s = lane; s - lane < num_splits; s += 32) {  // NOTE: warp-uniform trip count
      if (s < num_splits) {
        const int64_t at = s * it.stride + it.row;
        const float ms = __ldcs(&p.partial_max[at]);
        weight[warp][s] = ms;
        split_sum[warp][s] = __ldcs(&p.partial_sum[at]);
        m = fmaxf(m, ms);
      }
    }
#pragma unroll
    for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    float z = 0.0f;
    for (int s = lane; s < num_splits; s += 32) {
      // NOTE: as in combine_kernel: sum * 0 is the weight of a split without a finite score.
      const float ms = weight[warp][s], sum = split_sum[warp][s];
      const float w = ms == kNegInf ? sum * 0.0f : sum * expf(ms - m);
      z += w;
      weight[warp][s] = w;
    }
#pragma unroll
    for (int d = 16; d > 0; d /= 2) z += __shfl_xor_sync(0xffffffffu, z, d);
    __syncwarp();  // the weights, for every lane

    // ---- acc in split order, kRowsBatch splits' vectors in flight ----
    float acc[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) acc[k] = 0.0f;
    for (int s0 = 0; s0 < num_splits; s0 += kRowsBatch) {
      if (s0 > 0) load_batch(s0);
#pragma unroll
      for (int j = 0; j < kRowsBatch; ++j) {
        const int s = s0 + j;
        if (s < num_splits) {
          const float w = weight[warp][s];
          // NOTE: an empty split's o holds nothing (possibly garbage): never read it.
          if (w != 0.0f) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const float4 lo = widen<Out>(make_uint2(a[j][half].x, a[j][half].y));
              const float4 hi = widen<Out>(make_uint2(a[j][half].z, a[j][half].w));
              float* x = acc + 8 * half;
              x[0] = fmaf(lo.x, w, x[0]);
              x[1] = fmaf(lo.y, w, x[1]);
              x[2] = fmaf(lo.z, w, x[2]);
              x[3] = fmaf(lo.w, w, x[3]);
              x[4] = fmaf(hi.x, w, x[4]);
              x[5] = fmaf(hi.y, w, x[5]);
              x[6] = fmaf(hi.z, w, x[6]);
              x[7] = fmaf(hi.w, w, x[7]);
            }
          }
        }
      }
    }
    __syncwarp();  // weight is the warp's next row's

    // ---- out and lse ----
    // NOTE: bmm2_scale is in o already; a non-finite one still turns the row NaN.
    const float bmm2_ok = isfinite(bmm2_scale_of(p)) ? 1.0f : __int_as_float(0x7fffffff);
    const RowOutput ro = row_output(bmm2_ok, sink_of(p, it.h), m, z);
    const int64_t o = out_offset(p, it.t, it.h) + c0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (half == 0 ? !has0 : !has1) continue;
      const float* x = acc + 8 * half;
      uint4 words;
      if (ro.scale == 0.0f) {  // no key: acc is garbage
        words = make_uint4(0u, 0u, 0u, 0u);
      } else {
        words = make_uint4(pack_out(p, x[0] * ro.scale, x[1] * ro.scale),
                           pack_out(p, x[2] * ro.scale, x[3] * ro.scale),
                           pack_out(p, x[4] * ro.scale, x[5] * ro.scale),
                           pack_out(p, x[6] * ro.scale, x[7] * ro.scale));
      }
      const int64_t oh = o + 256 * half;
      if (p.out_vec16) {
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + oh) = words;
      } else {  // two 8-byte stores where out allows them, else 2-byte ones
        store_out4(p, oh, make_uint2(words.x, words.y));
        store_out4(p, oh + 4, make_uint2(words.z, words.w));
      }
    }
    if (p.lse != nullptr && lane == 0) p.lse[lse_offset(p, it.t, it.h)] = ro.lse;
  }
}

// One-batch row kernel: combine_rows_kernel's work for a call in the uniform layout (every row
// has num_splits <= kRowsBatch splits at [num_splits, T, H], no schedule list), in one pass: the
// row's vectors of every split in flight at once, split j's max and sum on lane j, broadcast by
// shuffles so that every lane forms M, the weights and Z itself (no shared memory, no warp
// barrier). The same values as combine_rows_kernel: M is exact in any order, the weights are the
// same formula, and Z adds lanes 0..2 in its butterfly's order, (w0 + w2) + w1 (a lane past
// num_splits holds max -inf and sum 0: weight 0). Its own kernel, not a branch of the row
// kernel: the branch, even where it never ran, made the row kernel's balanced-schedule calls 1 to
// 3% slower (docs/perf-notes.md, Change 142).
// NOTE: the accumulation and the out stores below are the row kernel's, written out again:
// shared helpers changed the row kernel's SASS (and a 4-byte spill), and a change of its code
// alone moved the balanced schedule's calls by 1 to 3% (Change 142), so it stays as measured.
template <Elem Out>
__global__ void __launch_bounds__(kRowsWarps * 32, 4)
    combine_rows_one_batch_kernel(const __grid_constant__ DecodeKernelParams p) {
  constexpr int kL = kCombineL;
  static_assert(kL == 512, "two 8-column vectors per lane: 512 columns");
  static_assert(kRowsBatch == 3, "Z's order below is the butterfly's over three lanes");
  const int lane = threadIdx.x & 31;
  const int c0 = 8 * lane;
  const bool has0 = c0 < p.kv_lora_rank, has1 = c0 + 256 < p.kv_lora_rank;
  const int rows_total = p.num_tokens * p.num_heads;  // NOTE: below 2^30 (the host's check)
  const int num_splits = p.num_splits;                // NOTE: at most kRowsBatch (the host's)
  const int64_t split_rows = rows_total;
  const int step = static_cast<int>(gridDim.x) * kRowsWarps;
  // NOTE: bmm2_scale is in o already; a non-finite one still turns every row NaN. An input, read
  // before the wait: the decode grid passed its own wait before it let this grid start.
  const float bmm2_ok = isfinite(bmm2_scale_of(p)) ? 1.0f : __int_as_float(0x7fffffff);

  pdl_wait();  // the partials come from the decode grid
  pdl_launch_dependents();

  for (int r = blockIdx.x * kRowsWarps + (threadIdx.x >> 5); r < rows_total; r += step) {
    const int t = r / p.num_heads;
    const int h = r - t * p.num_heads;
    const uint16_t* o_base = static_cast<const uint16_t*>(p.partial_o) + int64_t{r} * kL + c0;
    uint4 a[kRowsBatch][2];
#pragma unroll
    for (int j = 0; j < kRowsBatch; ++j) {
      if (j < num_splits) {
        const uint16_t* src = o_base + j * split_rows * kL;
        if (has0) a[j][0] = __ldcs(reinterpret_cast<const uint4*>(src));
        if (has1) a[j][1] = __ldcs(reinterpret_cast<const uint4*>(src + 256));
      }
    }
    float ms = kNegInf, ss = 0.0f;
    if (lane < num_splits) {
      const int64_t at = lane * split_rows + r;
      ms = __ldcs(&p.partial_max[at]);
      ss = __ldcs(&p.partial_sum[at]);
    }
    const float sink = sink_of(p, h);

    float m = kNegInf, mj[kRowsBatch], w[kRowsBatch];
#pragma unroll
    for (int j = 0; j < kRowsBatch; ++j) {
      mj[j] = __shfl_sync(0xffffffffu, ms, j);
      w[j] = __shfl_sync(0xffffffffu, ss, j);
      m = fmaxf(m, mj[j]);
    }
    // NOTE: as in combine_kernel: sum * 0 is the weight of a split without a finite score.
#pragma unroll
    for (int j = 0; j < kRowsBatch; ++j)
      w[j] = mj[j] == kNegInf ? w[j] * 0.0f : w[j] * expf(mj[j] - m);
    const float z = (w[0] + w[2]) + w[1];

    float acc[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) acc[k] = 0.0f;
#pragma unroll
    for (int j = 0; j < kRowsBatch; ++j) {
      // NOTE: an empty split's o holds nothing (possibly garbage): never read it.
      if (w[j] == 0.0f) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float4 lo = widen<Out>(make_uint2(a[j][half].x, a[j][half].y));
        const float4 hi = widen<Out>(make_uint2(a[j][half].z, a[j][half].w));
        float* x = acc + 8 * half;
        x[0] = fmaf(lo.x, w[j], x[0]);
        x[1] = fmaf(lo.y, w[j], x[1]);
        x[2] = fmaf(lo.z, w[j], x[2]);
        x[3] = fmaf(lo.w, w[j], x[3]);
        x[4] = fmaf(hi.x, w[j], x[4]);
        x[5] = fmaf(hi.y, w[j], x[5]);
        x[6] = fmaf(hi.z, w[j], x[6]);
        x[7] = fmaf(hi.w, w[j], x[7]);
      }
    }

    const RowOutput ro = row_output(bmm2_ok, sink, m, z);
    const int64_t o = out_offset(p, t, h) + c0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (half == 0 ? !has0 : !has1) continue;
      const float* x = acc + 8 * half;
      uint4 words;
      if (ro.scale == 0.0f) {  // no key: acc is garbage
        words = make_uint4(0u, 0u, 0u, 0u);
      } else {
        words = make_uint4(pack_out(p, x[0] * ro.scale, x[1] * ro.scale),
                           pack_out(p, x[2] * ro.scale, x[3] * ro.scale),
                           pack_out(p, x[4] * ro.scale, x[5] * ro.scale),
                           pack_out(p, x[6] * ro.scale, x[7] * ro.scale));
      }
      const int64_t oh = o + 256 * half;
      if (p.out_vec16) {
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + oh) = words;
      } else {  // two 8-byte stores where out allows them, else 2-byte ones
        store_out4(p, oh, make_uint2(words.x, words.y));
        store_out4(p, oh + 4, make_uint2(words.z, words.w));
      }
    }
    if (p.lse != nullptr && lane == 0) p.lse[lse_offset(p, t, h)] = ro.lse;
  }
}

// The instantiation of combine_kernel<Out, R> for R = rows_per_item (1, 2 or 4).
template <Elem Out>
auto combine_kernel_for(int rows_per_item) {
  return rows_per_item == 1   ? &combine_kernel<Out, 1>
         : rows_per_item == 2 ? &combine_kernel<Out, 2>
                              : &combine_kernel<Out, 4>;
}

// Devices whose residencies are cached; a device past them asks the occupancy API every call.
inline constexpr int kMaxDevices = 64;
using ResidencyCache = std::array<std::atomic<int>, kMaxDevices>;  // per device; 0: not read yet

// Resident CTAs per SM (at least 1) of `kernel` at `threads` threads on the current device
// (occupancy API, cached per device in `cache`: each device's limits are its own).
template <typename Kernel>
cudaError_t cached_residency(ResidencyCache& cache, Kernel kernel, int threads, int& per_sm) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::atomic<int>* cached = device < kMaxDevices ? &cache[device] : nullptr;
  per_sm = cached != nullptr ? cached->load(std::memory_order_relaxed) : 0;
  if (per_sm != 0) return cudaSuccess;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
  if (err != cudaSuccess) return err;
  per_sm = std::max(per_sm, 1);
  if (cached != nullptr) cached->store(per_sm, std::memory_order_relaxed);
  return cudaSuccess;
}

// Resident CTAs per SM of combine_kernel<Out, rows_per_item> at `threads` threads.
template <Elem Out>
cudaError_t combine_residency(int rows_per_item, int threads, int& per_sm) {
  static ResidencyCache resident[kCombineMaxRows + 1][kCombineMaxThreads / 32 + 1];
  return cached_residency(resident[rows_per_item][(threads + 31) / 32],
                          combine_kernel_for<Out>(rows_per_item), threads, per_sm);
}

// The CTA shape: column chunks (1, 2, 4, 8) x split groups (kCombineBatch vectors in flight each)
// x rows per item (1, 2, 4; more than one only with one group, and at most one row per warp),
// picked by rounds x round trips per item: rounds = items over the CTAs resident at once, round
// trips = the group's acc batches + 2 (the item's record and its split maxima, the out store);
// the cheapest wins, fewer chunks, groups and rows on a tie. The grid: at most one wave of
// resident CTAs.
// NOTE: the kernel is latency-bound: a second round of CTAs costs a whole item's chain (~3.5 us at
// B = 1), more than a second batch of loads (docs/sm90-combine.md); where rows have few splits,
// rows per item fill the batch instead.
template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, int sm_count, int rows_max_splits,
                           bool one_batch_allowed, cudaStream_t stream, bool pdl) {
  const int splits = std::max(params.num_splits, 1);
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_heads;
  // NOTE: a call of few rows (B1 s512 H128: 128 rows of 8 splits, 16 CTAs of warps) keeps the
  // item kernel, whose column chunks and split groups spread it over the SMs; a bound of
  // kMaxSplits takes the row kernel on every call (the tests' CombineRows).
  if (splits <= rows_max_splits &&
      (rows_max_splits >= kMaxSplits || rows * 2 >= static_cast<int64_t>(sm_count) * kRowsWarps)) {
    if (rows >= (int64_t{1} << 30)) return cudaErrorInvalidValue;  // 32-bit row indices
    // The uniform layout (no schedule list) with at most kRowsBatch splits a row: the one-batch
    // kernel (MLA_SM90_COMBINE_ONE_BATCH=0 keeps the row kernel there, for comparisons).
    const bool one_batch =
        one_batch_allowed && params.sched_tokens == nullptr && splits <= kRowsBatch;
    static ResidencyCache resident, resident_one_batch;
    int per_sm = 0;
    const cudaError_t err =
        one_batch ? cached_residency(resident_one_batch, &combine_rows_one_batch_kernel<Out>,
                                     kRowsWarps * 32, per_sm)
                  : cached_residency(resident, &combine_rows_kernel<Out>, kRowsWarps * 32, per_sm);
    if (err != cudaSuccess) return err;
    const int grid = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((rows + kRowsWarps - 1) / kRowsWarps,
                                               static_cast<int64_t>(sm_count) * per_sm)));
    if (one_batch) {
      return launch(&combine_rows_one_batch_kernel<Out>, dim3(grid), dim3(kRowsWarps * 32), 0,
                    stream, pdl, params);
    }
    return launch(&combine_rows_kernel<Out>, dim3(grid), dim3(kRowsWarps * 32), 0, stream, pdl,
                  params);
  }
  int chunks = 1, threads = kCombineL / 4, per_sm = 1, rows_per_item = 1;
  int64_t best = -1;
  for (int c = 1; c <= 8; c *= 2) {
    const int group_threads = (kCombineL / 4) / c;
    const int min_groups = std::max(1, 32 / group_threads);
    const int max_groups = kCombineMaxThreads / group_threads;
    const int want =
        std::clamp((splits + kCombineBatch - 1) / kCombineBatch, min_groups, max_groups);
    for (int groups = min_groups; groups <= want; ++groups) {
      for (int r = 1; r <= kCombineMaxRows; r *= 2) {
        if (r > 1 && (groups > 1 || group_threads * groups < 32 * r)) break;
        int resident = 0;
        const cudaError_t err = combine_residency<Out>(r, group_threads * groups, resident);
        if (err != cudaSuccess) return err;
        const int64_t wave = static_cast<int64_t>(resident) * sm_count;
        const int64_t items =
            static_cast<int64_t>(params.num_tokens) * ((params.num_heads + r - 1) / r) * c;
        const int64_t rounds = (items + wave - 1) / wave;
        const int per_group = (splits + groups - 1) / groups;
        const int per_batch = kCombineBatch / r;
        const int64_t cost = rounds * ((per_group + per_batch - 1) / per_batch + 2);
        if (best < 0 || cost < best) {
          best = cost;
          chunks = c;
          threads = group_threads * groups;
          per_sm = resident;
          rows_per_item = r;
        }
      }
    }
  }
  const int64_t items = static_cast<int64_t>(params.num_tokens) *
                        ((params.num_heads + rows_per_item - 1) / rows_per_item) * chunks;
  if (items >= (int64_t{1} << 30)) return cudaErrorInvalidValue;  // 32-bit item indices
  // NOTE: one CTA per item made the grid's launch the cost at large batches (22 us for 16K CTAs
  // that had nothing to do, docs/sm90-combine.md); the loop takes the items past a wave.
  const int grid = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(items, static_cast<int64_t>(sm_count) * per_sm)));
  return launch(combine_kernel_for<Out>(rows_per_item), dim3(grid), dim3(threads), 0, stream, pdl,
                params, chunks);
}

}  // namespace mla::sm90::combine
