// v0 combine kernel: merges the split partials of each (token, head) row into out and lse.
//
// Work: items (token t, head h, column chunk of 512 / chunks columns) over every token, or with
// the balanced schedule over the tokens the plan kernel listed (the others have one segment, whose
// out and lse v2 wrote). The grid is sized by occupancy, not by the items: each CTA takes items
// blockIdx.x, blockIdx.x + gridDim.x, ... A row's splits are at [num_splits, T, H] or, with the
// balanced schedule, where the token's ScheduleToken says. The CTA's threads form split groups of
// (128 / chunks) threads, 4 columns (one 16-byte vector) each; group g takes splits g, g + G,
// g + 2G, ... (G = groups per CTA). With M = max over splits of the split max m_s (splits
// without keys excluded):
//   Z   = sum_s sum_s' * exp(m_s - M),  acc = sum_s acc_s * exp(m_s - M)
//   out = bmm2_scale * acc / (Z + exp(sink_h - M)),  lse = M + log(Z)
// and an empty row (no split saw a key) gets out = 0, lse = -inf.
//
// Order of the sums (fixed by the shapes, so results are bitwise identical run to run): Z over
// warp 0's lanes (split s on lane s % 32, then a butterfly); acc per group in split order, then
// the groups in order 0 .. G-1.
#pragma once

#include <algorithm>
#include <atomic>

#include "sm90/common.cuh"
#include "sm90/decode/output.cuh"
#include "sm90/decode/v0/launch.h"

namespace mla::sm90::v0 {

inline constexpr int kCombineMaxThreads = 512;
inline constexpr int kCombineBatch = 8;  // acc vectors in flight per thread
inline constexpr int kCombineL = 512;

template <Elem Out>
// NOTE: two CTAs of the most threads per SM cap the registers at 64: the kernel is latency-bound,
// and resident CTAs are what hides it.
__global__ void __launch_bounds__(kCombineMaxThreads, 2)
    combine_kernel(const __grid_constant__ DecodeKernelParams p, int chunks) {
  constexpr int kL = kCombineL;
  constexpr int kSplitsPerLane = kMaxSplits / 32;
  static_assert(kMaxSplits % 32 == 0, "warp 0 holds kMaxSplits / 32 splits per lane");

  __shared__ float weight[kMaxSplits];         // exp(m_s - M), 0 for an empty split
  __shared__ float4 part[kCombineMaxThreads];  // each thread's group sum, for the final merge
  __shared__ float row_max, row_z;

  // ---- prologue: indices only ----
  const int group_threads = (kL / 4) / chunks;
  const int groups = blockDim.x / group_threads;
  const int g = threadIdx.x / group_threads;
  const int lane_in_group = threadIdx.x - g * group_threads;
  const int per_token = p.num_heads * chunks;
  // NOTE: the list and the first record are read before the wait: the plan kernel finished before
  // the decode grid passed its own wait, which is before this grid could launch.
  const bool listed = p.sched_tokens != nullptr;
  const int64_t items =
      static_cast<int64_t>(listed ? *p.sched_token_count : p.num_tokens) * per_token;
  // The record of this CTA's next item, loaded one item ahead. NOTE: the first one without
  // waiting for the count: the list's [T] entries are all readable, those past it unused.
  ScheduleToken next{};
  if (listed)
    next = p.sched_tokens[min(static_cast<int>(blockIdx.x) / per_token, p.num_tokens - 1)];

  pdl_wait();  // the partials come from the decode grid
  pdl_launch_dependents();

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int token_item = static_cast<int>(item / per_token);
    const int rest = static_cast<int>(item - static_cast<int64_t>(token_item) * per_token);
    const int h = rest % p.num_heads, chunk = rest / p.num_heads;
    const int c = chunk * (kL / chunks) + 4 * lane_in_group;

    // Rows of this (token, head): split s at row + s * stride.
    int t, num_splits;
    int64_t stride, row;
    if (listed) {
      const ScheduleToken st = next;
      if (item + gridDim.x < items) next = p.sched_tokens[(item + gridDim.x) / per_token];
      t = st.token;
      num_splits = st.splits;
      stride = st.stride;
      row = st.base_row + h;
    } else {
      t = token_item;
      num_splits = p.num_splits;
      stride = static_cast<int64_t>(p.num_tokens) * p.num_heads;
      row = static_cast<int64_t>(t) * p.num_heads + h;
    }
    const float* acc_base = p.partial_acc + row * kL + c;

    // ---- the group's first batch of acc vectors: in flight while warp 0 finds the weights ----
    float4 a[kCombineBatch];
    auto load_batch = [&](int k0) {
#pragma unroll
      for (int k = 0; k < kCombineBatch; ++k) {
        const int s = g + (k0 + k) * groups;
        if (s < num_splits) {
          a[k] = __ldcs(reinterpret_cast<const float4*>(acc_base + s * stride * kL));
        }
      }
    };
    load_batch(0);

    // ---- warp 0: all split maxima at once, M, the weights and Z ----
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      float m_s[kSplitsPerLane], sum_s[kSplitsPerLane];
      float m = kNegInf;
#pragma unroll
      for (int j = 0; j < kSplitsPerLane; ++j) {
        const int s = lane + 32 * j;
        m_s[j] = kNegInf;
        sum_s[j] = 0.0f;
        if (32 * j < num_splits) {  // NOTE: a warp-uniform bound: no loads past the last split
          m_s[j] = s < num_splits ? __ldcs(&p.partial_max[s * stride + row]) : kNegInf;
          sum_s[j] = s < num_splits ? __ldcs(&p.partial_sum[s * stride + row]) : 0.0f;
        }
        m = fmaxf(m, m_s[j]);
      }
#pragma unroll
      for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
      float z = 0.0f;
#pragma unroll
      for (int j = 0; j < kSplitsPerLane; ++j) {
        const float w = m_s[j] == kNegInf ? 0.0f : expf(m_s[j] - m);
        z = fmaf(sum_s[j], w, z);
        if (lane + 32 * j < num_splits) weight[lane + 32 * j] = w;
      }
#pragma unroll
      for (int d = 16; d > 0; d /= 2) z += __shfl_xor_sync(0xffffffffu, z, d);
      if (lane == 0) {
        row_max = m;
        row_z = z;
      }
    }
    __syncthreads();

    // ---- the group's splits, kCombineBatch vectors in flight at a time ----
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int k0 = 0; g + k0 * groups < num_splits; k0 += kCombineBatch) {
      if (k0 > 0) load_batch(k0);
#pragma unroll
      for (int k = 0; k < kCombineBatch; ++k) {
        const int s = g + (k0 + k) * groups;
        if (s < num_splits) {
          const float w = weight[s];
          if (w != 0.0f) {  // an empty split's acc holds nothing (possibly garbage): never read it
            acc.x = fmaf(a[k].x, w, acc.x);
            acc.y = fmaf(a[k].y, w, acc.y);
            acc.z = fmaf(a[k].z, w, acc.z);
            acc.w = fmaf(a[k].w, w, acc.w);
          }
        }
      }
    }
    if (groups > 1) {
      part[threadIdx.x] = acc;
      __syncthreads();
      if (g == 0) {
        for (int k = 1; k < groups; ++k) {
          const float4 b = part[k * group_threads + lane_in_group];
          acc.x += b.x;
          acc.y += b.y;
          acc.z += b.z;
          acc.w += b.w;
        }
      }
    }

    // ---- out and lse: group 0 ----
    if (g == 0) {
      const RowOutput r = row_output(p, h, row_max, row_z);
      if (r.scale == 0.0f) acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // no key: acc is garbage
      using OT = ElemTraits<Out>;
      auto* out = static_cast<typename OT::Storage*>(p.out);
      const int64_t o = out_offset(p, t, h) + c;
      OT::store(out, o + 0, acc.x * r.scale);
      OT::store(out, o + 1, acc.y * r.scale);
      OT::store(out, o + 2, acc.z * r.scale);
      OT::store(out, o + 3, acc.w * r.scale);
      if (p.lse != nullptr && threadIdx.x == 0 && chunk == 0) p.lse[lse_offset(p, t, h)] = r.lse;
    }
    __syncthreads();  // weight, part, row_max and row_z are the next item's
  }
}

// The CTA shape: enough column chunks that the items cover about two CTAs per SM, then as many
// split groups as the splits need, kCombineBatch splits each (up to kCombineMaxThreads threads, at
// least one warp). The grid: at most the CTAs that are resident at once.
template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, int sm_count, cudaStream_t stream,
                           bool pdl) {
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_heads;
  int chunks = 1;
  while (chunks < 8 && rows * chunks < 2 * static_cast<int64_t>(sm_count)) chunks *= 2;
  const int group_threads = (kCombineL / 4) / chunks;
  // NOTE: a group keeps kCombineBatch splits in flight; more threads per CTA than that needs cost
  // resident CTAs, and the kernel is latency-bound (docs/perf-notes.md, Change 10).
  const int want = (params.num_splits + kCombineBatch - 1) / kCombineBatch;
  const int groups =
      std::max(std::min(want, kCombineMaxThreads / group_threads), std::max(1, 32 / group_threads));
  const int threads = group_threads * groups;
  // NOTE: one CTA per item made the grid's launch the cost at large batches (22 us for 16K CTAs
  // that had nothing to do, docs/perf-notes.md, Change 13).
  static std::atomic<int> resident[2][kCombineMaxThreads / 32 + 1];  // per out type, per warps
  std::atomic<int>& cached = resident[Out == Elem::kFp16 ? 1 : 0][threads / 32];
  int per_sm = cached.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, &combine_kernel<Out>, threads, 0);
    if (err != cudaSuccess) return err;
    per_sm = std::max(per_sm, 1);
    cached.store(per_sm, std::memory_order_relaxed);
  }
  const int64_t items = rows * chunks;
  const int grid = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(items, static_cast<int64_t>(sm_count) * per_sm)));
  return launch(&combine_kernel<Out>, dim3(grid), dim3(threads), 0, stream, pdl, params, chunks);
}

}  // namespace mla::sm90::v0
