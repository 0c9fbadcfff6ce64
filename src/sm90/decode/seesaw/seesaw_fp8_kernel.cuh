// Seesaw decode kernel on the FP8 tensor cores: an e4m3 query over an e4m3 cache, 64-row tiles of
// the balanced schedule (docs/sm90-fp8.md, "fp8 query and fp8 cache: the FP8 seesaw").
//
// Grid mapping: as the seesaw kernel's balanced schedule: blockIdx.x = tile of 64 query rows of a
// request, blockIdx.y = part of the plan's line (tma::PartCursor); one segment per request the part
// touches, its partial rows or, for a whole request, out and lse.
//
// Warpgroup roles (384 threads):
//   WG0 producer: the 16-bit kernels' chunk producer over e4m3 boxes (64-byte swizzle), a ring of
//     four 36 KB stages, block i into stage i % 4.
//   WG1, WG2 consumers: consumer c owns the blocks of parity c: S = Q K^T for all 64 rows (18 wgmma
//     m64n64k32, both operands in shared memory, three promoted partials), the row softmax against
//     the running max handed over by the other consumer, and P (e4m3, 2^8 exp2(S - m)) into the
//     block's rope chunk, which only S read. Consumer c also owns O^T for V columns 256c .. 256c +
//     255 (four m tiles of N = 64 rows) and applies every block's P V to it: O^T = a O^T + V^T P^T,
//     V^T from registers (few_rows::load_fp8_v_fragment), P^T from the rope chunk, each m tile's
//     partial promoted in fp32.
// Per round (m: the running max; max(m, x) without slack: P' = 2^8 exp2(s - m) <= 2^8 < 448):
//   c0: S0; m0 = max(m, rowmax S0), a0, P0 -> both;   O_L = a0 O_L + V0_L^T P0^T;  (waits for c1)
//       O_L = a1 O_L + V1_L^T P1^T
//   c1: S1;  (waits for c0) O_R = a0 O_R + V0_R^T P0^T;  m1 = max(m0, rowmax S1), a1, P1 -> both;
//       O_R = a1 O_R + V1_R^T P1^T
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/few_rows/few_rows_kernel.cuh"  // the e4m3 fragment helpers
#include "sm90/decode/output.cuh"
#include "sm90/decode/seesaw/fp8_block.cuh"
#include "sm90/decode/seesaw/row_max.cuh"
#include "sm90/decode/tma/chunk_producer.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"

namespace mla::sm90::seesaw {

// Named barriers of the FP8 seesaw kernel (id 0 is __syncthreads).
enum class Fp8Barrier : uint32_t {
  kConsumers = 1,   // both consumer warpgroups (256 threads)
  kToSecond = 2,    // first -> second: P of the even block, its max and factor (256, arrive/sync)
  kToFirst = 3,     // second -> first: P of the odd block, its max and factor
  kLocalFirst = 4,  // consumer 0 alone (128): its P stores and cleaned V rows, before its own P V
  kLocalSecond = 5,
};

struct Fp8SeesawTraits {
  using T = cute::float_e4m3_t;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kRows = 64;  // query rows per CTA (M of S, N of O^T)
  static constexpr int kKeys = 64;  // keys per block (N of S)
  static constexpr int kD = 576;
  static constexpr int kL = 512;
  static constexpr int kStages = 4;  // block i in stage i % 4: consumer c's in c and c + 2
  static constexpr int kColsPerWg = kL / 2;
  static constexpr int kChunkCols = 64;  // e4m3 bytes per row of a chunk (64-byte swizzle)
  static constexpr int kStageElemBytes = 1;
  static constexpr int kChunks = kD / kChunkCols;
  static constexpr int kLeftChunks = 4;  // V columns 0..255: consumer 0's (empty_l)
  static constexpr int kRopeChunkBytes = (kL / kChunkCols) * kKeys * kChunkCols;  // P's place
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kRows * kKeys == kKeys * kChunkCols, "P (rows x keys, e4m3) fills the rope chunk");

  using QkAtom = cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN<>;
  using PvAtom = cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>;
  using KAtom = cute::GMMA::Layout_K_SW64_Atom<T>;
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kRows>, cute::Int<kD>>{}));
  using SmemLayoutK =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kKeys>, cute::Int<kD>>{}));
  // P^T as O^T's B operand: N = rows, K = keys (the k slots of few_rows::fp8_p_slot), K-major.
  using SmemLayoutP =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kRows>, cute::Int<kKeys>>{}));
  using TiledMmaQk = decltype(cute::make_tiled_mma(QkAtom{}));
  using TiledMmaPv = decltype(cute::make_tiled_mma(PvAtom{}));

  struct alignas(1024) SharedMemoryPlan {
    alignas(1024) T q[kRows * kD];           // query tile, SmemLayoutQ (padding rows 0)
    alignas(1024) T k[kStages][kKeys * kD];  // K blocks, SmemLayoutK; P in the rope chunk
    float max[2][2][kRows];    // [round parity][consumer] running max after its block (base 2)
    float scale[2][2][kRows];  // [round parity][consumer] exp2(previous max - that max)
    float row_sum[kRows];      // consumer 1's row sums at the segment's end
    uint32_t row_nan[kRows];   // a non-finite O^T value of the row (segment's end)
    int64_t out_row[kRows];    // the row's offset in out or partial_o (-1: not written)
    float out_scale[kRows];    // and what its O is multiplied by
    const uint4* query_row[kRows];
    uint64_t full[kStages][kChunks];
    uint64_t empty_l[kStages];  // chunks 0..3 read: one arrive per consumer-0 warp
    uint64_t empty_r[kStages];  // chunks 4..8 read (V_R, P): one arrive per consumer-1 warp
    uint64_t q_full;            // the query tile's boxes landed (p.query_tma)
  };
  static constexpr size_t kSmemBytes = sizeof(SharedMemoryPlan) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one sm90 CTA");
};

__device__ __forceinline__ uint32_t fp8_barrier(Fp8Barrier b) { return static_cast<uint32_t>(b); }

// kDirect: a call of one request (the direct split): blockIdx.y = run of equal runs of the tile's
// blocks (tma::SplitCursor), partials in the uniform layout.
template <Elem Q, Elem KV, bool kDirect>
__global__ void __launch_bounds__(Fp8SeesawTraits::kThreads, 1)
    seesaw_fp8_kernel(const __grid_constant__ DecodeKernelParams p,
                      const __grid_constant__ CUtensorMap kv_map,
                      const __grid_constant__ CUtensorMap q_map) {
  using namespace cute;
  static_assert(Q == Elem::kFp8E4M3 && KV == Elem::kFp8E4M3, "an e4m3 query over an e4m3 cache");
  using Traits = Fp8SeesawTraits;
  using Plan = Traits::SharedMemoryPlan;
  using tma::mbar_arrive;
  using tma::mbar_wait;
  using tma::named_barrier_arrive;
  using tma::named_barrier_sync;
  using Cursor = std::conditional_t<kDirect, tma::SplitCursor, tma::PartCursor>;
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys, kL = Traits::kL;
  constexpr int kCols = kRows / 4;  // rows (N columns of O^T) per thread: 16
  constexpr int kPartialChunks = 3;
  constexpr float kPShift = 8.0f;  // P' = 2^8 exp2(s - m) <= 2^8 (e4m3's largest finite: 448)

  extern __shared__ uint8_t smem_raw[];
  Plan& smem = shared_plan<Plan>(smem_raw);

  pdl_wait();
  pdl_launch_dependents();

  const int issuers = tma::producer_issuers<Traits>(p);
  if (threadIdx.x == 0) tma::mbar_init(&smem.q_full, 1);  // fenced with the ring's barriers
  tma::init_ring_barriers<Traits>(smem, issuers);

  const int wg = cutlass::canonical_warp_group_idx();
  if (wg == 0) {
    tma::regs_dealloc<Traits::kProducerRegs>();
    const int piece = threadIdx.x / 32;
    if (piece < issuers && threadIdx.x % 32 == 0) {
      tma::prefetch_tensor_map(&kv_map);
      uint32_t used0, used1;
      tma::walk_segments<Cursor, Traits::kStages>(
          p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
            tma::produce_chunks<Traits, kDirect>(p, w, &kv_map, smem, piece, u0, u1);
          });
    }
    return;
  }

  // ---- consumer warpgroups ----
  tma::regs_alloc<Traits::kConsumerRegs>();
  const int cw = wg - 1;
  const int ctid = threadIdx.x - 128;
  const int wtid = threadIdx.x - 128 * wg;
  const int lane = threadIdx.x & 31;
  const int warp = wtid / 32;

  Traits::TiledMmaQk mma_qk;
  Traits::TiledMmaPv mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(wtid);
  auto thr_pv = mma_pv.get_thread_slice(wtid);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), Traits::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 18)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kKeys>>{});
  Tensor tSrT = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kKeys>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<Traits::kColsPerWg>, Int<kRows>>{});
  Tensor tOrT = partition_fragment_C(mma_pv, Shape<Int<64>, Int<kRows>>{});
  Tensor tOrA = thr_pv.partition_fragment_A(
      make_tensor(make_smem_ptr(smem.k[0]), Layout<Shape<Int<64>, Int<kKeys>>>{}));  // (MMA,1,2)
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kKeys>>{}));
  Tensor tOcO =
      thr_pv.partition_C(make_identity_tensor(Shape<Int<Traits::kColsPerWg>, Int<kRows>>{}));
  static_assert(size(decltype(tSrS){}) == 32 && size(decltype(tOrO){}) == 128, "fragments");

  // S's rows (M): slot 0 = tScS(0)'s row, slot 1 = 8 below. O^T's rows (N): slot s of 16.
  int my_row[2];
  my_row[0] = get<0>(tScS(0));
  my_row[1] = get<0>(tScS(2));
  auto o_row = [&](int s) { return 2 * (lane & 3) + (s & 1) + 8 * (s >> 1); };
  auto o_slot = [](int v) { return (v & 1) | ((v >> 2) << 1); };  // value v's row slot in O^T
  const float score_scale = bmm1_scale_of(p) * 1.4426950408889634f;

  // One arrive per warp: consumer 0's reads of the stage's chunks 0..3 and of its P are done
  // (empty_l), consumer 1's of chunks 4..8 (empty_r).
  auto release = [&](int stage) {
    __syncwarp();
    if (cute::elect_one_sync()) mbar_arrive(cw == 0 ? &smem.empty_l[stage] : &smem.empty_r[stage]);
  };

  uint32_t used = 0;  // parities of the blocks each stage held before the segment (bits 0..3)
  if constexpr (kDirect) {
    tma::prefetch_query_rows<kRows, Traits::kConsumerThreads, 1>(p, 0, blockIdx.x * kRows, ctid);
  }
  Cursor cursor;
  cursor.begin(p);
  if constexpr (!kDirect) {
    cursor.template prefetch_first_query<kRows, Traits::kConsumerThreads, 1>(p, ctid);
  }
  // The query tile through the tensor map on the direct split (one segment a CTA); the balanced
  // schedule's calls run the three-consumer kernel unless asked otherwise, and here its loop's
  // registers do not take the phase (spills 64 -> 144 bytes).
  const bool query_tma = kDirect && p.query_tma != 0;
  if (query_tma && ctid == 0) tma::prefetch_tensor_map(&q_map);
  uint32_t q_phase = 0;  // q_full's phase: one per tile through the tensor map
  tma::TileWork w;
  int64_t partial_row0;
  while (cursor.next(p, w, partial_row0)) {
    const int tile_rows = min(kRows, w.rows - w.row0);
    if (w.block_begin >= w.block_end) {
      tma::store_empty_segment(p, w, partial_row0, tile_rows, ctid, Traits::kConsumerThreads);
      continue;
    }
    // ---- the query tile ----
    // NOTE: every GEMM of the previous segment is complete (both consumers passed its end's
    // barriers), so its tile's bytes are free for the boxes.
    fp8_segment_query_tile<Traits::kConsumerThreads, true>(
        p, w, tile_rows, smem, ctid, query_tma, &q_map, q_phase,
        [] { named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads); });
    named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads);
    clear(tOrO);
    warpgroup_fence_operand(tOrO);

    // Masks: as the seesaw kernel (rule per S row; padding rows do not count).
    tma::RowRule rule[2];
    bool row_valid[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      row_valid[s] = my_row[s] < tile_rows;
      rule[s] = tma::dense_row_rule(p, w, my_row[s], row_valid[s]);
    }
    // The first key some row of the tile does not attend: blocks past it take the masked path in
    // every thread and clean their V rows from it on. Without a mask every row's causal limit is
    // at least the first token's, so a block before it is attended whole by every row.
    // NOTE: the thread's own rows' least limit, held beside it across the blocks, was spilled and
    // reloaded every block (docs/perf-notes.md, Change 137); it never differed from tile_limit
    // where the unmasked path can be taken.
    const int tile_limit =
        max(0, p.mask != nullptr ? w.seq_len - w.n : w.seq_len - w.n + w.row0 / p.num_heads + 1);

    float row_max[2] = {kNegInf, kNegInf};
    float row_sum[2] = {0.0f, 0.0f};

    // O^T = a O^T + V^T P^T of the block in `stage` (P in its rope chunk), over this consumer's
    // V columns; a of the thread's 16 rows read where `owner` left them (per m tile: held across
    // the GEMMs, the 16 factors spilled). Waits for its GEMMs.
    auto pv_gemm = [&](int stage, int par, int owner) {
      Tensor sP =
          make_tensor(make_smem_ptr(reinterpret_cast<Traits::T*>(
                          reinterpret_cast<uint8_t*>(smem.k[stage]) + Traits::kRopeChunkBytes)),
                      Traits::SmemLayoutP{});
      Tensor tOrP = thr_pv.partition_fragment_B(sP);  // (MMA, 1, 2)
      // NOTE: one partial: O^T (128 registers), two partials and the fragments would not fit.
      fp8_pv_pass<4, true, false>(mma_pv, tOrA, tOrP, tOrT, tOrO, tma::smem_addr(smem.k[stage]),
                                  Traits::kLeftChunks * cw, &smem.scale[par][owner][0], warp, lane);
    };
    const int num_blocks = w.block_end - w.block_begin;
    for (int round = 0; 2 * round < num_blocks; ++round) {
      const int par = round & 1;
      const bool has_odd = 2 * round + 1 < num_blocks;
      const bool mine = cw == 0 || has_odd;
      // Block 2 round + c in stage c + 2 (round % 2), each stage used every other round.
      const int stage0 = __shfl_sync(0xffffffffu, 2 * par, 0);
      const int stage1 = stage0 + 1;
      const int own_stage = cw == 0 ? stage0 : stage1;
      const uint32_t phase = ((used >> own_stage) + (round >> 1)) & 1;
      const int key0 = (w.block_begin + 2 * round + cw) * kKeys;

      if (mine) {
        // ---- qk_gemm: S = Q K^T, three partials of three chunks, each chunk issued as it lands
        Tensor sK = make_tensor(make_smem_ptr(smem.k[own_stage]), Traits::SmemLayoutK{});
        Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, 1, 18)
        auto issue = [&](int c0, auto& t) {
          warpgroup_fence_operand(t);
          CUTE_UNROLL
          for (int c = c0; c < c0 + kPartialChunks; ++c) {
            mbar_wait(&smem.full[own_stage][c], phase);
            warpgroup_arrive();
            mma_qk.accumulate_ = c == c0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
            cute::gemm(mma_qk, tSrQ(_, _, 2 * c), tSrK(_, _, 2 * c), t);
            mma_qk.accumulate_ = GMMA::ScaleOut::One;
            cute::gemm(mma_qk, tSrQ(_, _, 2 * c + 1), tSrK(_, _, 2 * c + 1), t);
          }
          warpgroup_commit_batch();
        };
        auto add = [&] {
          warpgroup_fence_operand(tSrS);
          warpgroup_fence_operand(tSrT);
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); ++v) tSrS(v) += tSrT(v);
        };
        issue(0, tSrS);
        issue(kPartialChunks, tSrT);
        warpgroup_wait<0>();
        add();
        issue(2 * kPartialChunks, tSrT);
        warpgroup_wait<0>();
        add();
      }

      float m_in[2];
      if (cw == 1) {
        // ---- consumer 0's hand-off: its max and factor (its P V comes after this consumer's
        // own hand-off, so that consumer 0 waits for that no longer than the softmax) ----
        named_barrier_sync(fp8_barrier(Fp8Barrier::kToSecond), Traits::kConsumerThreads);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          m_in[s] = smem.max[par][0][my_row[s]];
          row_sum[s] *= smem.scale[par][0][my_row[s]];
        }
      } else {
#pragma unroll
        for (int s = 0; s < 2; ++s) m_in[s] = row_max[s];
      }

      if (mine) {
        // ---- mask; row max; softmax; P into the rope chunk (e4m3) ----
        const bool unmasked = p.mask == nullptr && score_scale > 0.0f && key0 + kKeys <= tile_limit;
        float block_max[2] = {kNegInf, kNegInf};
        float m_new[2], a_new[2];
        uint8_t* stage_bytes = reinterpret_cast<uint8_t*>(smem.k[own_stage]);
        // The new maxima, the factors and P (e4m3) into the rope chunk, which only S read: once
        // in each branch below, so that the branches do not join over the block's scores (at a
        // join the unmasked path copied them into the masked path's registers).
        auto softmax_p = [&](float s_mul) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            fp8_new_max(block_max[s], m_in[s], s_mul, m_new[s], a_new[s]);
            row_sum[s] *= a_new[s];
          }
          fp8_store_p(tSrS, s_mul, kPShift, block_max, row_sum,
                      stage_bytes + Traits::kRopeChunkBytes, my_row, lane);
        };
        if (unmasked) {
          finite_block_max(tSrS, block_max);
          softmax_p(score_scale);
        } else {
          fp8_masked_scores(tSrS, tScS, rule, key0, score_scale, block_max);
          softmax_p(1.0f);
        }
        // V rows past the extent (TMA skips pages past it: stale or NaN bytes) become 0, and draft
        // keys some row of the tile does not attend lose non-finite values (both halves: the
        // other consumer reads its V columns after the hand-off).
        const int valid = min(kKeys, w.extent - key0);
        const int clean0 = min(valid, max(0, tile_limit - key0));
        if (clean0 < kKeys) {
          tma::clean_v_rows_e4m3(stage_bytes, kKeys, kL / Traits::kChunkCols, clean0, valid, wtid,
                                 128);
        }
        if ((lane & 3) == 0) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            smem.max[par][cw][my_row[s]] = m_new[s];
            smem.scale[par][cw][my_row[s]] = a_new[s];
          }
        }
        tma::fence_proxy_async_smem();
        named_barrier_sync(
            fp8_barrier(cw == 0 ? Fp8Barrier::kLocalFirst : Fp8Barrier::kLocalSecond), 128);
        named_barrier_arrive(fp8_barrier(cw == 0 ? Fp8Barrier::kToSecond : Fp8Barrier::kToFirst),
                             Traits::kConsumerThreads);
#pragma unroll
        for (int s = 0; s < 2; ++s) row_max[s] = m_new[s];
      } else {
#pragma unroll
        for (int s = 0; s < 2; ++s) row_max[s] = m_in[s];
      }
      if (cw == 1) {
        // ---- O_R = a0 O_R + V0_R^T P0^T ----
        pv_gemm(stage0, par, 0);
        release(stage0);
      }
      if (mine) {
        // ---- this consumer's own block: O^T = a O^T + V^T P^T ----
        pv_gemm(own_stage, par, cw);
        release(own_stage);
      }

      if (cw == 0 && has_odd) {
        // ---- consumer 1's hand-off: O_L = a1 O_L + V1_L^T P1^T ----
        named_barrier_sync(fp8_barrier(Fp8Barrier::kToFirst), Traits::kConsumerThreads);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          row_max[s] = smem.max[par][1][my_row[s]];
          row_sum[s] *= smem.scale[par][1][my_row[s]];
        }
        pv_gemm(stage1, par, 1);
        release(stage1);
      }
    }

    // ---- store_rows: sums over both consumers, then each consumer its O^T columns ----
    CUTE_UNROLL
    for (int v = 0; v < size(tOrO); ++v) {
      if (!isfinite(tOrO(v))) smem.row_nan[o_row(o_slot(v % 32))] = 1;
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 1);
      row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 2);
      if (cw == 1 && (lane & 3) == 0) smem.row_sum[my_row[s]] = row_sum[s];
    }
    named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads);
    constexpr float kPUnscale = 1.0f / 256.0f;
    if (cw == 0 && (lane & 3) < 2) {
      const int s = lane & 1;
      const int r = my_row[s];
      const RowTarget t =
          fp8_finish_segment_row<kL>(p, w, w.whole, partial_row0, r, r < tile_rows, row_max[s],
                                     row_sum[s] + smem.row_sum[r], kPUnscale, smem.row_nan[r] != 0);
      smem.out_row[r] = t.offset;
      smem.out_scale[r] = t.scale;
    }
    named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads);
    {
      int64_t row_out[kCols];
      float row_scale[kCols];
#pragma unroll
      for (int s = 0; s < kCols; ++s) {
        row_out[s] = smem.out_row[o_row(s)];
        row_scale[s] = smem.out_scale[o_row(s)] * kPUnscale;
      }
      const int d0 = Traits::kColsPerWg * cw + few_rows::fp8_o_row(get<0>(tOcO(0)));
      fp8_store_o_rows(p, static_cast<uint16_t*>(w.whole ? p.out : p.partial_o),
                       w.whole ? p.kv_lora_rank : kL, !w.whole || p.out_vec16, d0, 0, row_out,
                       row_scale, tOrO);
    }
    // The blocks each stage held, as the producer counts (block i in stage i % 4).
    // NOTE: the next segment's query tile and row_nan stores come after the first barrier of its
    // load; out_row, out_scale and row_nan are read above before any thread gets there.
    tma::advance_stage_parities<4>(used, num_blocks);
  }
}

template <Elem Q, Elem KV>
cudaError_t launch_seesaw_fp8(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                              const CUtensorMap& q_map, int num_tiles, bool direct_split,
                              cudaStream_t stream, bool pdl) {
  constexpr size_t smem = Fp8SeesawTraits::kSmemBytes;
  auto* kernel = direct_split ? &seesaw_fp8_kernel<Q, KV, true> : &seesaw_fp8_kernel<Q, KV, false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(num_tiles, direct_split ? params.num_splits : params.num_parts);
  return launch(kernel, grid, dim3(Fp8SeesawTraits::kThreads), smem, stream, pdl, params, kv_map,
                q_map);
}

}  // namespace mla::sm90::seesaw
