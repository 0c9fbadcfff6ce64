// v0 combine kernel: merges the split partials of each (token, head) row into out and lse.
//
// Work: items (token t, head h, column chunk of 512 / chunks columns) over every token, or with
// the balanced schedule over the tokens the plan kernel listed (the others have one segment, whose
// out and lse v2 wrote; a CTA stops at the first record past the list). The grid is sized by
// occupancy, not by the items: each CTA takes items blockIdx.x, blockIdx.x + gridDim.x, ... A row's
// splits are at [num_splits, T, H] or, with the balanced schedule, where the token's ScheduleToken
// says. The CTA's threads form split groups of (128 / chunks) threads, 4 columns (one 16-byte
// vector) each; group g takes splits g, g + G, g + 2G, ... (G = groups per CTA). With M = max over
// splits of the split max m_s (splits without keys excluded):
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
  // NOTE: 32-bit item indices: the host launches no combine of 2^30 items or more.
  const bool listed = p.sched_tokens != nullptr;
  const int items = p.num_tokens * per_token;

  // One item: its (token, head, columns) and where its rows are (split s at row + s * stride);
  // splits < 0 past the combine's list (so is every later item of the CTA).
  struct Item {
    int t, h, chunk, c, num_splits;
    int64_t stride, row;
  };
  auto resolve = [&](int item) {
    Item it;
    const int token_item = item / per_token;
    const int rest = item - token_item * per_token;
    it.h = rest % p.num_heads;
    it.chunk = rest / p.num_heads;
    it.c = it.chunk * (kL / chunks) + 4 * lane_in_group;
    if (listed) {
      const ScheduleToken st = p.sched_tokens[token_item];
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
    const int t = it.t, h = it.h, chunk = it.chunk, c = it.c, num_splits = it.num_splits;
    const int64_t stride = it.stride, row = it.row;
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

// Resident CTAs per SM of combine_kernel<Out> at `threads` threads (occupancy API, cached).
template <Elem Out>
cudaError_t combine_residency(int threads, int& per_sm) {
  static std::atomic<int> resident[2][kCombineMaxThreads / 32 + 1];  // per out type, per warps
  std::atomic<int>& cached = resident[Out == Elem::kFp16 ? 1 : 0][(threads + 31) / 32];
  per_sm = cached.load(std::memory_order_relaxed);
  if (per_sm != 0) return cudaSuccess;
  const cudaError_t err =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, &combine_kernel<Out>, threads, 0);
  if (err != cudaSuccess) return err;
  per_sm = std::max(per_sm, 1);
  cached.store(per_sm, std::memory_order_relaxed);
  return cudaSuccess;
}

// The CTA shape: column chunks (1, 2, 4, 8) x split groups (kCombineBatch splits in flight each),
// picked by rounds x round trips per item: rounds = items over the CTAs resident at once, round
// trips = the group's acc batches + 2 (the item's record and its split maxima, the out store);
// the cheapest wins, fewer chunks on a tie. The grid: at most one wave of resident CTAs.
// NOTE: the kernel is latency-bound: a second round of CTAs costs a whole item's chain (~3.5 us at
// B = 1), more than a second batch of loads (docs/perf-notes.md, Change 16).
template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, int sm_count, cudaStream_t stream,
                           bool pdl) {
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_heads;
  const int splits = std::max(params.num_splits, 1);
  int chunks = 1, threads = kCombineL / 4, per_sm = 1;
  int64_t best = -1;
  for (int c = 1; c <= 8; c *= 2) {
    const int group_threads = (kCombineL / 4) / c;
    const int min_groups = std::max(1, 32 / group_threads);
    const int max_groups = kCombineMaxThreads / group_threads;
    const int want =
        std::clamp((splits + kCombineBatch - 1) / kCombineBatch, min_groups, max_groups);
    for (int groups = min_groups; groups <= want; ++groups) {
      int resident = 0;
      const cudaError_t err = combine_residency<Out>(group_threads * groups, resident);
      if (err != cudaSuccess) return err;
      const int64_t wave = static_cast<int64_t>(resident) * sm_count;
      const int64_t rounds = (rows * c + wave - 1) / wave;
      const int per_group = (splits + groups - 1) / groups;
      const int64_t cost = rounds * ((per_group + kCombineBatch - 1) / kCombineBatch + 2);
      if (best < 0 || cost < best) {
        best = cost;
        chunks = c;
        threads = group_threads * groups;
        per_sm = resident;
      }
    }
  }
  const int64_t items = rows * chunks;
  if (items >= (int64_t{1} << 30)) return cudaErrorInvalidValue;  // 32-bit item indices
  // NOTE: one CTA per item made the grid's launch the cost at large batches (22 us for 16K CTAs
  // that had nothing to do, docs/perf-notes.md, Change 13); the loop takes the items past a wave.
  const int grid = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(items, static_cast<int64_t>(sm_count) * per_sm)));
  return launch(&combine_kernel<Out>, dim3(grid), dim3(threads), 0, stream, pdl, params, chunks);
}

}  // namespace mla::sm90::v0
