// Plan kernel of the balanced schedule (format.h; docs/sm90-seesaw.md, Work split), which the
// seesaw and few-rows kernels walk.
//
// One CTA of kThreads threads, each owning a contiguous run of requests:
//   pass 1: cost of request b = blocks_b + fixed (kFixedBlocks; 0 without a block); an
//           exclusive scan gives its position; positions per part are the even share
//           ceil(total / parts), or, where every request with a block costs the same, a multiple
//           of that cost up to 10% above it, or, where there are at least two parts for each such
//           request, the uniform split: k = parts / requests equal runs of each request's blocks,
//           each request starting a part (its line stride k runs, no fixed cost), unless those
//           runs are longer than the even share by more than `uniform_slack` percent;
//   pass 2: the parts a request's blocks fall in give its segment count; a second scan of
//           segments x rows gives its first partial row, and of the tokens the combine merges
//           (those of requests without exactly one segment) their place on its list; each part
//           records its first request;
//   pass 3: the request records and the combine's list, in token order, ended by records of
//           splits -1.
// Everything is a function of seq_lens and the query lengths: the same plan serves every layer.
#include <cub/block/block_scan.cuh>

#include <climits>

#include "sm90/common.cuh"
#include "sm90/decode/schedule/launch.h"

namespace mla::sm90::schedule {
namespace {

constexpr int kThreads = 512;
constexpr int kSlackPercent = 10;  // how much longer than the even share a part may be made

__device__ __forceinline__ int blocks_of(int seq_len, int max_blocks) {
  const int len = max(seq_len, 0);
  return min((len >> 6) + ((len & (kBlockKeys - 1)) != 0 ? 1 : 0), max_blocks);
}

__global__ void __launch_bounds__(kThreads)
    schedule_kernel(const __grid_constant__ DecodeKernelParams p, Outputs out, int max_q_len,
                    int max_blocks, int fixed, int uniform_slack, int64_t max_rows) {
  using Scan = cub::BlockScan<int, kThreads>;
  using Scan64 = cub::BlockScan<long long, kThreads>;
  __shared__ union {
    typename Scan::TempStorage narrow;
    typename Scan64::TempStorage wide;
  } scan;
  __shared__ int part_first[kMaxParts];
  __shared__ int max_cost, min_cost;  // the largest and smallest cost of a request with a block
  __shared__ int active;              // requests with a block
  static_assert(kBlockKeys == 64, "blocks_of divides by 64");

  pdl_wait();  // seq_lens may come from the previous grid; the last plan's readers are done
  pdl_launch_dependents();

  const int batch = p.batch, parts = p.num_parts, heads = p.num_heads;
  const int per_thread = (batch + kThreads - 1) / kThreads;
  const int b_begin = min(batch, static_cast<int>(threadIdx.x) * per_thread);
  const int b_end = min(batch, b_begin + per_thread);
  // Query tokens of request b, clamped to what the workspace was sized for.
  auto tokens_of = [&](int b, int& token0) {
    if (p.cum_seq_lens_q == nullptr) {
      token0 = b * p.q_len;
      return p.q_len;
    }
    token0 = p.cum_seq_lens_q[b];
    return min(max(p.cum_seq_lens_q[b + 1] - token0, 0), max_q_len);
  };

  // ---- pass 1: positions ----
  int cost = 0;
  for (int b = b_begin; b < b_end; ++b) {
    const int blocks = blocks_of(p.seq_lens[b], max_blocks);
    cost += blocks > 0 ? blocks + fixed : 0;
  }
  int pos0 = 0, total = 0;
  Scan(scan.narrow).ExclusiveSum(cost, pos0, total);
  for (int k = threadIdx.x; k < parts; k += kThreads) part_first[k] = batch;
  if (threadIdx.x == 0) {
    max_cost = 0;
    min_cost = INT_MAX;
    active = 0;
  }
  __syncthreads();  // part_first and the costs initialized; the scan storage is reused below
  for (int b = b_begin; b < b_end; ++b) {
    const int blocks = blocks_of(p.seq_lens[b], max_blocks);
    if (blocks > 0) {
      atomicMax(&max_cost, blocks + fixed);
      atomicMin(&min_cost, blocks + fixed);
      atomicAdd(&active, 1);
    }
  }
  __syncthreads();
  // Positions per part: the even share, or, where every request with a block costs the same, a
  // whole number of that cost where that is at most kSlackPercent more: parts are then cut only
  // between requests (no request split, no partial traffic for it).
  // NOTE: with mixed lengths a multiple of the longest cost cuts inside requests anyway and only
  // leaves the last parts short or empty (B64 q2 varlen: 3 of 33 parts, the rest 8% longer;
  // docs/sm90-seesaw.md, Work split).
  // Equal requests with at least two parts each: the uniform split, k = parts / requests equal
  // runs of ceil(blocks / k) blocks per request, each request starting a part (its positions
  // stride k runs; no fixed cost, which only decides where requests are cut): every part holds
  // one segment. The even share would cut the line across request boundaries, putting two
  // segments (two query tiles, two partial stores, the ring drained between them) on most parts
  // for the same blocks (B64 q2 H16 on the few-rows kernel: +6%).
  // NOTE: k = parts / requests leaves parts % requests parts idle (B8 q3 H64: 44 parts, k = 5, 40
  // in use, runs of 52 blocks against an even share of 48 positions); where the runs are longer
  // than the even share by more than `uniform_slack` percent, the even share is taken: each of its
  // parts is a run of blocks and one segment's overhead as the uniform split's are, except the few
  // that hold a request's start (two segments over fewer blocks).
  const int even = max(1, (total + parts - 1) / parts);
  int per = even;
  int stride = 0;    // > 0: the uniform split, the line positions of each request
  int lead = fixed;  // positions before a request's first block
  if (max_cost > 0 && min_cost == max_cost) {
    const int k = parts / active;
    const int blocks = max_cost - fixed;
    const int uniform = k >= 2 ? (blocks + k - 1) / k : 0;  // the uniform split's run
    if (k >= 2 &&
        static_cast<int64_t>(uniform) * 100 <= static_cast<int64_t>(even) * (100 + uniform_slack)) {
      per = uniform;
      stride = k * per;
      lead = 0;
      pos0 = pos0 / max_cost * stride;  // every request before b_begin has a block or costs 0
    } else if (k < 2) {
      const int64_t whole = static_cast<int64_t>((even + max_cost - 1) / max_cost) * max_cost;
      if (whole * 100 <= static_cast<int64_t>(even) * (100 + kSlackPercent)) {
        per = static_cast<int>(whole);
      }
    }
  }
  // Where request b's blocks start (from its position) and the next request's position.
  auto start_of = [&](int pos) { return pos + lead; };
  auto next_pos = [&](int start, int blocks) {
    return stride > 0 ? start + stride : start + blocks;
  };

  // A token is trusted in the fast path, and never written outside [0, T).
  auto inside = [&](int t) { return t >= 0 && t < p.num_tokens; };
  // Segments of a request from its positions: 0 without a block.
  auto segments_of = [&](int start, int blocks) {
    return blocks > 0 ? (start + blocks - 1) / per - start / per + 1 : 0;
  };

  // ---- pass 2: segments, partial rows, first request of each part, listed tokens ----
  // NOTE: the combine lists the tokens of requests without exactly one segment; the decode kernel
  // writes the others' out and lse.
  int rows = 0, listed = 0;
  for (int b = b_begin, pos = pos0; b < b_end; ++b) {
    const int blocks = blocks_of(p.seq_lens[b], max_blocks);
    int token0;
    const int n = tokens_of(b, token0);
    const int start = start_of(pos);
    const int segments = segments_of(start, blocks);
    if (segments != 1) {
      for (int i = 0; i < n; ++i) listed += inside(token0 + i) ? 1 : 0;
    }
    if (blocks == 0) continue;
    // NOTE: a request of one segment writes its out and lse directly: partial rows only for
    // requests of two or more (the workspace bound in route.h counts on it).
    if (segments >= 2) rows += segments * n * heads;
    for (int k = start / per; k <= (start + blocks - 1) / per; ++k) atomicMin(&part_first[k], b);
    pos = next_pos(start, blocks);
  }
  // Both scans in one: partial rows in the high 32 bits, listed tokens (at most T) in the low.
  long long before = 0, sums = 0;
  Scan64(scan.wide).ExclusiveSum((static_cast<long long>(rows) << 32) | listed, before, sums);
  const int row0 = static_cast<int>(before >> 32);
  int list_pos = static_cast<int>(before & 0xffffffffll);
  const int list_total = static_cast<int>(sums & 0xffffffffll);

  // ---- pass 3: request records and the combine's list ----
  for (int b = b_begin, pos = pos0, row = row0; b < b_end; ++b) {
    const int blocks = blocks_of(p.seq_lens[b], max_blocks);
    int token0;
    const int n = tokens_of(b, token0);
    const int start = start_of(pos);
    int segments = segments_of(start, blocks);
    const int request_rows = n * heads;
    // NOTE: consistent cum_seq_lens_q keeps every row inside the workspace's bound; inconsistent
    // ones (trusted in the fast path, reported by the checked mode) must still not write past it.
    // A request of one segment writes no partial row.
    const bool fits =
        segments == 1 ||
        static_cast<int64_t>(row) + static_cast<int64_t>(segments) * request_rows <= max_rows;
    if (!fits) segments = 0;
    out.requests[b] = Request{start, fits ? blocks : 0, row, request_rows};
    for (int i = 0; i < n && segments != 1; ++i) {
      const int t = token0 + i;
      if (!inside(t)) continue;
      if (list_pos < p.num_tokens) {
        out.tokens[list_pos] = Token{row + i * heads, request_rows, segments, t};
      }
      ++list_pos;
    }
    if (segments >= 2) row += segments * request_rows;
    if (blocks > 0) pos = next_pos(start, blocks);
  }
  __syncthreads();
  for (int k = threadIdx.x; k < parts; k += kThreads) out.part_first[k] = part_first[k];
  if (threadIdx.x == 0) *out.part_blocks = per;
  for (int k = list_total + threadIdx.x; k < p.num_tokens; k += kThreads) {
    out.tokens[k] = Token{0, 0, -1, 0};  // past the list: the combine stops here
  }
}

}  // namespace

cudaError_t launch_schedule(const DecodeKernelParams& params, const Outputs& out, int max_q_len,
                            int max_blocks, int fixed_blocks, int uniform_slack, int64_t max_rows,
                            cudaStream_t stream, bool pdl) {
  return launch(&schedule_kernel, dim3(1), dim3(kThreads), 0, stream, pdl, params, out, max_q_len,
                max_blocks, fixed_blocks, uniform_slack, max_rows);
}

}  // namespace mla::sm90::schedule
