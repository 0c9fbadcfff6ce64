// Few-rows decode kernel: the chunked TMA ring (tma/) with the GEMMs transposed, keys as M, for
// requests of at most kRows = 16 or 32 query rows (H x q_len), where 64-row tiles would be mostly
// padding.
//
// Grid mapping (tma::resolve_tile with one tile): blockIdx.x = 0 (the request's n_b * H rows,
// padded to kRows with zero rows), blockIdx.y = request b, blockIdx.z = split s, which takes the
// s-th of num_splits equal runs of the request's 64-key blocks. It writes the split's unnormalized
// partial (acc, max, sum) of each row, which the combine kernel merges, or with one split (the
// host's choice, p.direct_out) out and lse themselves.
//
// Warpgroup roles (384 threads):
//   WG0 producer: tma/chunk_producer.cuh, one K block (64 keys x 576) per stage of a 2-stage ring.
//   WG1, WG2 consumers: consumer c takes every block of parity c (stage c) on its own, with its
//     own running max, row sums and O^T (512 x kRows, fp32): per block
//       S^T = K Q^T                  (36 x wgmma m64nNk16, A = K block, B = Q tile)
//       m = max(m, colmax S^T), P = exp2(S^T - m), O^T = a O^T + V^T P^T  (32 x m64nNk16,
//       A = V^T: the K block read MN-major, B = P from shared memory)
//     The two consumers share no state until the end, where consumer 1 hands its (m, l, O^T) to
//     consumer 0 through shared memory and consumer 0 merges and stores the partial.
// Longer rationale: docs/sm90-few-rows.md.
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/few_rows/traits.h"
#include "sm90/decode/output.cuh"
#include "sm90/decode/tma/chunk_producer.cuh"
#include "sm90/decode/tma/fp8_ring.cuh"
#include "sm90/decode/tma/gather.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"

namespace mla::sm90::few_rows {

using tma::fence_proxy_async_smem;
using tma::mbar_arrive;
using tma::mbar_wait;
using tma::named_barrier_and;
using tma::named_barrier_sync;

__device__ __forceinline__ uint32_t barrier_id(NamedBarrier b, int consumer = 0) {
  return static_cast<uint32_t>(b) + consumer;
}

// Column slot (query row of the thread, 0 .. kRows / 4) of value v of a 64 x N GMMA accumulator:
// values come in pairs of adjacent columns, then the row 8 below, then the next 8 columns.
__device__ __forceinline__ constexpr int col_slot(int v) { return (v & 1) | ((v >> 2) << 1); }

// Q, KV: the query's and kv_cache's formats (tma::Formats): an e4m3 cache is widened in shared
// memory by the producer warpgroup (tma/fp8_ring.cuh), an e4m3 query as its tile loads.
// kSparse: a sparse call, one CTA per (query token, split) (tma::resolve_sparse_tile), its blocks
// gathered by index (tma/gather.cuh); the keys are the token's counted entries, each attended by
// every row unless it is -1.
template <Elem Q, Elem KV, int kRowsN, bool kSparse>
__global__ void __launch_bounds__(FewRowsTraits<tma::Formats<Q, KV>::kCompute, kRowsN>::kThreads, 1)
    few_rows_kernel(const __grid_constant__ DecodeKernelParams p,
                    const __grid_constant__ CUtensorMap kv_map) {
  using namespace cute;
  using F = tma::Formats<Q, KV>;
  using Traits = FewRowsTraits<F::kCompute, kRowsN>;
  using T = typename Traits::T;
  using Plan = typename Traits::SharedMemoryPlan;
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys, kL = Traits::kL;
  constexpr int kCols = Traits::kColsPerThread;

  extern __shared__ uint8_t smem_raw[];
  Plan& smem = shared_plan<Plan>(smem_raw);

  pdl_wait();  // inputs may come from the previous grid in the stream
  pdl_launch_dependents();

  // Gathered blocks: sparse calls, and the fp8_ds_mla cache (no TMA box widens it) of dense ones.
  constexpr bool kGather = kSparse || KV == Elem::kFp8DsMla;
  const tma::TileWork w = kSparse ? tma::resolve_sparse_tile(p, 0) : tma::resolve_tile(p);
  if (w.row0 >= w.rows) return;  // a request without query rows
  const int64_t partial_row0 =
      (static_cast<int64_t>(blockIdx.z) * p.num_tokens + w.token0) * p.num_heads + w.row0;
  const int tile_rows = min(kRows, w.rows - w.row0);

  if (w.block_begin >= w.block_end) {  // an empty split
    if (w.whole) {
      store_empty_rows(p, w.row0, tile_rows, w.token0, threadIdx.x, Traits::kThreads);
    } else {
      tma::store_empty_partial(p, partial_row0, tile_rows, threadIdx.x);
    }
    return;
  }
  // The producer warpgroup's registers: 56 where it widens or gathers.
  constexpr bool kWideProducer = F::kFp8Cache || kGather;
  const int issuers = tma::producer_issuers<Traits>(p);
  if constexpr (kGather) {
    tma::init_gather_barriers<Traits, KV>(smem);
  } else {
    tma::init_ring_barriers<Traits, false, F::kFp8Cache>(smem, issuers);
  }

  // NOTE: CUTLASS broadcasts the index from lane 0, so the compiler knows it is warp-uniform: the
  // consumer index, its stage addresses and the GMMA descriptors then live in uniform registers
  // (from threadIdx.x / 128, ~4 R2UR and the descriptor arithmetic came before every wgmma:
  // docs/sm90-seesaw.md, Resources).
  const int wg = cutlass::canonical_warp_group_idx();
  if (wg == 0) {
    // ---- producer warpgroup: lane 0 of warp q issues page piece q ----
    tma::regs_dealloc<tma::RegisterSplit<Traits, kWideProducer>::kProducer>();
    if constexpr (kGather) {
      tma::gather_blocks<Traits, KV, false, kSparse>(p, w, smem, threadIdx.x, 0, 0);
      return;
    } else if constexpr (F::kFp8Cache) {
      // fp8 cache: lane q of warp 0 issues page piece q into the landing areas, warps 1..3 widen.
      if (threadIdx.x < issuers) {
        tma::prefetch_tensor_map(&kv_map);
        tma::issue_fp8_chunks<Traits>(p, w, &kv_map, smem, threadIdx.x, 0, 0);
      } else if (threadIdx.x >= 32) {
        tma::widen_fp8_chunks<Traits>(w, smem, threadIdx.x - 32, 0, 0,
                                      barrier_id(NamedBarrier::kWiden));
      }
      return;
    }
    const int piece = threadIdx.x / 32;
    if (piece < issuers && threadIdx.x % 32 == 0) {
      tma::prefetch_tensor_map(&kv_map);
      tma::produce_chunks<Traits>(p, w, &kv_map, smem, piece);
    }
    return;
  }

  // ---- consumer warpgroups ----
  tma::regs_alloc<tma::RegisterSplit<Traits, kWideProducer>::kConsumer>();
  const int cw = wg - 1;                    // consumer index: its block parity and stage
  const int ctid = threadIdx.x - 128;       // 0..255 over both consumers
  const int wtid = threadIdx.x - 128 * wg;  // 0..127 within the warpgroup
  const int lane = threadIdx.x & 31;
  const int warp = wtid / 32;

  // Query tile into shared memory (padding rows 0).
  {
    tma::load_query_tile_rows<kRows, Traits::kConsumerThreads,
                              std::conditional_t<F::kFp8Query, __half, void>>(
        p, w, tile_rows, reinterpret_cast<uint8_t*>(smem.q), smem.query_row, ctid,
        [] { named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads); },
        [] {});
    fence_proxy_async_smem();
    named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
  }

  typename Traits::TiledMmaQk mma_qk;
  typename Traits::TiledMmaPv mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(wtid);
  auto thr_pv = mma_pv.get_thread_slice(wtid);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_B(sQ);  // (MMA, 1, 36) descriptors
  Tensor sP = make_tensor(make_smem_ptr(smem.p[cw]), typename Traits::SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_B(sP);  // (MMA, 1, 4)

  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kKeys>, Int<kRows>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kL>, Int<kRows>>{});
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kKeys>, Int<kRows>>{}));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kL>, Int<kRows>>{}));
  static_assert(size(decltype(tSrS){}) == kRows / 2, "S^T fragment: 64 x N over 128 threads");
  static_assert(size(decltype(tOrO){}) == 4 * kRows, "O^T fragment: 512 x N over 128 threads");
  clear(tOrO);

  // The thread's query rows (columns of S^T and O^T): slot s is the column of the values v with
  // col_slot(v) == s. A row attends keys j < limit (and, with a custom mask, the mask rule).
  auto my_col = [&](int s) { return 2 * (lane & 3) + (s & 1) + 8 * (s >> 1); };
  const int first_query = w.seq_len - w.n;
  // Sparse: every row counts the token's entries [0, extent).
  auto limit_of = [&](int r) {
    if (kSparse || r >= tile_rows) return w.extent;  // padding: zero scores, a column nobody reads
    if (p.mask != nullptr) return w.seq_len;
    return max(0, first_query + r / p.num_heads + 1);
  };
  // The first key some row of the tile does not attend (with a mask: the first draft key). Blocks
  // past it take the masked path in every thread, and their V rows from it on are cleaned
  // (tma::clean_v_rows). Sparse: the gather lands keys past the extent and -1 entries as zeros.
  const int tile_limit =
      kSparse ? w.extent : max(0, p.mask != nullptr ? first_query : first_query + 1);
  int min_limit = tile_limit;
#pragma unroll
  for (int s = 0; s < kCols; ++s) min_limit = min(min_limit, limit_of(my_col(s)));
  // The attended-set rule of slot s (tma::RowRule), built where a block needs masking.
  auto rule_of = [&](int s) {
    tma::RowRule rule;
    const int r = my_col(s);
    rule.limit = limit_of(r);
    rule.first_query = first_query;
    rule.mask = nullptr;
    if (!kSparse && p.mask != nullptr && r < tile_rows) {
      const int i = r / p.num_heads;
      const int t = p.cum_seq_lens_q != nullptr ? w.token0 + i : i;
      rule.mask = p.mask + w.b * p.mask_batch + t * p.mask_token;
    }
    return rule;
  };

  const float bmm1_scale = bmm1_scale_of(p);
  const float score_scale = bmm1_scale * 1.4426950408889634f;  // log2(e): scores in base 2
  // Skip-softmax threshold f / seq_len (sparse: the token's counted entries).
  const int skip_len = kSparse ? w.extent : w.seq_len;
  const bool skip_softmax = p.skip_softmax_factor > 0.0f && skip_len > 0;
  const float skip_threshold =
      skip_softmax ? __fdiv_rn(p.skip_softmax_factor, static_cast<float>(skip_len)) : 0.0f;

  float col_max[kCols], col_sum[kCols];  // this consumer's running max (base 2), own-key sums
#pragma unroll
  for (int s = 0; s < kCols; ++s) {
    col_max[s] = kNegInf;
    col_sum[s] = 0.0f;
  }

  // One arrive per consumer warp on one of the stage's empty barriers.
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };

  const int num_blocks = w.block_end - w.block_begin;
  for (int it = cw; it < num_blocks; it += 2) {
    const int round = it / 2;
    const int par = round & 1;
    const uint32_t phase = round & 1;
    const int key0 = (w.block_begin + it) * kKeys;
    T* k_stage = smem.k[cw];

    // ---- qk_gemm: S^T = K Q^T over the whole block, each 64-column chunk issued as it lands ----
    {
      Tensor sK = make_tensor(make_smem_ptr(k_stage), typename Traits::SmemLayoutK{});
      Tensor tSrK = thr_qk.partition_fragment_A(sK);
      tma::chunked_gemm<Traits>(mma_qk, tSrK, tSrQ, tSrS, smem.full[cw], phase);
    }

    // ---- mask; column max over the block's keys (scaled, base 2) ----
    // NOTE: where every row of the thread attends every key of the block, S^T stays unscaled and
    // the scale goes into P's FFMA (docs/sm90-seesaw.md, Softmax).
    // Sparse: the keys whose entry is -1 (slot[stage], landed with the block) are masked too.
    uint64_t absent = 0;  // bit k: key key0 + k is -1
    if constexpr (kSparse) {
      absent =
          (static_cast<uint64_t>(__ballot_sync(0xffffffffu, smem.slot[cw][lane + 32] < 0)) << 32) |
          __ballot_sync(0xffffffffu, smem.slot[cw][lane] < 0);
    }
    const bool unmasked = (kSparse || p.mask == nullptr) && score_scale > 0.0f &&
                          key0 + kKeys <= min_limit && absent == 0;
    const float s_mul = unmasked ? score_scale : 1.0f;  // what tSrS still needs
    float block_max[kCols];
#pragma unroll
    for (int s = 0; s < kCols; ++s) block_max[s] = kNegInf;
    if (unmasked) {
      // NOTE: an attended score of -inf (an inf in a key's rope, which V does not hold) gets
      // P = 0 and would leave its row finite: flagged here, the row turns NaN through its sum
      // (contract section 1.2; the masked path below makes such a score NaN).
      // One largest |S| over the thread's scores finds the rare block that has one.
      float abs_max = 0.0f;
      CUTE_UNROLL
      for (int v = 0; v < size(tSrS); ++v) {
        block_max[col_slot(v)] = fmaxf(block_max[col_slot(v)], tSrS(v));
        abs_max = fmaxf(abs_max, fabsf(tSrS(v)));
      }
      if (abs_max == kInf) {
        CUTE_UNROLL
        for (int v = 0; v < size(tSrS); ++v) {
          if (tSrS(v) == kNegInf) col_sum[col_slot(v)] = __int_as_float(0x7fffffff);
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < kCols; ++s) {
        const tma::RowRule rule = rule_of(s);
        CUTE_UNROLL
        for (int v = 0; v < size(tSrS); ++v) {
          if (col_slot(v) != s) continue;
          const int j = key0 + get<0>(tScS(v));
          // NOTE: an attended score of -inf comes from an infinite input: NaN, as the row must
          // turn (contract section 1; the key's V row may have been cleaned).
          float x = kNegInf;
          if (rule.attends(j) && ((absent >> get<0>(tScS(v))) & 1) == 0) {
            x = tSrS(v) * score_scale;
            if (x == kNegInf) x = __int_as_float(0x7fffffff);
          }
          tSrS(v) = x;
          block_max[s] = fmaxf(block_max[s], x);
        }
      }
    }
    // Keys of a column sit in lanes with the same lane % 4 (8 of a warp) and in the 4 warps.
#pragma unroll
    for (int s = 0; s < kCols; ++s) {
      block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 4));
      block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 8));
      block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 16));
    }
    if (lane < 4) {
#pragma unroll
      for (int s = 0; s < kCols; ++s) smem.max[cw][par][warp][my_col(s)] = block_max[s];
    }
    named_barrier_sync(barrier_id(NamedBarrier::kMaxFirst, cw), 128);
#pragma unroll
    for (int s = 0; s < kCols; ++s) {
      float m = smem.max[cw][par][0][my_col(s)];
#pragma unroll
      for (int x = 1; x < 4; ++x) m = fmaxf(m, smem.max[cw][par][x][my_col(s)]);
      block_max[s] = m * s_mul;  // scale > 0: the max of the scaled scores
    }

    // ---- skip-softmax: a block every row of the tile finds negligible counts as empty ----
    if (skip_softmax) {
      bool negligible = true;
#pragma unroll
      for (int s = 0; s < kCols; ++s) {
        negligible = negligible &&
                     (my_col(s) >= tile_rows || exp2f(block_max[s] - col_max[s]) < skip_threshold);
      }
      if (named_barrier_and(barrier_id(NamedBarrier::kVoteFirst, cw), 128, negligible)) {
#pragma unroll
        for (int s = 0; s < kCols; ++s) block_max[s] = kNegInf;  // P = 0: the block adds nothing
        CUTE_UNROLL
        for (int v = 0; v < size(tSrS); ++v) tSrS(v) = kNegInf;
      }
    }

    // ---- online_softmax: new max, factor, P = exp2(S - max) (one FFMA and one MUFU each) ----
    float alpha[kCols];
#pragma unroll
    for (int s = 0; s < kCols; ++s) {
      const float m_new = fmaxf(col_max[s], block_max[s]);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // no finite score yet: P = 0
      alpha[s] = exp2f(col_max[s] - m_use);
      col_max[s] = m_new;
      block_max[s] = m_use;
      col_sum[s] *= alpha[s];
    }
    CUTE_UNROLL
    for (int v = 0; v < size(tSrS); ++v) {
      const float e = tma::exp2_ftz(fmaf(tSrS(v), s_mul, -block_max[col_slot(v)]));
      tSrS(v) = e;
      col_sum[col_slot(v)] += e;
    }

    // ---- P into shared memory (16-bit, rows x keys); zero V rows of keys past the extent ----
    {
      // NOTE: rounding P to 16 bits moves out by up to half an ulp of P times
      // sum_j p_j |v_j| / Z, which dominates where the terms cancel (docs/sm90-tma.md, Precision).
      uint8_t* p_bytes = reinterpret_cast<uint8_t*>(smem.p[cw]);
      CUTE_UNROLL
      for (int v = 0; v < size(tSrS); ++v) {
        const uint32_t offset = tma::swizzled_offset(get<1>(tScS(v)), get<0>(tScS(v)), kRows);
        *reinterpret_cast<T*>(p_bytes + offset) = T(tSrS(v));
      }
      // NOTE: TMA loads whole boxes and skips pages past the extent; those rows may hold NaN
      // (poisoned cache, stale stage), and P = 0 times NaN is NaN.
      const int valid = min(kKeys, w.extent - key0);
      // From the first key some row of the tile does not attend (tile_limit).
      const int clean0 = min(valid, max(0, tile_limit - key0));
      if (!kSparse && clean0 < kKeys) {
        tma::clean_v_rows(reinterpret_cast<uint8_t*>(k_stage), kKeys, kL / Traits::kChunkCols,
                          clean0, valid, std::is_same_v<T, cute::half_t> ? 0x7c00u : 0x7f80u, wtid,
                          128);
      }
      fence_proxy_async_smem();
      named_barrier_sync(barrier_id(NamedBarrier::kPFirst, cw), 128);
    }

    // ---- rescale_o; pv_gemm: O^T = a O^T + V^T P^T, chunks 0..3 and 4..7 as two batches ----
    CUTE_UNROLL
    for (int v = 0; v < size(tOrO); ++v) tOrO(v) *= alpha[col_slot(v % (kRows / 2))];
    {
      Tensor sV = make_tensor(make_smem_ptr(k_stage), typename Traits::SmemLayoutV{});
      Tensor tOrV = thr_pv.partition_fragment_A(sV);  // (MMA, 8, 4)
      static_assert(decltype(size<1>(tOrV))::value == kL / 64, "one m tile per V chunk");
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tOrV); ++m) {
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrV); ++k) {
          cute::gemm(mma_pv, tOrV(_, m, k), tOrP(_, 0, k), tOrO(_, m, 0));
        }
        if (m == Traits::kLeftChunks - 1) warpgroup_commit_batch();
      }
      warpgroup_commit_batch();
      // NOTE: the first half's chunks go back to the producer while the second half runs.
      warpgroup_wait<1>();
      release(&smem.empty_l[cw]);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      release(&smem.empty_r[cw]);
    }
  }

  // ---- store_partials: merge the two consumers' (max, sum, O^T) through the two stages ----
  // A non-finite O value comes from a non-finite attended key or value (an inf value whose score
  // came out -inf leaves NaN in its column only; an inf value with P > 0 an inf): its row turns
  // NaN, out and lse (contract section 1), through its sum. Once per CTA.
  CUTE_UNROLL
  for (int v = 0; v < size(tOrO); ++v) {
    if (!isfinite(tOrO(v))) col_sum[col_slot(v % (kRows / 2))] = __int_as_float(0x7fffffff);
  }
#pragma unroll
  for (int s = 0; s < kCols; ++s) {
    col_sum[s] += __shfl_xor_sync(0xffffffffu, col_sum[s], 4);
    col_sum[s] += __shfl_xor_sync(0xffffffffu, col_sum[s], 8);
    col_sum[s] += __shfl_xor_sync(0xffffffffu, col_sum[s], 16);
    if (lane < 4) smem.sum[cw][warp][my_col(s)] = col_sum[s];
    if (warp == 0 && lane < 4) smem.final_max[cw][my_col(s)] = col_max[s];
  }
  // Both consumers are done with every stage (each loaded block was waited for and consumed).
  // NOTE: this barrier (both consumer warpgroups, 256 threads) orders the final_max and sum stores
  // above before every read below; the CTA handles one (request, split), so nothing writes them
  // again. compute-sanitizer's racecheck does not credit partial-count named barriers and reports
  // this pair as RAW hazards (docs/sm90-few-rows.md, Sanitizers).
  named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
  // Row c's max over both consumers (natural log units) and its sum at that max.
  auto row_total = [&](int c, float& m_nat, float& l) {
    const float m0 = smem.final_max[0][c], m1 = smem.final_max[1][c];
    const float m = fmaxf(m0, m1);
    const float m_use = m == kNegInf ? 0.0f : m;
    float l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      l0 += smem.sum[0][x][c];
      l1 += smem.sum[1][x][c];
    }
    m_nat = m == kNegInf ? kNegInf : m * 0.6931471805599453f;
    l = exp2f(m0 - m_use) * l0 + exp2f(m1 - m_use) * l1;
  };
  float factor[kCols];  // exp2(own max - merged max)
#pragma unroll
  for (int s = 0; s < kCols; ++s) {
    const float m = fmaxf(smem.final_max[0][my_col(s)], smem.final_max[1][my_col(s)]);
    factor[s] = exp2f(col_max[s] - (m == kNegInf ? 0.0f : m));
  }
  // Stage cw holds factor x O^T of consumer cw as [row][kL + 4] floats (conflict-free stores).
  constexpr int kStride = Traits::kMergeStride;
  float* own = reinterpret_cast<float*>(smem.k[cw]);
  CUTE_UNROLL
  for (int v = 0; v < size(tOrO); ++v) {
    own[get<1>(tOcO(v)) * kStride + get<0>(tOcO(v))] = factor[col_slot(v % (kRows / 2))] * tOrO(v);
  }
  // Thread c < tile_rows finishes row c while the others stage their O: where it goes (out or
  // partial_o) and what its O is multiplied by.
  if (ctid < tile_rows) {
    float m_nat, l;
    row_total(ctid, m_nat, l);
    if (w.whole) {
      // The call's only split: the combine's normalization (output.cuh) here.
      const RowTarget target = finish_row(p, w.row0 + ctid, w.token0, m_nat, l);
      smem.out_row[ctid] = target.offset;
      smem.out_scale[ctid] = target.scale;
    } else {
      // A partial: max, sum and o = bmm2 O / sum (params.h).
      p.partial_max[partial_row0 + ctid] = m_nat;
      p.partial_sum[partial_row0 + ctid] = l;
      smem.out_row[ctid] = (partial_row0 + ctid) * kL;
      smem.out_scale[ctid] = l != 0.0f ? __fdiv_rn(bmm2_scale_of(p), l) : 0.0f;
    }
  }
  named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
  const float* first = reinterpret_cast<const float*>(smem.k[0]);
  const float* second = reinterpret_cast<const float*>(smem.k[1]);
  // Partial rows are 512 wide whatever L is (route.h); out rows L.
  const int cols = w.whole ? p.kv_lora_rank : kL;
  for (int e = ctid; e < tile_rows * (kL / 8); e += Traits::kConsumerThreads) {
    const int c = e / (kL / 8), d = (e - c * (kL / 8)) * 8;
    const int64_t o = smem.out_row[c];
    if (o < 0 || d >= cols) continue;
    const float f = smem.out_scale[c];  // NOTE: a row without a key gets 0, whatever O holds
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k += 4) {
      const float4 a = *reinterpret_cast<const float4*>(first + c * kStride + d + k);
      const float4 b = *reinterpret_cast<const float4*>(second + c * kStride + d + k);
      v[k + 0] = f != 0.0f ? (a.x + b.x) * f : 0.0f;
      v[k + 1] = f != 0.0f ? (a.y + b.y) * f : 0.0f;
      v[k + 2] = f != 0.0f ? (a.z + b.z) * f : 0.0f;
      v[k + 3] = f != 0.0f ? (a.w + b.w) * f : 0.0f;
    }
    const uint4 words = make_uint4(pack_out(p, v[0], v[1]), pack_out(p, v[2], v[3]),
                                   pack_out(p, v[4], v[5]), pack_out(p, v[6], v[7]));
    if (w.whole) {
      store_out8(p, o + d, words);
    } else {
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.partial_o) + o + d) = words;
    }
  }
}

template <Elem Q, Elem KV, int kRows>
cudaError_t launch_few_rows(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                            cudaStream_t stream, bool pdl) {
  using Traits = FewRowsTraits<tma::Formats<Q, KV>::kCompute, kRows>;
  constexpr size_t smem = Traits::kSmemBytes;
  auto* kernel = &few_rows_kernel<Q, KV, kRows, false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(1, params.batch, params.num_splits);
  return launch(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, params, kv_map);
}

template <Elem Q, Elem KV, int kRows>
cudaError_t launch_few_rows_sparse(const DecodeKernelParams& params, cudaStream_t stream,
                                   bool pdl) {
  using Traits = FewRowsTraits<tma::Formats<Q, KV>::kCompute, kRows>;
  constexpr size_t smem = Traits::kSmemBytes;
  auto* kernel = &few_rows_kernel<Q, KV, kRows, true>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(1, params.num_tokens, params.num_splits);
  const CUtensorMap unused{};  // the gather reads the cache through params.kv
  return launch(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, params, unused);
}

}  // namespace mla::sm90::few_rows
