// The FP8 seesaw kernel with a third consumer warpgroup: an e4m3 query over an e4m3 cache, 64-row
// tiles of the balanced schedule (docs/sm90-fp8.md, "Three consumers").
//
// Grid mapping: as seesaw_fp8_kernel.cuh's balanced schedule (blockIdx.x = tile of 64 query rows
// of a request, blockIdx.y = part of the plan's line, tma::PartCursor).
//
// Warpgroup roles (512 threads; registers 24 / 152 / 152 / 184):
//   WG0 producer: the chunk producer over e4m3 boxes (64-byte swizzle), a ring of four 36 KB
//     stages, block i of a segment into stage i % 4.
//   WG1, WG2 owners: owner c takes the blocks of parity c: S = Q K^T for all 64 rows (18 wgmma
//     m64n64k32 into one accumulator, both operands in shared memory), the row softmax against the
//     running max after the previous block (the other owner's hand-off), P (e4m3, 2^8 exp2(S - m))
//     into the block's rope chunk, and its hand-off: the block's max and factor beside its stage,
//     then the stage's p_ready mbarrier, which every thread of the owner arrives on. Owner c also
//     holds O^T for V columns 128c .. 128c + 127 (two m tiles of N = 64 rows).
//   WG3 helper: no S and no softmax; O^T for V columns 256..511 (four m tiles).
//   Every consumer applies every block's P V to its columns in block order, each after the
//   block's p_ready: O^T = a O^T + V^T P^T, V^T from registers (few_rows::load_fp8_v_fragment),
//   each m tile's partial promoted in fp32; then releases the stage (every consumer thread
//   arrives on both of its empty barriers).
// Owner c, per block of its own: S; the previous block's max; its softmax and hand-off; the P V
// of the previous block and of its own. So one owner's softmax waits only for the other's, and the
// P V passes (half of them the helper's) run beside them.
#pragma once

#include <cute/tensor.hpp>

#include <climits>
#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/few_rows/few_rows_kernel.cuh"  // the e4m3 fragment helpers
#include "sm90/decode/output.cuh"
#include "sm90/decode/seesaw/fp8_block.cuh"
#include "sm90/decode/seesaw/row_max.cuh"
#include "sm90/decode/seesaw/seesaw_fp8_kernel.cuh"  // Fp8SeesawTraits
#include "sm90/decode/tma/chunk_producer.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"

namespace mla::sm90::seesaw {

// Named barriers of the three-consumer FP8 kernel (id 0 is __syncthreads).
enum class Fp8ThreeBarrier : uint32_t {
  kConsumers = 1,  // the three consumer warpgroups (384 threads)
};

// The two-consumer kernel's tiles, GMMA atoms and shared-memory layouts; 512 threads, the
// register split and the shared-memory plan its own.
struct Fp8ThreeTraits : Fp8SeesawTraits {
  static constexpr int kThreads = 512;
  static constexpr int kConsumers = 3;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kOwnerTiles = 2;   // m tiles of 64 V columns of consumers 0 and 1
  static constexpr int kHelperTiles = 4;  // of consumer 2 (columns 256..511)
  // NOTE: kLeftChunks (the producer's two refill halves) is the base's 4; every consumer
  // releases both halves.
  static constexpr int kProducerRegs = 24;
  static constexpr int kOwnerRegs = 152;
  static constexpr int kHelperRegs = 184;
  static_assert(128 * (kProducerRegs + 2 * kOwnerRegs + kHelperRegs) <= 65536, "register file");
  static_assert(kStages == 4, "block i of a segment in stage i % 4");

  struct alignas(1024) SharedMemoryPlan {
    alignas(1024) T q[kRows * kD];           // query tile, SmemLayoutQ (padding rows 0)
    alignas(1024) T k[kStages][kKeys * kD];  // K blocks, SmemLayoutK; P in the rope chunk
    // A block's hand-off lives with its stage: it is rewritten only after every consumer has
    // applied the block and released the stage.
    float max[kStages][kRows];    // running max after the stage's block (base 2)
    float scale[kStages][kRows];  // exp2(previous max - that max)
    float row_sum[kRows];         // consumer 1's row sums at the segment's end
    uint32_t row_nan[kRows];      // a non-finite O^T value of the row (segment's end)
    int64_t out_row[kRows];       // the row's offset in out or partial_o (-1: not written)
    float out_scale[kRows];       // and what its O is multiplied by
    const uint4* query_row[kRows];
    uint64_t full[kStages][kChunks];
    uint64_t empty_l[kStages];  // chunks 0..3 read: one arrive per consumer thread (384)
    uint64_t empty_r[kStages];  // chunks 4..8 read: the same arrivals
    uint64_t p_ready[kStages];  // the stage's P, max and factor: every thread of the owner
    uint64_t q_full;            // the query tile's boxes landed (p.query_tma)
    // The segment's state, written by consumer thread 0 between segments and read where a block
    // needs it (registers of the consumers' block loop go to O^T and S).
    tma::TileWork work;
    int64_t partial_row0;
    int more;        // the cursor found another segment
    int tile_limit;  // the first key some row of the tile does not attend
  };
  static constexpr size_t kSmemBytes = sizeof(SharedMemoryPlan) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one sm90 CTA");
};

template <Elem Q, Elem KV>
__global__ void __launch_bounds__(Fp8ThreeTraits::kThreads, 1)
    seesaw_fp8_three_kernel(const __grid_constant__ DecodeKernelParams p,
                            const __grid_constant__ CUtensorMap kv_map,
                            const __grid_constant__ CUtensorMap q_map) {
  using namespace cute;
  static_assert(Q == Elem::kFp8E4M3 && KV == Elem::kFp8E4M3, "an e4m3 query over an e4m3 cache");
  using Traits = Fp8ThreeTraits;
  using Plan = Traits::SharedMemoryPlan;
  using tma::mbar_arrive;
  using tma::mbar_wait;
  using tma::named_barrier_sync;
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys, kL = Traits::kL;
  constexpr int kStages = Traits::kStages;
  constexpr float kPShift = 8.0f;  // P' = 2^8 exp2(s - m) <= 2^8 (e4m3's largest finite: 448)
  constexpr uint32_t kConsumersBar = static_cast<uint32_t>(Fp8ThreeBarrier::kConsumers);

  extern __shared__ uint8_t smem_raw[];
  Plan& smem = shared_plan<Plan>(smem_raw);

  pdl_wait();
  pdl_launch_dependents();

  const int issuers = tma::producer_issuers<Traits>(p);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      for (int c = 0; c < Traits::kChunks; ++c) tma::mbar_init(&smem.full[s][c], issuers);
      tma::mbar_init(&smem.empty_l[s], Traits::kConsumerThreads);
      tma::mbar_init(&smem.empty_r[s], Traits::kConsumerThreads);
    }
    for (int s = 0; s < kStages; ++s) tma::mbar_init(&smem.p_ready[s], 128);
    tma::mbar_init(&smem.q_full, 1);
    tma::fence_mbar_init();
  }
  __syncthreads();

  const int wg = cutlass::canonical_warp_group_idx();
  if (wg == 0) {
    tma::regs_dealloc<Traits::kProducerRegs>();
    const int piece = threadIdx.x / 32;
    if (piece < issuers && threadIdx.x % 32 == 0) {
      tma::prefetch_tensor_map(&kv_map);
      uint32_t used0, used1;
      tma::walk_segments<tma::PartCursor, kStages>(
          p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
            tma::produce_chunks<Traits>(p, w, &kv_map, smem, piece, u0, u1);
          });
    }
    return;
  }

  // ---- consumer warpgroups ----
  const int cw = wg - 1;
  const int ctid = threadIdx.x - 128;
  const int wtid = threadIdx.x - 128 * wg;
  const int lane = threadIdx.x & 31;
  const int warp = wtid / 32;
  // The part's cursor, walked by consumer thread 0 (next_segment below).
  __shared__ tma::PartCursor shared_cursor;
  if (ctid == 0) shared_cursor.begin(p);
  const bool query_tma = p.query_tma != 0;
  if (query_tma && ctid == 0) tma::prefetch_tensor_map(&q_map);
  {
    tma::PartCursor first;  // the same first segment as the shared cursor's, for its query rows
    first.begin(p);
    first.template prefetch_first_query<kRows, Traits::kConsumerThreads, 1>(p, ctid);
  }
  // NOTE: the two roles run different code: every consumers' barrier is the unaligned form.
  auto sync_consumers = [] {
    tma::named_barrier_sync<false>(kConsumersBar, Traits::kConsumerThreads);
  };

  // One role's whole walk: kHelper (consumer 2) takes no block's S and applies every block's P V
  // to V columns 256..511; the owners (consumers 0 and 1) take the blocks of their parity and apply
  // every block's P V to columns 128c .. 128c + 127.
  auto consume = [&](auto helper_tag) {
    constexpr bool kHelper = decltype(helper_tag)::value;
    constexpr int kMTiles = kHelper ? Traits::kHelperTiles : Traits::kOwnerTiles;
    constexpr int kCols = 64 * kMTiles;  // this consumer's V columns
    const int col0 = kHelper ? Traits::kOwnerTiles * 128 : kCols * cw;
    Traits::TiledMmaQk mma_qk;
    Traits::TiledMmaPv mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(wtid);
    auto thr_pv = mma_pv.get_thread_slice(wtid);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q), Traits::SmemLayoutQ{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 18)
    Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kCols>, Int<kRows>>{});
    Tensor tOrT = partition_fragment_C(mma_pv, Shape<Int<64>, Int<kRows>>{});
    Tensor tOrA = thr_pv.partition_fragment_A(
        make_tensor(make_smem_ptr(smem.k[0]), Layout<Shape<Int<64>, Int<kKeys>>>{}));  // (MMA,1,2)
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kKeys>>{}));
    Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kCols>, Int<kRows>>{}));
    static_assert(size(decltype(tOrO){}) == 32 * kMTiles, "fragments");

    // S's rows (M): slot 0 = tScS(0)'s row, slot 1 = 8 below. O^T's rows (N): slot s of 16.
    int my_row[2];
    my_row[0] = get<0>(tScS(0));
    my_row[1] = get<0>(tScS(2));
    auto o_row = [&](int s) { return 2 * (lane & 3) + (s & 1) + 8 * (s >> 1); };
    auto o_slot = [](int v) { return (v & 1) | ((v >> 2) << 1); };  // value v's row slot in O^T
    const float score_scale = bmm1_scale_of(p) * 1.4426950408889634f;

    // This consumer's reads of the stage are done: both halves.
    // NOTE: every consumer thread arrives (384 arrivals): each releases its own reads of the stage
    // (its P V's factors among them), which the next owner's writes four blocks later follow
    // through the producer's refill; one lane a warp left the other lanes' reads unordered for
    // racecheck.
    auto release = [&](int stage) {
      mbar_arrive(&smem.empty_l[stage]);
      mbar_arrive(&smem.empty_r[stage]);
    };
    uint32_t used = 0;  // parities of the blocks each stage held before the segment
    // Block b of the segment: its stage and the phase of that stage's barriers (the producer's
    // count: block i in stage i % kStages).
    auto stage_of = [](int b) { return b % kStages; };
    auto phase_of = [&](int b) {
      return ((used >> (b % kStages)) + static_cast<uint32_t>(b) / kStages) & 1;
    };
    auto p_wait = [&](int b) { mbar_wait(&smem.p_ready[stage_of(b)], phase_of(b)); };

    // Each segment's state: consumer thread 0 walks the cursor (and, with p.query_tma, asks for
    // the segment's query tile at once: every GEMM of the previous segment is complete, its
    // end's barriers passed); the other consumers read what it wrote after the barrier. Every
    // read of the previous segment's state is before that segment's last barrier.
    uint32_t q_phase = 0;  // q_full's phase: one per tile through the tensor map
    auto next_segment = [&] {
      if (ctid == 0) {
        tma::TileWork w;
        int64_t row0 = 0;
        const bool more = shared_cursor.next(p, w, row0);
        smem.more = more;
        if (more && query_tma && w.block_begin < w.block_end) {
          tma::issue_query_tile<Traits::kChunks, Traits::kChunkCols, 1>(p, w, &q_map, &smem.q_full,
                                                                        smem.q);
        }
        if (more) {
          smem.work = w;
          smem.partial_row0 = row0;
          // The first key some row of the tile does not attend: the first row's causal limit
          // (every later row attends at least as far), or the first draft key under a mask.
          const int first_query = w.seq_len - w.n;
          smem.tile_limit =
              max(0, p.mask != nullptr ? first_query : first_query + w.row0 / p.num_heads + 1);
        }
      }
      sync_consumers();
      return smem.more != 0;
    };

    while (next_segment()) {
      const tma::TileWork& w = smem.work;
      const int tile_rows = min(kRows, w.rows - w.row0);
      if (w.block_begin >= w.block_end) {
        tma::store_empty_segment(p, w, smem.partial_row0, tile_rows, ctid,
                                 Traits::kConsumerThreads);
        sync_consumers();
        continue;
      }
      // ---- the query tile (with p.query_tma asked for in next_segment) ----
      fp8_segment_query_tile<Traits::kConsumerThreads, false>(
          p, w, tile_rows, smem, ctid, query_tma, &q_map, q_phase, sync_consumers);
      sync_consumers();
      clear(tOrO);
      warpgroup_fence_operand(tOrO);

      // This consumer's running max after its last own block (-inf before one) and its row sums
      // relative to it.
      float row_max[2] = {kNegInf, kNegInf};
      float row_sum[2] = {0.0f, 0.0f};

      // O^T = a O^T + V^T P^T of the block in `stage` (P in its rope chunk), over this
      // consumer's V columns; a of the thread's 16 rows read where the block's owner left them.
      auto pv_gemm = [&](int stage) {
        Tensor sP =
            make_tensor(make_smem_ptr(reinterpret_cast<Traits::T*>(
                            reinterpret_cast<uint8_t*>(smem.k[stage]) + Traits::kRopeChunkBytes)),
                        Traits::SmemLayoutP{});
        Tensor tOrP = thr_pv.partition_fragment_B(sP);  // (MMA, 1, 2)
        // NOTE: the helper loads the next m tile's fragments and the factors after each wait (its
        // O^T holds 128 registers), the owners under the GEMMs.
        fp8_pv_pass<kMTiles, !kHelper, !kHelper>(mma_pv, tOrA, tOrP, tOrT, tOrO,
                                                 tma::smem_addr(smem.k[stage]), col0 / 64,
                                                 &smem.scale[stage][0], warp, lane);
      };

      const int num_blocks = w.block_end - w.block_begin;
      // P V in block order, through block `last` (each after its hand-off).
      int applied = 0;
      auto apply_through = [&](int last) {
        for (; applied <= last; ++applied) {
          p_wait(applied);
          pv_gemm(stage_of(applied));
          release(stage_of(applied));
        }
      };
      if constexpr (kHelper) {
        apply_through(num_blocks - 1);
      } else {
        // Owner c: S of its block 2r + c, the previous block's max, its softmax and hand-off, then
        // the P V of the blocks through its own (the previous one's comes after this softmax, so
        // that S and the softmax of a block wait only for the other owner's softmax).
        for (int own = cw; own - cw < num_blocks; own += 2) {
          if (own < num_blocks) {
            const int own_stage = stage_of(own);
            const uint32_t phase = phase_of(own);
            const int key0 = (smem.work.block_begin + own) * kKeys;
            // ---- S = Q K^T: one accumulator over the block's 18 k steps, each chunk issued as
            // it lands ----
            // NOTE: S in the P V partial's registers (the same m64n64 fp32 fragment; never live
            // together), so that the owner's S and O^T fit its 152 registers.
            Tensor tSrS =
                make_tensor(tOrT.data(),
                            partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kKeys>>{}).layout());
            Tensor sK = make_tensor(make_smem_ptr(smem.k[own_stage]), Traits::SmemLayoutK{});
            Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, 1, 18)
            warpgroup_fence_operand(tSrS);
            CUTE_UNROLL
            for (int c = 0; c < Traits::kChunks; ++c) {
              mbar_wait(&smem.full[own_stage][c], phase);
              warpgroup_arrive();
              mma_qk.accumulate_ = c == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
              cute::gemm(mma_qk, tSrQ(_, _, 2 * c), tSrK(_, _, 2 * c), tSrS);
              mma_qk.accumulate_ = GMMA::ScaleOut::One;
              cute::gemm(mma_qk, tSrQ(_, _, 2 * c + 1), tSrK(_, _, 2 * c + 1), tSrS);
            }
            warpgroup_commit_batch();
            warpgroup_wait<0>();
            warpgroup_fence_operand(tSrS);

            // ---- the running max after the previous block ----
            float m_in[2] = {kNegInf, kNegInf};
            if (own > 0) {
              p_wait(own - 1);
#pragma unroll
              for (int s = 0; s < 2; ++s) m_in[s] = smem.max[stage_of(own - 1)][my_row[s]];
            }

            // ---- mask; row max; softmax; P into the rope chunk (e4m3) ----
            const bool unmasked =
                p.mask == nullptr && score_scale > 0.0f && key0 + kKeys <= smem.tile_limit;
            float block_max[2] = {kNegInf, kNegInf};
            float m_new[2], a_new[2];
            uint8_t* stage_bytes = reinterpret_cast<uint8_t*>(smem.k[own_stage]);
            // The new maxima, the factors and P (e4m3) into the rope chunk, which only S read:
            // once in each branch below, so that the branches do not join over the block's scores
            // (at a join the unmasked path copied them into the masked path's registers).
            auto softmax_p = [&](float s_mul) {
#pragma unroll
              for (int s = 0; s < 2; ++s) {
                fp8_new_max(block_max[s], m_in[s], s_mul, m_new[s], a_new[s]);
                // This consumer's sums were relative to its own last max (block_max: m_use).
                const float own_a =
                    row_max[s] == m_new[s] ? 1.0f : tma::exp2_ftz(row_max[s] - block_max[s]);
                row_sum[s] *= own_a;
                row_max[s] = m_new[s];
              }
              fp8_store_p(tSrS, s_mul, kPShift, block_max, row_sum,
                          stage_bytes + Traits::kRopeChunkBytes, my_row, lane);
            };
            if (unmasked) {
              finite_block_max(tSrS, block_max);
              softmax_p(score_scale);
            } else {
              // Masks: as the seesaw kernel (rule per S row; padding rows do not count).
              tma::RowRule rule[2];
#pragma unroll
              for (int s = 0; s < 2; ++s) {
                const tma::TileWork& sw = smem.work;
                rule[s] = tma::dense_row_rule(p, sw, my_row[s],
                                              my_row[s] < min(kRows, sw.rows - sw.row0));
              }
              fp8_masked_scores(tSrS, tScS, rule, key0, score_scale, block_max);
              softmax_p(1.0f);
            }
            // V rows past the extent become 0, and draft keys some row of the tile does not
            // attend lose non-finite values (every consumer reads its V columns after the
            // hand-off).
            const int valid = min(kKeys, smem.work.extent - key0);
            const int clean0 = min(valid, max(0, smem.tile_limit - key0));
            if (clean0 < kKeys) {
              tma::clean_v_rows_e4m3(stage_bytes, kKeys, kL / Traits::kChunkCols, clean0, valid,
                                     wtid, 128);
            }
            if ((lane & 3) == 0) {
#pragma unroll
              for (int s = 0; s < 2; ++s) {
                smem.max[own_stage][my_row[s]] = m_new[s];
                smem.scale[own_stage][my_row[s]] = a_new[s];
              }
            }
            tma::fence_proxy_async_smem();
            // NOTE: every thread arrives: each releases its own stores, which the other
            // consumers' waits acquire.
            mbar_arrive(&smem.p_ready[own_stage]);
          }
          apply_through(min(own, num_blocks - 1));
        }
        apply_through(num_blocks - 1);
      }

      // ---- store_rows: sums over the owners, then each consumer its O^T columns ----
      const int last_stage = stage_of(num_blocks - 1);
      float m_final[2];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        m_final[s] = smem.max[last_stage][my_row[s]];
        if constexpr (!kHelper) {
          const float m_use = m_final[s] == kNegInf ? 0.0f : m_final[s];
          const float own_a = row_max[s] == m_final[s] ? 1.0f : exp2f(row_max[s] - m_use);
          row_sum[s] *= own_a;
        }
      }
      CUTE_UNROLL
      for (int v = 0; v < size(tOrO); ++v) {
        if (!isfinite(tOrO(v))) smem.row_nan[o_row(o_slot(v % 32))] = 1;
      }
      if constexpr (!kHelper) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 1);
          row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 2);
          if (cw == 1 && (lane & 3) == 0) smem.row_sum[my_row[s]] = row_sum[s];
        }
      }
      // The segment's state the stores need, read before the barrier after which consumer
      // thread 0 may write the next segment's.
      const bool whole = smem.work.whole;
      const int tile_rows_end = min(kRows, smem.work.rows - smem.work.row0);
      sync_consumers();
      constexpr float kPUnscale = 1.0f / 256.0f;
      if (!kHelper && cw == 0 && (lane & 3) < 2) {
        const tma::TileWork& sw = smem.work;
        const int64_t partial_row0 = smem.partial_row0;
        const int s = lane & 1;
        const int r = my_row[s];
        const RowTarget t = fp8_finish_segment_row<kL>(
            p, sw, whole, partial_row0, r, r < tile_rows_end, m_final[s],
            row_sum[s] + smem.row_sum[r], kPUnscale, smem.row_nan[r] != 0);
        smem.out_row[r] = t.offset;
        smem.out_scale[r] = t.scale;
      }
      sync_consumers();
      {
        const int cols = whole ? p.kv_lora_rank : kL;
        uint16_t* base = static_cast<uint16_t*>(whole ? p.out : p.partial_o);
        const bool words = !whole || p.out_vec16;
        const int d0 = col0 + few_rows::fp8_o_row(get<0>(tOcO(0)));
        // NOTE: the rows' targets in two halves of eight (the helper's O^T holds 128 registers).
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          asm volatile("" ::: "memory");  // this half's targets are read here, not hoisted
          int64_t row_out[8];
          float row_scale[8];
#pragma unroll
          for (int s = 0; s < 8; ++s) {
            row_out[s] = smem.out_row[o_row(8 * h + s)];
            row_scale[s] = smem.out_scale[o_row(8 * h + s)] * kPUnscale;
          }
          fp8_store_o_rows(p, base, cols, words, d0, 8 * h, row_out, row_scale, tOrO);
        }
      }
      // The blocks each stage held, as the producer counts (block i in stage i % kStages).
      // NOTE: the next segment's query tile and row_nan stores come after the first barrier of
      // its load; out_row, out_scale, row_nan and the row sums are read above before any thread
      // gets there.
      tma::advance_stage_parities<4>(used, num_blocks);
    }
  };
  if (cw == 2) {
    tma::regs_alloc<Traits::kHelperRegs>();
    consume(std::true_type{});
  } else {
    tma::regs_alloc<Traits::kOwnerRegs>();
    consume(std::false_type{});
  }
}

template <Elem Q, Elem KV>
cudaError_t launch_seesaw_fp8_three(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                                    const CUtensorMap& q_map, int num_tiles, cudaStream_t stream,
                                    bool pdl) {
  constexpr size_t smem = Fp8ThreeTraits::kSmemBytes;
  auto* kernel = &seesaw_fp8_three_kernel<Q, KV>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(num_tiles, params.num_parts);
  return launch(kernel, grid, dim3(Fp8ThreeTraits::kThreads), smem, stream, pdl, params, kv_map,
                q_map);
}

}  // namespace mla::sm90::seesaw
