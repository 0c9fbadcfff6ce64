// Seesaw decode kernel: the TMA pipeline (tma/) with each consumer scoring whole blocks in turn.
//
// Grid mapping: blockIdx.x = tile of 64 query rows of a request (row = token * H + head; rows past
// the request's n_b * H are zero padding), blockIdx.y = part of the balanced schedule (params.h,
// schedule::Request; planned on the device by schedule_kernel.cu): the CTA walks its part's
// segments (one run of 64-key blocks of one request each) in order and writes each segment's
// partial (max, sum, o = bmm2 O / sum in the out type: params.h) of its rows, which the combine
// kernel merges, or, for a request of one segment, its rows of out and lse. The grid is one wave.
// Direct split (kDirect; a call of one request, no plan kernel): blockIdx.y = run of equal runs
// of the tile's blocks, one segment per CTA (tma::SplitCursor), partials in the uniform layout.
//
// Warpgroup roles (384 threads):
//   WG0 producer: one K block (64 keys x 576) per stage of a 2-stage ring, its TMA boxes issued by
//     one thread per page piece of a block (chunk_producer.cuh, producer_issuers).
//   WG1, WG2 consumers: consumer c computes the whole S = Q K^T of every block of parity c (the
//     split's blocks taken in rounds of two: block 2r to consumer 0, block 2r + 1 to consumer 1),
//     its softmax against the running max handed over by the other consumer, and writes P into the
//     block's rope chunk for the other consumer. Consumer c owns O[:, 256c : 256c + 256] and
//     applies both blocks' P V to it, its own block's with P from registers. One consumer's
//     softmax runs while the other's GEMMs keep the tensor cores busy.
// Per round, with m the running max and the hand-offs through shared memory:
//   c0: S0; m0 = max(m, rowmax S0), a0 = exp2(m - m0), P0 = exp2(S0 - m0) -> c1
//       O_L = a0 O_L + P0 V0_L;                         (waits for c1) O_L = a1 O_L + P1 V1_L
//   c1: S1;                  (waits for c0) O_R = a0 O_R + P0 V0_R  while
//       m1 = max(m0, rowmax S1), a1 = exp2(m0 - m1), P1 = exp2(S1 - m1) -> c0; O_R = a1 O_R + P1
//       V1_R
// (max(m, x) here: x where it exceeds m by more than kMaxSlack, else m.)
// Sparse calls (kSparse) take their gathered blocks one at a time instead: consumer 0 computes
// every block's S, softmax and O_L, consumer 1 its O_R from consumer 0's P, so that the producer
// fills one stage while the other is consumed (docs/sm90-sparse.md, One block at a time).
// Longer rationale: docs/sm90-seesaw.md (the max rule: Softmax).
#pragma once

#include <cute/tensor.hpp>

#include <array>
#include <atomic>
#include <climits>
#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/output.cuh"
#include "sm90/decode/seesaw/launch.h"
#include "sm90/decode/seesaw/row_max.cuh"
#include "sm90/decode/seesaw/traits.h"
#include "sm90/decode/tma/chunk_producer.cuh"
#include "sm90/decode/tma/fp8_ring.cuh"
#include "sm90/decode/tma/gather.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"

namespace mla::sm90::seesaw {

using tma::fence_proxy_async_smem;
using tma::mbar_arrive;
using tma::mbar_arrive_expect_tx;
using tma::mbar_init;
using tma::mbar_wait;
using tma::named_barrier_and;
using tma::named_barrier_arrive;
using tma::named_barrier_sync;

__device__ __forceinline__ uint32_t barrier_id(NamedBarrier b) { return static_cast<uint32_t>(b); }

// Two values rounded to nearest in the 16-bit type T, the first in the low half: one F2FP.
// NOTE: with two 16-bit conversions ptxas packed the pair the other way round and swapped the
// halves (a PRMT per word) when the word was also a wgmma operand.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t word;
  if constexpr (std::is_same_v<T, cute::half_t>) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(word) : "f"(hi), "f"(lo));
  } else {
    static_assert(std::is_same_v<T, cute::bfloat16_t>, "16-bit element types");
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(word) : "f"(hi), "f"(lo));
  }
  return word;
}

// Where row r (< kRows) of a one-segment request's tile goes: its offsets in out and lse, its
// head's sink, and the bmm2 scale (the segment's end turns it into the row's out scale).
template <typename Plan>
__device__ __forceinline__ void set_out_row(const DecodeKernelParams& p, Plan& smem,
                                            const tma::TileWork& w, int tile_rows, int r) {
  int64_t out_row = -1, lse_row = -1;
  float sink = kNegInf;
  int t, h;
  if (r < tile_rows && row_token(p, w.row0 + r, w.token0, t, h)) {
    out_row = out_offset(p, t, h);
    if (p.lse != nullptr) lse_row = lse_offset(p, t, h);
    sink = sink_of(p, h);
  }
  smem.out_row[r] = out_row;
  smem.lse_row[r] = lse_row;
  smem.out_sink[r] = sink;
  smem.out_scale[r] = bmm2_scale_of(p);
}

// kClean: the tile's rows may attend the request's draft keys unequally (a custom mask, or tiles
// that span two tokens: H not a multiple of 64 with q_len > 1). Their V rows then lose non-finite
// values once S is computed, and an attended -inf score becomes NaN (tma::clean_v_rows): a NaN or
// inf in a draft key reaches exactly the rows that attend it (contract section 1). Other calls
// run without the extra code.
// Whether a call of (Q, KV) runs fp16 GEMMs over a bf16 query scaled per row by a power of two into
// fp16's range (tma::load_query_tile_rows, kScaledHalf): a call over an e4m3 cache, whose blocks
// then widen to fp16 (one instruction per pair, four to bf16: docs/sm90-fp8.md), dense or sparse.
template <Elem Q, Elem KV, bool kSparse>
inline constexpr bool kScaledSeesawQuery = Q == Elem::kBf16&& KV == Elem::kFp8E4M3;
template <Elem Q, Elem KV, bool kSparse>
inline constexpr Elem kSeesawCompute =
    kScaledSeesawQuery<Q, KV, kSparse> ? Elem::kFp16 : tma::Formats<Q, KV>::kCompute;

// An unpaired sparse call over fp8_ds_mla rows, a token a CTA row (64 heads or fewer a token, or
// pairs not resident), of long splits (kAheadUnpaired in seesaw_kernel): its rows are loaded a
// block ahead into registers by two producer warpgroups, half the rows each, beside the two
// consumers: 512 threads, whose register target (128) caps single instructions, so the consumers'
// P V runs as two wgmmas of N = 128 a k step (SeesawTraits' kPvN).
template <Elem KV, bool kPair, bool kSparse, bool kTokenRows, bool kShortSplits>
inline constexpr bool kAheadUnpairedOf =
    kSparse && !kPair && !kTokenRows && !kShortSplits && KV == Elem::kFp8DsMla;
// The CTA's threads: a producer warpgroup (two where rows are loaded ahead unpaired) and the two
// consumer warpgroups.
template <Elem Q, Elem KV, bool kPair, bool kSparse, bool kTokenRows, bool kShortSplits>
inline constexpr int kSeesawThreads = kAheadUnpairedOf<KV, kPair, kSparse, kTokenRows, kShortSplits>
                                          ? 512
                                          : SeesawTraits<tma::Formats<Q, KV>::kCompute>::kThreads;

// Q, KV: the query's and kv_cache's formats (tma::Formats): an e4m3 cache is widened in shared
// memory by the producer warpgroup (tma/fp8_ring.cuh), an e4m3 query as its tile loads, a bf16
// query over it scaled into fp16 (kScaledSeesawQuery).
// kSparse: a sparse call, a segment per token row of the CTA (tma::SparseCursor: query-row tile
// blockIdx.x of the token's heads, split blockIdx.z; row blockIdx.y of each round of gridDim.y),
// its blocks gathered by index (tma/gather.cuh); the keys are the token's counted entries, each
// attended by every row unless it is -1.
// kTokenRows (kSparse): the grid has fewer token rows than tokens, each CTA walks several
// (tma::SparseCursor); else one token per CTA (tma::SparseTokenCursor).
// kEvictFirst: the balanced schedule's cache boxes carry the evict-first L2 policy the direct
// split's always carry (16-bit caches, unpaired, uncleaned: the route's evict_first).
// kShortSplits (kSparse, unpaired fp8_ds_mla rows): splits of fewer than kAheadMinBlocks blocks,
// gathered on the landing path (kAheadUnpaired below).
template <Elem Q, Elem KV, bool kDirect, bool kPair, bool kClean, bool kSparse = false,
          bool kTokenRows = false, bool kEvictFirst = false, bool kShortSplits = false>
__global__ void __launch_bounds__((kSeesawThreads<Q, KV, kPair, kSparse, kTokenRows, kShortSplits>),
                                  1) seesaw_kernel(const __grid_constant__ DecodeKernelParams p,
                                                   const __grid_constant__ CUtensorMap kv_map,
                                                   const __grid_constant__ CUtensorMap q_map) {
  using namespace cute;
  using F = tma::Formats<Q, KV>;
  // A bf16 query over an e4m3 cache: fp16 GEMMs over the query scaled per row.
  constexpr bool kScaledQuery = kScaledSeesawQuery<Q, KV, kSparse>;
  // An unpaired sparse call over fp8_ds_mla rows, a token a CTA row (64 heads or fewer a token, or
  // pairs not resident), of long splits: two producer warpgroups (0 and 3) load each block's rows
  // one block ahead into registers, 32 rows each (tma::gather_ahead_blocks, kHalfRows, 72
  // registers), consumer 0 keeps 208 and consumer 1, which only applies P V_R, runs its own copy
  // of the loop at 160 (kSplitConsumers); P V in wgmmas of N = 128 (kAheadUnpairedOf). Splits of
  // few blocks (kShortSplits) keep the landing path, which starts a split sooner.
  constexpr bool kAheadUnpaired = kAheadUnpairedOf<KV, kPair, kSparse, kTokenRows, kShortSplits>;
  constexpr int kProducers = kAheadUnpaired ? 2 : 1;  // producer warpgroups
  using Traits = SeesawTraits<kSeesawCompute<Q, KV, kSparse>, kAheadUnpaired ? 128 : 256>;
  using T = typename Traits::T;
  using Plan = typename Traits::SharedMemoryPlan;
  using Cursor = std::conditional_t<
      kSparse, std::conditional_t<kTokenRows, tma::SparseCursor<>, tma::SparseTokenCursor>,
      std::conditional_t<kDirect, tma::SplitCursor, tma::PartCursor>>;
  static_assert(!kSparse || !(kDirect || kClean), "sparse calls: their own cursor");
  static_assert(kSparse || !kTokenRows, "token rows: sparse calls");
  // Gathered blocks: sparse calls, and the fp8_ds_mla cache (no TMA box widens it) of dense ones.
  constexpr bool kGather = kSparse || KV == Elem::kFp8DsMla;
  // kPair with kSparse: a token's two tiles gather e4m3 rows as a pair (tma::gather_ahead_blocks).
  constexpr bool kGatherPair = kGather && kPair;
  constexpr bool kGatherAhead = kGatherPair || kAheadUnpaired;
  constexpr bool kSplitConsumers = kAheadUnpaired;
  // The consumers' named barriers: reached from two copies of their loop where kSplitConsumers.
  constexpr bool kAlignedBars = !kSplitConsumers;
  static_assert(!kGatherPair || (kSparse && tma::GatherFormat<KV>::kE4m3),
                "gathered blocks run paired only on sparse calls over e4m3 rows");
  // The producer warpgroup's registers: 56 where it widens or gathers, 88 where it holds a block
  // ahead in registers (the pair's gather).
  constexpr bool kWideProducer = F::kFp8Cache || kGather;
  // A 16-bit query over a cache of the same type, dense: its tiles may come through the query
  // tensor map (p.query_tma; tma::make_query_tensor_map), one thread issuing nine boxes.
  constexpr bool kQueryTma = !kSparse && !kGather && !kScaledQuery && !F::kFp8Query && Q == KV &&
                             (Q == Elem::kBf16 || Q == Elem::kFp16);
  // A 16-bit query of a sparse call, one token a CTA: its tile may come through the query tensor
  // map too (p.query_tma: a uniform call, H a multiple of 64), asked for before the cursor reads
  // the token's extent, which the tile does not need (docs/sm90-sparse.md, The CTA's start and
  // end).
  constexpr bool kSparseQueryTma = kSparse && !kTokenRows && !kScaledQuery && !F::kFp8Query &&
                                   (Q == Elem::kBf16 || Q == Elem::kFp16);
  // The fp8 ring (tma/fp8_ring.cuh): its widening warps store keys past the extent as zeros.
  constexpr bool kWidenRing = F::kFp8Cache && !kGather;
  static_assert(!(kDirect && kPair),
                "pairs run on the balanced schedule (docs/sm90-seesaw.md, Pairs)");
  static_assert(!(kClean && kPair), "calls that need cleaning run unpaired");
  static_assert(
      !kEvictFirst || (!kDirect && !kPair && !kClean && !kSparse && has_evict_first(Q, KV)),
      "evict-first instantiations: the balanced schedule's 16-bit calls only");
  static_assert(!(F::kFp8Cache && kPair) || kGatherPair, "fp8 caches run unpaired (dense)");
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys;
  constexpr float kMaxSlack = 8.0f;  // base 2

  extern __shared__ uint8_t smem_raw[];
  Plan& smem = shared_plan<Plan>(smem_raw);

  pdl_wait();  // inputs may come from the previous grid in the stream
  pdl_launch_dependents();

  if constexpr (kQueryTma || kSparseQueryTma) {
    // NOTE: fenced and published with the ring's (or the gather's) barriers below.
    if (threadIdx.x == 0) mbar_init(&smem.q_full, 1);
  }
  const int issuers = tma::producer_issuers<Traits>(p);
  if constexpr (kGatherAhead) {
    tma::init_gather_ahead_barriers<Traits, KV, kPair, kProducers>(smem);
  } else if constexpr (kGather) {
    tma::init_gather_barriers<Traits, KV>(smem);
  } else {
    tma::init_ring_barriers<Traits, kPair, F::kFp8Cache>(smem, issuers);
  }
  // kPair: the other CTA of the cluster (tile blockIdx.x ^ 1) walks the same blocks.
  const uint32_t rank = kPair ? tma::cluster_ctarank() : 0;

  // NOTE: CUTLASS broadcasts the index from lane 0, so the compiler knows it is warp-uniform: the
  // consumer index, its stage addresses and the GMMA descriptors then live in uniform registers
  // (from threadIdx.x / 128, ~4 R2UR and the descriptor arithmetic came before every wgmma:
  // docs/sm90-seesaw.md, Resources).
  const int wg = cutlass::canonical_warp_group_idx();
  if (wg == 0 || (kProducers == 2 && wg == 3)) {
    // ---- producer warpgroup(s): every segment's blocks through one ring; lane 0 of warp q issues
    // page piece q ----
    if constexpr (kAheadUnpaired) {
      tma::regs_dealloc<72>();
    } else {
      tma::regs_dealloc<tma::RegisterSplit<Traits, kWideProducer, kGatherPair>::kProducer>();
    }
    if constexpr (kGatherAhead) {
      uint32_t used0, used1;
      tma::walk_segments<Cursor>(
          p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
            if constexpr (kAheadUnpaired) {
              tma::gather_ahead_blocks<Traits, KV, false, true>(p, w, smem, threadIdx.x & 127, u0,
                                                                u1, wg == 0 ? 0u : 1u);
            } else {
              tma::gather_ahead_blocks<Traits, KV, kPair>(p, w, smem, threadIdx.x, u0, u1, rank);
            }
          });
      if constexpr (kPair) tma::drain_pair_ring<Traits>(smem, used0, used1);
      return;
    } else if constexpr (kGather) {
      uint32_t used0, used1;
      tma::walk_segments<Cursor>(
          p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
            tma::gather_blocks<Traits, KV, true, kSparse>(p, w, smem, threadIdx.x, u0, u1);
          });
      return;
    } else if constexpr (F::kFp8Cache) {
      // fp8 cache: lane q of warp 0 issues page piece q into the landing areas, warps 1..3 widen.
      // A block's left half lands once consumer 0 has released V_L, before consumer 1 releases
      // the rest (tma/fp8_ring.cuh, split landing).
      const bool issuer = threadIdx.x < issuers;
      if (threadIdx.x >= 32 || issuer) {
        if (issuer) tma::prefetch_tensor_map(&kv_map);
        uint32_t used0, used1;
        tma::walk_segments<Cursor>(
            p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
              if (issuer) {
                tma::issue_fp8_chunks<Traits, kDirect>(p, w, &kv_map, smem, threadIdx.x, u0, u1,
                                                       true);
              } else {
                tma::widen_fp8_chunks<Traits>(w, smem, threadIdx.x - 32, u0, u1,
                                              barrier_id(NamedBarrier::kWiden), true);
              }
            });
      }
      return;
    }
    const int piece = threadIdx.x / 32;
    if (piece < issuers && threadIdx.x % 32 == 0) {
      tma::prefetch_tensor_map(&kv_map);
      uint32_t used0, used1;  // blocks each stage has held (its barriers' phase)
      tma::walk_segments<Cursor>(p, used0, used1,
                                 [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
                                   tma::produce_chunks<Traits, kDirect || kEvictFirst, kPair>(
                                       p, w, &kv_map, smem, piece, u0, u1, rank);
                                 });
      if constexpr (kPair) tma::drain_pair_ring<Traits>(smem, used0, used1);
    }
    return;
  }

  // ---- consumer warpgroups ----
  // kRole: the consumer this copy of the loop runs (kSplitConsumers), -1 for either (cw from wg).
  auto consumers = [&p, &smem, &q_map, wg, rank](auto role) {
    constexpr int kRole = decltype(role)::value;
    const int cw = kRole >= 0 ? kRole : wg - 1;  // consumer index: its block parity and O half
    const int ctid = threadIdx.x - 128;          // 0..255 over both consumers
    const int wtid = threadIdx.x - 128 * wg;     // 0..127 within the warpgroup
    const int lane = threadIdx.x & 31;
    // This warpgroup alone (128 threads), before a 256-thread barrier that hands its shared-memory
    // stores to the other warpgroup.
    auto sync_local = [cw] {
      named_barrier_sync<kAlignedBars>(
          barrier_id(cw == 0 ? NamedBarrier::kLocalFirst : NamedBarrier::kLocalSecond), 128);
    };
    // The direct split's query tile, asked of L2 before the cursor's seq_lens read.
    if constexpr (kDirect) {
      tma::prefetch_query_rows<kRows, Traits::kConsumerThreads, F::kQueryBytes>(
          p, 0, blockIdx.x * kRows, ctid);
    }

    typename Traits::TiledMmaQk mma_qk;
    typename Traits::TiledMmaPv mma_pv;
    typename Traits::TiledMmaPvRs mma_pv_own;
    auto thr_qk = mma_qk.get_thread_slice(wtid);
    auto thr_pv = mma_pv.get_thread_slice(wtid);
    auto thr_pv_own = mma_pv_own.get_thread_slice(wtid);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 36) descriptors

    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kKeys>>{});
    Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kRows>, Int<Traits::kColsPerWg>>{});
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kKeys>>{}));
    Tensor tOcO =
        thr_pv.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<Traits::kColsPerWg>>{}));
    // P of this consumer's own block in 16 bits, the A operand of its own P V (read from registers,
    // not from the rope chunk the other consumer reads it from).
    Tensor tOrPown = thr_pv_own.partition_fragment_A(make_tensor(
        make_smem_ptr(smem.k[0] + Traits::kRopeChunkOffset), typename Traits::SmemLayoutP{}));
    Tensor tOrPown32 = recast<uint32_t>(tOrPown);
    static_assert(size(decltype(tSrS){}) == 32 && size(decltype(tOrO){}) == 128 &&
                      size(decltype(tOrPown){}) == 32,
                  "GMMA fragments");

    // Each thread holds two rows of S and O: slot 0 = tScS(0)'s row, slot 1 = 8 rows below.
    int my_row[2];
    my_row[0] = get<0>(tScS(0));
    my_row[1] = get<0>(tScS(2));
    const float bmm1_scale = bmm1_scale_of(p);
    const float score_scale = bmm1_scale * 1.4426950408889634f;  // log2(e): scores in base 2

    uint32_t uses[Traits::kStages] = {};  // blocks each stage has held (its barriers' phase)
    // A one-segment request's out rows leave the query tile's bytes by bulk copies that threads
    // 0 .. kRows - 1 issue: the next query tile waits for them to have read their rows.
    bool out_copies_pending = false;
    const bool query_tma = kQueryTma && p.query_tma != 0;
    // q_full's phase: one per query tile loaded through the tensor map (kQueryTma only).
    [[maybe_unused]] uint32_t q_phase = 0;
    if (query_tma && ctid == 0) tma::prefetch_tensor_map(&q_map);
    Cursor cursor;
    cursor.begin(p);
    // The balanced schedule: the part's first query tile, asked of L2 before the cursor's record
    // and seq_lens reads.
    if constexpr (std::is_same_v<Cursor, tma::PartCursor>) {
      cursor.template prefetch_first_query<kRows, Traits::kConsumerThreads, F::kQueryBytes>(p,
                                                                                            ctid);
    }
    // The sparse CTA's query tile in flight (kSparseQueryTma): heads blockIdx.x * kRows .. + 63 of
    // its token, from the token row's address alone (sparse_order's entry where there is one).
    bool sparse_q_in_flight = false;
    if constexpr (kSparseQueryTma) {
      int b, i;
      const int h0 = static_cast<int>(blockIdx.x) * kRows;
      if (p.query_tma != 0 && h0 < p.num_heads && tma::sparse_row_token(p, b, i)) {
        sparse_q_in_flight = true;
        if (ctid == 0) {
          mbar_arrive_expect_tx(&smem.q_full, kRows * Traits::kD * F::kQueryBytes);
#pragma unroll
          for (int c = 0; c < Traits::kChunks; ++c) {
            tma::tma_load_4d(smem.q + c * kRows * Traits::kChunkCols, &q_map, &smem.q_full,
                             c * Traits::kChunkCols, h0, i, b);
          }
        }
      }
    }
    tma::TileWork w;
    int64_t partial_row0;
    while (cursor.next(p, w, partial_row0)) {
      const int tile_rows = min(kRows, w.rows - w.row0);
      if (w.block_begin >= w.block_end) {  // no key of the tile in this segment
        tma::store_empty_segment(p, w, partial_row0, tile_rows, ctid, Traits::kConsumerThreads);
        continue;
      }

      // Query tile into shared memory (padding rows 0). The previous segment's GEMMs are complete:
      // both consumers passed its final barrier. While the loads are in flight, a one-segment
      // request's rows find their places in out and lse, so that its end is short.
      if (sparse_q_in_flight) {  // the CTA's one segment, its tile asked for above
        if (w.whole && ctid < kRows) set_out_row(p, smem, w, tile_rows, ctid);
        mbar_wait(&smem.q_full, 0);
        sparse_q_in_flight = false;
        // NOTE: set_out_row's stores reach both warpgroups: each syncs itself first.
        sync_local();
        named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                         Traits::kConsumerThreads);
      } else if (query_tma) {
        if constexpr (kQueryTma) {
          // The tile's bytes are free once the previous segment's staged out rows have been read
          // (its GEMMs are complete): the bulk copies waited for here, the 16-byte stores (and
          // every thread's staging stores, fenced for the boxes' writes) behind the barrier.
          if (out_copies_pending) {
            if (ctid < kRows) tma_store_wait<0>();
            out_copies_pending = false;
          }
          fence_proxy_async_smem();
          sync_local();
          named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                           Traits::kConsumerThreads);
          if (ctid == 0) {
            tma::issue_query_tile<Traits::kChunks, Traits::kChunkCols, Traits::kStageElemBytes>(
                p, w, &q_map, &smem.q_full, smem.q);
          }
          if (w.whole && ctid < kRows) set_out_row(p, smem, w, tile_rows, ctid);
          mbar_wait(&smem.q_full, q_phase);
          q_phase ^= 1;
        }
        // NOTE: set_out_row's stores reach both warpgroups (consumer 0's first warps write them):
        // the writers sync themselves first, as at store_rows' hand-offs.
        sync_local();
        named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                         Traits::kConsumerThreads);
      } else {
        tma::load_query_tile_rows<kRows, Traits::kConsumerThreads,
                                  std::conditional_t<F::kFp8Query, __half, void>, false,
                                  kScaledQuery>(
            p, w, tile_rows, reinterpret_cast<uint8_t*>(smem.q), smem.query_row, ctid,
            [&] {
              // The row pointers (and kScaledQuery's row maxima) are stored by consumer 0's first
              // warps and read by both warpgroups: each syncs itself first, as at store_rows' hand-
              // offs (racecheck, docs/sm90-seesaw.md, Sanitizers).
              sync_local();
              named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                               Traits::kConsumerThreads);
            },
            [&] {
              if (w.whole && ctid < kRows) set_out_row(p, smem, w, tile_rows, ctid);
              if (out_copies_pending) {
                if (ctid < kRows) tma_store_wait<0>();
                named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                                 Traits::kConsumerThreads);
                out_copies_pending = false;
              }
            },
            smem.query_max, smem.query_unscale);
        fence_proxy_async_smem();
        named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                         Traits::kConsumerThreads);
      }
      clear(tOrO);
      // NOTE: without this fence the direct split's instantiation serializes every wgmma (C7515):
      // the compiler knows O is zero across the first P V.
      warpgroup_fence_operand(tOrO);

      tma::RowRule rule[2];
      bool row_valid[2];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        row_valid[s] = my_row[s] < tile_rows;
        if constexpr (kSparse) {
          rule[s].first_query = w.seq_len - w.n;
          rule[s].mask = nullptr;
          rule[s].limit = row_valid[s] ? w.extent : 0;  // the token's counted entries
        } else {
          rule[s] = tma::dense_row_rule(p, w, my_row[s], row_valid[s]);
        }
      }
      // Blocks that end at or below this key take the softmax without per-score mask and scale.
      // NOTE: padding rows do not count: their query row is 0, so S is 0 and P is 1 there, and
      // their O, max and sum are never stored; counting them (limit 0) put every block of a warp
      // with a padding row on the masked path (H96: +30%, docs/sm90-seesaw.md, Softmax). The first
      // key some row of the tile does not attend (its first token's limit; with a mask, the first
      // draft key) bounds it too: blocks past it take the masked path in every thread, and their V
      // rows from it on are cleaned (tma::clean_v_rows). NOTE: without kClean the code below is
      // exactly what it was before cleaning existed: its mere presence cost the hot shapes 1-2%
      // (docs/sm90-seesaw.md, Non-finite inputs).
      const int tile_limit =
          max(0, p.mask != nullptr ? w.seq_len - w.n : w.seq_len - w.n + w.row0 / p.num_heads + 1);
      int unmasked_limit =
          min(row_valid[0] ? rule[0].limit : INT_MAX, row_valid[1] ? rule[1].limit : INT_MAX);
      if constexpr (kClean) unmasked_limit = min(unmasked_limit, tile_limit);

      // Skip-softmax threshold f / seq_len (sparse: the token's counted entries).
      const int skip_len = kSparse ? w.extent : w.seq_len;
      const bool skip_softmax = p.skip_softmax_factor > 0.0f && skip_len > 0;
      const float skip_threshold =
          skip_softmax ? __fdiv_rn(p.skip_softmax_factor, static_cast<float>(skip_len)) : 0.0f;

      float row_max[2] = {kNegInf, kNegInf};  // running max of both consumers, base-2 units
      float row_sum[2] = {0.0f, 0.0f};        // this thread's share of its own blocks' sum of P

      // O half += P V half of the block in `stage` (P in its rope chunk); issued, not waited for.
      auto pv_gemm = [&](int stage) {
        Tensor sP = make_tensor(make_smem_ptr(smem.k[stage] + Traits::kRopeChunkOffset),
                                typename Traits::SmemLayoutP{});
        Tensor tOrP = thr_pv.partition_fragment_A(sP);  // (MMA, 1, 4)
        Tensor sV = make_tensor(make_smem_ptr(smem.k[stage]), typename Traits::SmemLayoutV{});
        Tensor sV_half =
            local_tile(sV, Shape<Int<Traits::kColsPerWg>, Int<kKeys>>{}, make_coord(cw, 0));
        Tensor tOrV = thr_pv.partition_fragment_B(sV_half);
        warpgroup_fence_operand(tOrO);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrP); ++k)
          cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k), tOrO);
        warpgroup_commit_batch();
      };
      // The same for this consumer's own block, P from tOrPown.
      // NOTE: one generic lambda for both (the MMA, slice and A fragments as arguments) took the
      // descriptors out of uniform registers: 16 more R2UR in the round loop (2,054 -> 2,070).
      auto pv_gemm_own = [&](int stage) {
        Tensor sV = make_tensor(make_smem_ptr(smem.k[stage]), typename Traits::SmemLayoutV{});
        Tensor sV_half =
            local_tile(sV, Shape<Int<Traits::kColsPerWg>, Int<kKeys>>{}, make_coord(cw, 0));
        Tensor tOrV = thr_pv_own.partition_fragment_B(sV_half);
        warpgroup_fence_operand(tOrO);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrPown); ++k)
          cute::gemm(mma_pv_own, tOrPown(_, _, k), tOrV(_, _, k), tOrO);
        warpgroup_commit_batch();
      };
      // This thread's share of its own block's sum of P (in tSrS, fp32) into row_sum.
      auto add_row_sums = [&] {
        CUTE_UNROLL
        for (int v = 0; v < size(tSrS); ++v) row_sum[(v >> 1) & 1] += tSrS(v);
      };
      auto rescale_o = [&](const float(&factor)[2]) {
        // NOTE: a factor of exactly 1 (the max did not move) leaves O bitwise unchanged; a warp
        // whose rows all kept their max skips the 128 multiplies.
        if (!__any_sync(0xffffffffu, factor[0] != 1.0f || factor[1] != 1.0f)) return;
        CUTE_UNROLL
        for (int v = 0; v < size(tOrO); ++v) tOrO(v) *= factor[(v >> 1) & 1];
      };
      // One arrive per consumer warp: this warpgroup's last reads of its chunks of the stage (V_L
      // for consumer 0; V_R and P for consumer 1) are done. NOTE: elect.sync, not lane == 0: ptxas
      // re-read the thread index (S2R) before each arrive. kPair: the other CTA's producer refills
      // this stage too (multicast): it gets the arrive too. kGather: every thread arrives on its
      // own CTA's barrier (tma::kGatherReleases), so that its reads of the block's entries are
      // ordered before the producer's next ones by its own arrive.
      auto release = [&](int stage) {
        uint64_t* bar = cw == 0 ? &smem.empty_l[stage] : &smem.empty_r[stage];
        if constexpr (kGather) mbar_arrive(bar);
        __syncwarp();
        if (cute::elect_one_sync()) {
          if constexpr (!kGather) mbar_arrive(bar);
          if constexpr (kPair) tma::mbar_arrive_cluster(bar, rank ^ 1);
        }
      };

      const int num_blocks = w.block_end - w.block_begin;
      if constexpr (kSparse) {
        // ---- sparse calls: one block at a time. Consumer 0 computes the block's S, its softmax
        // and O_L += P V_L (P from registers); consumer 1 takes P from the block's rope chunk and
        // applies O_R = a O_R + P V_R while consumer 0 scores the next block. A stage goes back
        // once its block's P V halves are done, so the producer fills one stage for a whole block's
        // time while the other is consumed (docs/sm90-sparse.md, One block at a time). Consumer 0
        // holds the running max and sum; consumer 1's row sums stay 0. ----
        for (int it = 0; it < num_blocks; ++it) {
          const int stage = it & 1;
          // NOTE: uses[] by constant indices only: indexed by `stage`, the array went to local
          // memory, and consumer 0 waited on a load of it every block (docs/perf-notes.md, Change
          // 92).
          const uint32_t phase = (stage == 0 ? uses[0] : uses[1]) & 1;
          if (stage == 0) {
            ++uses[0];
          } else {
            ++uses[1];
          }
          // The hand-off of block it, a barrier per stage: consumer 0 arrives on it again only
          // after scoring block it + 2, whose rope chunk the producer refills after consumer 1's
          // release of block it, which follows its sync here.
          const uint32_t hand_off =
              barrier_id(stage == 0 ? NamedBarrier::kToSecond : NamedBarrier::kToFirst);
          T* k_stage = smem.k[stage];
          if (cw == 1) {
            named_barrier_sync<kAlignedBars>(hand_off, Traits::kConsumerThreads);
            float a[2];
#pragma unroll
            for (int s = 0; s < 2; ++s) a[s] = smem.scale[stage][0][my_row[s]];
            rescale_o(a);
            pv_gemm(stage);
            warpgroup_wait<0>();
            warpgroup_fence_operand(tOrO);
            release(stage);
            continue;
          }
          // ---- S = Q K^T over the whole block, each chunk issued as it lands ----
          {
            Tensor sK = make_tensor(make_smem_ptr(k_stage), typename Traits::SmemLayoutK{});
            Tensor tSrK = thr_qk.partition_fragment_B(sK);
            // kGatherPair: the producers publish their stores without a proxy fence; this
            // consumer fences after each chunk's wait, which also orders consumer 1's reads of the
            // block behind the hand-off (tma::gather_ahead_blocks).
            tma::chunked_gemm<Traits>(mma_qk, tSrQ, tSrK, tSrS, smem.full[stage], phase,
                                      tma::NoHook{}, kGatherAhead);
          }
          // ---- mask (keys whose entry is -1, slot[stage]); row max over the block (base 2) ----
          // NOTE: the dense rounds' softmax below, without their mask tensor, draft cleaning and
          // zeroed rows: kept as a copy so that the dense instantiations' SASS stays what it was (a
          // lambda shared with the rounds once took their GMMA descriptors out of uniform
          // registers).
          const int key0 = (w.block_begin + it) * kKeys;
          const uint64_t absent =
              (static_cast<uint64_t>(__ballot_sync(0xffffffffu, smem.slot[stage][lane + 32] < 0))
               << 32) |
              __ballot_sync(0xffffffffu, smem.slot[stage][lane] < 0);
          const bool unmasked = score_scale > 0.0f && key0 + kKeys <= unmasked_limit && absent == 0;
          float row_scale[2], s_mul[2];
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            row_scale[s] = kScaledQuery ? score_scale * smem.query_unscale[my_row[s]] : score_scale;
            s_mul[s] = unmasked ? row_scale[s] : 1.0f;
          }
          float block_max[2] = {kNegInf, kNegInf};
          bool neg_inf[2] = {false, false};  // an attended score of -inf: the row turns NaN
          if (unmasked) {
            unmasked_block_max(tSrS, block_max, neg_inf);
          } else {
            CUTE_UNROLL
            for (int v = 0; v < size(tSrS); ++v) {
              const int slot = (v >> 1) & 1;
              const int k = get<1>(tScS(v));
              const bool attends = rule[slot].attends(key0 + k) && ((absent >> k) & 1) == 0;
              const float s = attends ? tSrS(v) * row_scale[slot] : kNegInf;
              neg_inf[slot] = neg_inf[slot] || (attends && s == kNegInf);
              tSrS(v) = s;
              block_max[slot] = fmaxf(block_max[slot], s);
            }
          }
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            if (neg_inf[s]) row_sum[s] = __int_as_float(0x7fffffff);
            block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 1));
            block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 2));
            block_max[s] *= s_mul[s];
          }
          if (skip_softmax) {
            bool negligible = true;
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              negligible = negligible &&
                           (!row_valid[s] || exp2f(block_max[s] - row_max[s]) < skip_threshold);
            }
            if (named_barrier_and(barrier_id(NamedBarrier::kVoteFirst), 128, negligible)) {
              block_max[0] = block_max[1] = kNegInf;
              CUTE_UNROLL
              for (int v = 0; v < size(tSrS); ++v) tSrS(v) = kNegInf;
            }
          }
          // ---- online softmax (the dense loop's max rule: kMaxSlack) ----
          float a_new[2];
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            const float m_new = block_max[s] > row_max[s] + kMaxSlack ? block_max[s] : row_max[s];
            const float m_use = m_new == kNegInf ? 0.0f : m_new;
            a_new[s] = m_new == kNegInf ? 1.0f : exp2f(row_max[s] - m_use);
            row_max[s] = m_new;
            block_max[s] = m_use;
            row_sum[s] *= a_new[s];
          }
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); ++v) {
            const int slot = (v >> 1) & 1;
            tSrS(v) = tma::exp2_ftz(fmaf(tSrS(v), s_mul[slot], -block_max[slot]));
          }
          // ---- P (16-bit) into the block's rope chunk and registers; the factor for consumer 1
          // ----
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); v += 2) {
            tOrPown32(v / 2) = pack_pair<T>(tSrS(v), tSrS(v + 1));
          }
          {
            const int row = (wtid >> 5) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
            const uint32_t p_row = static_cast<uint32_t>(__cvta_generic_to_shared(
                                       k_stage + Traits::kRopeChunkOffset)) +
                                   row * 128;
            CUTE_UNROLL
            for (int k = 0; k < 4; ++k) {
              const int col8 = 2 * k + (lane >> 4);
              tma::stmatrix_x4(p_row + ((col8 ^ (lane & 7)) << 4), tOrPown32(4 * k),
                               tOrPown32(4 * k + 1), tOrPown32(4 * k + 2), tOrPown32(4 * k + 3));
            }
          }
          if ((lane & 3) == 0) {
#pragma unroll
            for (int s = 0; s < 2; ++s) smem.scale[stage][0][my_row[s]] = a_new[s];
          }
          fence_proxy_async_smem();
          sync_local();
          named_barrier_arrive<kAlignedBars>(hand_off, Traits::kConsumerThreads);
          // ---- O_L = a O_L + P V_L ----
          rescale_o(a_new);
          pv_gemm_own(stage);
          add_row_sums();
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
          release(stage);
        }
      } else {
        // Consumer 0 left this round's P1 V1_L in flight behind the next S (stage 1's V_L not yet
        // released); warpgroup-uniform.
        bool deferred = false;
        for (int round = 0; 2 * round < num_blocks; ++round) {
          const int par = round & 1;
          const bool has_odd = 2 * round + 1 < num_blocks;  // the round has a block for consumer 1
          const uint32_t phase = (cw == 0 ? uses[0] : uses[1]) & 1;
          ++uses[0];
          if (has_odd) ++uses[1];
          const bool mine = cw == 0 || has_odd;  // this consumer scores a block this round
          const int key0 = (w.block_begin + 2 * round + cw) * kKeys;
          T* k_stage = smem.k[cw];
          float m_in[2],
              a_in[2];  // running max before this consumer's block, and the previous factor

          if (mine) {
            // ---- qk_gemm (consumer 1 starts before consumer 0 hands over its max): S = Q K^T over
            // the whole block, each 64-column chunk issued as it lands ----
            Tensor sK = make_tensor(make_smem_ptr(k_stage), typename Traits::SmemLayoutK{});
            Tensor tSrK = thr_qk.partition_fragment_B(sK);
            // p.hold_first_s: a segment's first two S GEMMs one after the other (round 0 has a
            // block for consumer 1), so that consumer 0's, on the round's path, runs alone. Not on
            // the direct split (one segment a CTA: nothing measurable, and its kClean instantiation
            // spilled 20 bytes with it).
            const bool hold = !kDirect && p.hold_first_s != 0 && round == 0 && has_odd;
            if (hold && cw == 1) {
              named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kFirstS),
                                               Traits::kConsumerThreads);
            }
            tma::chunked_gemm<Traits>(mma_qk, tSrQ, tSrK, tSrS, smem.full[cw], phase, [&] {
              // The previous round's P1 V1_L, if left in flight, completes: V_L of stage 1 goes
              // back.
              warpgroup_commit_batch();
              warpgroup_wait<1>();
              warpgroup_fence_operand(tOrO);
              if (deferred) release(1);
              deferred = false;
            });
            if (hold && cw == 0) {
              named_barrier_arrive<kAlignedBars>(barrier_id(NamedBarrier::kFirstS),
                                                 Traits::kConsumerThreads);
            }
          }

          if (cw == 1) {
            // ---- take consumer 0's hand-off; start O_R = a0 O_R + P0 V0_R ----
            named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kToSecond),
                                             Traits::kConsumerThreads);
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              m_in[s] = smem.max[par][0][my_row[s]];
              a_in[s] = smem.scale[par][0][my_row[s]];
              row_sum[s] *= a_in[s];
            }
            warpgroup_wait<0>();  // NOTE: nothing in flight; ptxas cannot tell (see `deferred`)
            warpgroup_fence_operand(tOrO);
            rescale_o(a_in);
            pv_gemm(0);
          } else {
#pragma unroll
            for (int s = 0; s < 2; ++s) m_in[s] = row_max[s];
          }

          if (mine) {
            // ---- mask; row max over the block (scaled, base 2) ----
            // NOTE: where both rows attend every key of the block (no mask, below both limits), S
            // stays unscaled and the scale goes into P's FFMA: no per-score mask test or multiply.
            const bool unmasked =
                p.mask == nullptr && score_scale > 0.0f && key0 + kKeys <= unmasked_limit;
            // The scale of each of the thread's rows: kScaledQuery, times the inverse of the row's
            // fp16 scale (read here: held across the blocks, it would take two registers).
            float row_scale[2];
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              row_scale[s] =
                  kScaledQuery ? score_scale * smem.query_unscale[my_row[s]] : score_scale;
            }
            float s_mul[2];  // what tSrS still needs
#pragma unroll
            for (int s = 0; s < 2; ++s) s_mul[s] = unmasked ? row_scale[s] : 1.0f;
            float block_max[2] = {kNegInf, kNegInf};
            // NOTE: an attended score of -inf (an inf in a key's rope, which V does not hold) gets
            // P = 0 and would leave its row finite: such a row's sum turns NaN (contract section
            // 1.2). Unmasked, one largest |S| over both rows finds the rare block that has one (a
            // flag per score cost the hot shapes 2-4%); masked, a predicate per row.
            bool neg_inf[2] = {false, false};
            if (unmasked) {
              unmasked_block_max(tSrS, block_max, neg_inf);
            } else {
              CUTE_UNROLL
              for (int v = 0; v < size(tSrS); ++v) {
                const int slot = (v >> 1) & 1;
                const int j = key0 + get<1>(tScS(v));
                // NOTE: an attended score of -inf comes from an infinite input: NaN, as the row
                // must turn (contract section 1; the key's V row may have been cleaned).
                float s;
                if constexpr (kClean) {
                  s = kNegInf;
                  if (rule[slot].attends(j)) {
                    s = tSrS(v) * row_scale[slot];
                    if (s == kNegInf) s = __int_as_float(0x7fffffff);
                  }
                } else {
                  const bool attends = rule[slot].attends(j);
                  s = attends ? tSrS(v) * row_scale[slot] : kNegInf;
                  neg_inf[slot] = neg_inf[slot] || (attends && s == kNegInf);
                }
                tSrS(v) = s;
                block_max[slot] = fmaxf(block_max[slot], s);
              }
            }
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              if (neg_inf[s]) row_sum[s] = __int_as_float(0x7fffffff);
              block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 1));
              block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 2));
              block_max[s] *= s_mul[s];  // scale > 0: the max of the scaled scores
            }

            // ---- skip-softmax: a block every row of the tile finds negligible counts as empty
            // ----
            if (skip_softmax) {
              bool negligible = true;
#pragma unroll
              for (int s = 0; s < 2; ++s) {
                negligible =
                    negligible && (!row_valid[s] || exp2f(block_max[s] - m_in[s]) < skip_threshold);
              }
              const uint32_t vote_id =
                  barrier_id(cw == 0 ? NamedBarrier::kVoteFirst : NamedBarrier::kVoteSecond);
              if (named_barrier_and(vote_id, 128, negligible)) {
                block_max[0] = block_max[1] = kNegInf;  // P = 0: the block adds nothing
                CUTE_UNROLL
                for (int v = 0; v < size(tSrS); ++v) tSrS(v) = kNegInf;
              }
            }

            // ---- online_softmax: new max, factor, P = exp2(S - max) (one FFMA and one MUFU each)
            // ----
            float m_new[2], a_new[2];
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              // NOTE: the running max moves only where the block's exceeds it by more than
              // kMaxSlack (P <= 2^kMaxSlack): the max is a reference point of O and the sum, and a
              // factor of 1 lets a warp skip its rescales (docs/sm90-seesaw.md, Softmax).
              m_new[s] = block_max[s] > m_in[s] + kMaxSlack ? block_max[s] : m_in[s];
              const float m_use =
                  m_new[s] == kNegInf ? 0.0f : m_new[s];  // no finite score yet: P = 0
              a_new[s] = exp2f(m_in[s] - m_use);
              // NOTE: a row without a finite score yet (padding rows too) has O = 0 and sum 0: a
              // factor of 1 leaves them so and lets its warp skip the rescale.
              if (m_new[s] == kNegInf) a_new[s] = 1.0f;
              block_max[s] = m_use;
              row_sum[s] *= a_new[s];
            }
            // NOTE: P's row sums wait until this consumer's own P V is issued (add_row_sums): the
            // hand-off to the other consumer is the round's critical path (docs/sm90-seesaw.md,
            // Schedule of one segment).
            CUTE_UNROLL
            for (int v = 0; v < size(tSrS); ++v) {
              const int slot = (v >> 1) & 1;
              tSrS(v) = tma::exp2_ftz(fmaf(tSrS(v), s_mul[slot], -block_max[slot]));
            }

            // ---- P into the block's rope chunk (16-bit); zero V rows of keys past the extent ----
            {
              // NOTE: rounding P to 16 bits moves out by up to half an ulp of P times
              // sum_j p_j |v_j| / Z, which dominates where the terms cancel (docs/sm90-tma.md,
              // Precision).
              uint8_t* p_bytes = reinterpret_cast<uint8_t*>(k_stage + Traits::kRopeChunkOffset);
              CUTE_UNROLL
              for (int v = 0; v < size(tSrS); v += 2) {
                tOrPown32(v / 2) = pack_pair<T>(tSrS(v), tSrS(v + 1));
              }
              // Words 4k .. 4k + 3 are the 8x8 matrices of columns 16k .. 16k + 15 (rows r and r +
              // 8 of each 8 columns); lane l addresses row l % 8 of matrix l / 8 in the swizzled
              // chunk.
              {
                const int row = (wtid >> 5) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
                const uint32_t p_row =
                    static_cast<uint32_t>(__cvta_generic_to_shared(p_bytes)) + row * 128;
                CUTE_UNROLL
                for (int k = 0; k < 4; ++k) {
                  const int col8 = 2 * k + (lane >> 4);  // the matrix's 8 columns, in 16-byte units
                  tma::stmatrix_x4(p_row + ((col8 ^ (lane & 7)) << 4), tOrPown32(4 * k),
                                   tOrPown32(4 * k + 1), tOrPown32(4 * k + 2),
                                   tOrPown32(4 * k + 3));
                }
              }
              // NOTE: TMA loads whole boxes and skips pages past the extent; those rows may hold
              // NaN (poisoned cache, stale stage), and P = 0 times NaN is NaN. The fp8 ring widens
              // them into zeros: nothing to zero (and no store of this warpgroup's into the
              // widening warps' rows).
              const int valid = min(kKeys, w.extent - key0);
              const int zero_end = kWidenRing ? valid : kKeys;  // rows [valid, zero_end) are zeroed
              // kClean: from the first key some row of the tile does not attend (tile_limit).
              const int clean0 = kClean ? min(valid, max(0, tile_limit - key0)) : valid;
              if constexpr (kClean) {
                if (clean0 < zero_end) {
                  tma::clean_v_rows(reinterpret_cast<uint8_t*>(k_stage), kKeys,
                                    Traits::kL / Traits::kChunkCols, clean0, zero_end, valid,
                                    std::is_same_v<T, cute::half_t> ? 0x7c00u : 0x7f80u, wtid, 128);
                }
              } else if (valid < zero_end) {
                uint8_t* k_bytes = reinterpret_cast<uint8_t*>(k_stage);
                constexpr int kVChunks = Traits::kL / Traits::kChunkCols;  // 8 chunks hold V
                const int n = (kKeys - valid) * kVChunks * 8;              // 16-byte pieces
                for (int e = wtid; e < n; e += 128) {
                  const int piece = e & 7, rest = e >> 3;
                  const int chunk = rest % kVChunks, r = valid + rest / kVChunks;
                  *reinterpret_cast<uint4*>(k_bytes + chunk * kKeys * 128 + r * 128 + piece * 16) =
                      make_uint4(0, 0, 0, 0);
                }
              }
              if ((lane & 3) == 0) {
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                  smem.max[par][cw][my_row[s]] = m_new[s];
                  smem.scale[par][cw][my_row[s]] = a_new[s];
                }
              }
              fence_proxy_async_smem();
              // This warpgroup's own P V reads the zeroed V rows of a partial or draft block (P
              // from registers): sync the warpgroup there. The hand-off orders every thread's
              // stores before the other consumer's reads. NOTE: synced in every block, not only
              // where rows were zeroed: with the one-way hand-off barrier alone, racecheck reported
              // the max and factor stores against the other consumer's reads (31,232 hazards each
              // over two Fp8Widened cases); this costs nothing measurable (docs/perf-notes.md, "The
              // seesaw kernel's hand-off under racecheck").
              named_barrier_sync<kAlignedBars>(
                  barrier_id(cw == 0 ? NamedBarrier::kLocalFirst : NamedBarrier::kLocalSecond),
                  128);
              named_barrier_arrive<kAlignedBars>(
                  barrier_id(cw == 0 ? NamedBarrier::kToSecond : NamedBarrier::kToFirst),
                  Traits::kConsumerThreads);
            }

#pragma unroll
            for (int s = 0; s < 2; ++s) row_max[s] = m_new[s];
            if (cw == 0) {
              // ---- O_L = a0 O_L + P0 V0_L ----
              // NOTE: nothing is in flight here, but without the wait ptxas sees consumer 1's P0
              // V0_R (other branch) possibly in flight and serializes every wgmma of the kernel
              // (C7514).
              warpgroup_wait<0>();
              warpgroup_fence_operand(tOrO);
              rescale_o(a_new);
              pv_gemm_own(0);
              add_row_sums();
              // NOTE: drained here, before waiting for consumer 1, so that the producer refills V_L
              // of stage 0 (the next round's first S chunks) while consumer 1 runs its softmax.
              warpgroup_wait<0>();
              warpgroup_fence_operand(tOrO);
              release(0);
            } else {
              // ---- O_R = a1 (a0 O_R + P0 V0_R) + P1 V1_R ----
              warpgroup_wait<0>();
              warpgroup_fence_operand(tOrO);
              release(0);
              rescale_o(a_new);
              pv_gemm_own(1);
              add_row_sums();
            }
          } else {
            // Consumer 1 without a block (odd count, last round): the max stays consumer 0's.
#pragma unroll
            for (int s = 0; s < 2; ++s) row_max[s] = m_in[s];
          }

          if (cw == 0 && has_odd) {
            // ---- take consumer 1's hand-off: O_L = a1 O_L + P1 V1_L ----
            named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kToFirst),
                                             Traits::kConsumerThreads);
            float a1[2];
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              row_max[s] = smem.max[par][1][my_row[s]];
              a1[s] = smem.scale[par][1][my_row[s]];
              row_sum[s] *= a1[s];
            }
            warpgroup_wait<0>();
            warpgroup_fence_operand(tOrO);
            rescale_o(a1);
            pv_gemm(1);
          }
          // Drain this round's last P V: the stage it read goes back to the producer.
          // NOTE: consumer 0 instead leaves P1 V1_L in flight where the next round's first chunk of
          // stage 0 has already landed: the next S is issued behind it, and V_L of stage 1 goes
          // back after that chunk's k steps are issued (the hook above). Where the chunk has not
          // landed, waiting for it first would hold stage 1 back.
          if (cw == 0 && has_odd && 2 * (round + 1) < num_blocks) {
            // NOTE: the vote makes it uniform over the warpgroup; __all_sync lets ptxas see a
            // warp-uniform branch (else it serializes every wgmma: C7520).
            deferred = __all_sync(0xffffffffu,
                                  named_barrier_and(barrier_id(NamedBarrier::kDeferFirst), 128,
                                                    tma::mbar_test(&smem.full[0][0], uses[0] & 1)));
          }
          if (!deferred) {
            warpgroup_wait<0>();
            warpgroup_fence_operand(tOrO);
            if (cw == 0) {
              if (has_odd) release(1);
            } else {
              release(mine ? 1 : 0);
            }
          }
        }

      }  // dense rounds

      warpgroup_wait<0>();  // NOTE: nothing in flight; ptxas cannot tell (see `deferred`)
      warpgroup_fence_operand(tOrO);

      // ---- row sums over both consumers ----
      // A non-finite O value comes from a non-finite attended key or value (here: an inf value
      // whose score came out -inf has P = 0 and leaves NaN in its column only, and an inf value
      // with P > 0 an inf): its row turns NaN, out and lse (contract section 1), through its sum.
      // Values of keys a row does not attend never reach O as non-finite (past the extent: zeroed V
      // rows; draft keys attended unequally: kClean). x * 0 is 0 for a finite x and NaN otherwise,
      // so each slot's sum of them is 0, or NaN where its row holds a non-finite value, and adding
      // it to the row's sum carries the NaN. NOTE: four independent FFMA chains a slot. The test
      // written as `finite && isfinite(x)` compiled to a compare and a branch per value, ~1 us a
      // segment on the consumers' path (docs/perf-notes.md, "Where a segment boundary's time
      // goes").
      {
        float nonfinite[2][4] = {};
        CUTE_UNROLL
        for (int v = 0; v < size(tOrO); ++v) {
          float& acc = nonfinite[(v >> 1) & 1][(v >> 2) & 3];
          acc = fmaf(tOrO(v), 0.0f, acc);
        }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          row_sum[s] += (nonfinite[s][0] + nonfinite[s][1]) + (nonfinite[s][2] + nonfinite[s][3]);
        }
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 1);
        row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 2);
        if (cw == 1 && (lane & 3) == 0) smem.row_sum[my_row[s]] = row_sum[s];
      }
      // NOTE: consumer 1's sums reach consumer 0 through smem.row_sum: this barrier (both consumer
      // warpgroups) orders the stores before consumer 0's reads below, and the next barrier orders
      // those reads before the next segment's stores. The writing warpgroup syncs itself first:
      // with the 256-thread barrier alone racecheck reports such pairs (docs/sm90-seesaw.md,
      // Sanitizers).
      if (cw == 1) named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kLocalSecond), 128);
      named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                       Traits::kConsumerThreads);
      // ---- store_rows: a one-segment request's out (normalized as the combine would, output.cuh)
      // or a segment's partial (max in natural log units and the sum over both consumers in fp32,
      // o = bmm2 O / sum in the out type); O is scaled and rounded into the query tile (free: this
      // segment's GEMMs are done), then each row leaves by one bulk copy (or, for out where its
      // layout does not allow it, store_out8's 2-byte stores) ----
      // Lanes 0 and 1 of each quad of consumer 0 finish its two rows (set_out_row placed a whole
      // request's rows).
      if (cw == 0 && (lane & 3) < 2) {
        const bool second = (lane & 1) != 0;
        const int r = second ? my_row[1] : my_row[0];
        const float mx = second ? row_max[1] : row_max[0];
        const float z = (second ? row_sum[1] : row_sum[0]) + smem.row_sum[r];
        const float m = mx == kNegInf ? kNegInf : mx * 0.6931471805599453f;
        float scale = 0.0f;  // padding rows, tokens outside [0, T) and empty rows: 0, not written
        if (w.whole) {
          if (smem.out_row[r] >= 0) {
            const RowOutput ro = row_output(smem.out_scale[r], smem.out_sink[r], m, z);
            if (smem.lse_row[r] >= 0) p.lse[smem.lse_row[r]] = ro.lse;
            scale = ro.scale;
          }
        } else if (r < tile_rows) {
          p.partial_max[partial_row0 + r] = m;
          p.partial_sum[partial_row0 + r] = z;
          if (z != 0.0f) scale = __fdiv_rn(bmm2_scale_of(p), z);
        }
        smem.out_scale[r] = scale;
      }
      // NOTE: consumer 0's out_scale stores reach both warpgroups (the writer syncs itself first,
      // as above).
      if (cw == 0) named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kLocalFirst), 128);
      named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                       Traits::kConsumerThreads);
      uint8_t* staged = reinterpret_cast<uint8_t*>(smem.q);
      {
        float scale[2];
#pragma unroll
        for (int s = 0; s < 2; ++s) scale[s] = smem.out_scale[my_row[s]];
        CUTE_UNROLL
        for (int v = 0; v < size(tOrO); v += 2) {
          const float f =
              scale[(v >> 1) & 1];  // NOTE: a row without a key gets 0, whatever O holds
          const int r = get<0>(tOcO(v)), c = cw * Traits::kColsPerWg + get<1>(tOcO(v));
          *reinterpret_cast<uint32_t*>(staged + r * Traits::kOutPitch + c * 2) =
              pack_out(p, f != 0.0f ? tOrO(v) * f : 0.0f, f != 0.0f ? tOrO(v + 1) * f : 0.0f);
        }
      }
      // Both warpgroups' staged rows are read across warpgroups (the bulk copies of consumer 0's
      // threads, or every thread's 16-byte pieces): each syncs itself first, as above.
      sync_local();
      if (!w.whole || p.out_vec16) {
        fence_proxy_async_smem();  // the staged rows, for the bulk copies
        named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                         Traits::kConsumerThreads);
        if (ctid < kRows) {
          uint16_t* dst = nullptr;
          int cols = Traits::kL;  // partial rows are 512 wide whatever L is (route.h)
          if (w.whole) {
            const int64_t o = smem.out_row[ctid];
            if (o >= 0) dst = static_cast<uint16_t*>(p.out) + o;
            cols = p.kv_lora_rank;
          } else if (ctid < tile_rows) {
            dst = static_cast<uint16_t*>(p.partial_o) + (partial_row0 + ctid) * Traits::kL;
          }
          if (dst != nullptr) {
            SM90_BULK_COPY_S2G::copy(staged + ctid * Traits::kOutPitch, dst, cols * 2);
          }
          tma_store_arrive();
        }
        out_copies_pending = true;  // the next query tile waits for them (set_out_row's hook)
      } else {
        named_barrier_sync<kAlignedBars>(barrier_id(NamedBarrier::kConsumers),
                                         Traits::kConsumerThreads);
        constexpr int kPieces = Traits::kL / 8;  // 16-byte pieces per row (L 512; fewer below)
        for (int e = ctid; e < tile_rows * kPieces; e += Traits::kConsumerThreads) {
          const int r = e / kPieces, piece = e - r * kPieces;
          const int64_t o = smem.out_row[r];
          if (o >= 0 && piece * 8 < p.kv_lora_rank) {
            store_out8(
                p, o + piece * 8,
                *reinterpret_cast<const uint4*>(staged + r * Traits::kOutPitch + piece * 16));
          }
        }
        // NOTE: the staged bytes are the next segment's query tile, whose stores come after the
        // barrier in load_query_tile_rows.
      }
    }  // segments
    // A tile asked for by a segment without keys lands before the CTA's shared memory goes.
    if (sparse_q_in_flight) mbar_wait(&smem.q_full, 0);
    // The shared memory the last out rows are copied from stays until they have been read.
    if (out_copies_pending && ctid < kRows) tma_store_wait<0>();
  };
  if constexpr (kSplitConsumers) {
    // 512 threads at 128 registers each at launch (__launch_bounds__).
    static_assert(2 * 72 + 208 + 160 <= 4 * 128, "registers the CTA holds at launch");
    if (wg == 1) {
      tma::regs_alloc<208>();
      consumers(std::integral_constant<int, 0>{});
    } else {
      tma::regs_alloc<160>();
      consumers(std::integral_constant<int, 1>{});
    }
  } else {
    tma::regs_alloc<tma::RegisterSplit<Traits, kWideProducer, kGatherPair>::kConsumer>();
    consumers(std::integral_constant<int, -1>{});
  }
}

template <Elem E>
int pair_clusters_resident() {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> resident{};  // count + 1; 0: not read yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxDevices) return 0;
  const int known = resident[device].load();
  if (known > 0) return known - 1;
  auto* kernel = &seesaw_kernel<E, E, false, true, false>;
  int count = 0;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         SeesawTraits<E>::kSmemBytes);
  if (err == cudaSuccess) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(2, 1);
    config.blockDim = dim3(SeesawTraits<E>::kThreads);
    config.dynamicSmemBytes = SeesawTraits<E>::kSmemBytes;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 2;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    err = cudaOccupancyMaxActiveClusters(&count, kernel, &config);
  }
  if (err != cudaSuccess) {
    count = 0;                 // the launch runs unpaired
    (void)cudaGetLastError();  // and does not report this query's error as its own
  }
  resident[device].store(count + 1);
  return count;
}

template <Elem Q, Elem KV>
cudaError_t launch_seesaw(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                          const CUtensorMap& q_map, int num_tiles, bool direct_split, bool pair,
                          bool clean, bool evict_first, cudaStream_t stream, bool pdl) {
  using Traits = SeesawTraits<kSeesawCompute<Q, KV, false>>;
  // fp8 caches run unpaired (widened per CTA), as do fp8_ds_mla's gathered blocks
  constexpr bool kPairs = !tma::Formats<Q, KV>::kFp8Cache && KV != Elem::kFp8DsMla;
  constexpr bool kEvicts = has_evict_first(Q, KV);  // the balanced schedule's evict-first kernel
  constexpr size_t smem = Traits::kSmemBytes;
  const dim3 grid(num_tiles, direct_split ? params.num_splits : params.num_parts);
  if (pair && (direct_split || clean || !kPairs)) return cudaErrorInvalidValue;  // none built
  if (evict_first && (direct_split || clean || pair || !kEvicts)) return cudaErrorInvalidValue;
  auto* kernel = direct_split ? (clean ? &seesaw_kernel<Q, KV, true, false, true>
                                       : &seesaw_kernel<Q, KV, true, false, false>)
                 : clean      ? &seesaw_kernel<Q, KV, false, false, true>
                              : &seesaw_kernel<Q, KV, false, false, false>;
  if constexpr (kPairs) {
    if (pair) kernel = &seesaw_kernel<Q, KV, false, true, false>;
  }
  if constexpr (kEvicts) {
    if (evict_first) kernel = &seesaw_kernel<Q, KV, false, false, false, false, false, true>;
  }
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  return launch_in_clusters(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, pair ? 2u : 1u,
                            params, kv_map, q_map);
}

template <Elem Q, Elem KV>
cudaError_t launch_seesaw_sparse(const DecodeKernelParams& params, const CUtensorMap& q_map,
                                 int num_tiles, bool pair, bool short_splits, cudaStream_t stream,
                                 bool pdl) {
  using Traits = SeesawTraits<kSeesawCompute<Q, KV, true>>;
  constexpr size_t smem = Traits::kSmemBytes;
  // Pairs: the two tiles of a token over e4m3 rows (tma::gather_ahead_blocks).
  constexpr bool kPairs = tma::GatherFormat<KV>::kE4m3;
  if (pair && (!kPairs || num_tiles != 2)) return cudaErrorInvalidValue;  // none built
  // Fewer token rows than tokens: CTAs that walk several tokens (their own instantiation).
  const int rows = params.sparse_rows > 0 ? params.sparse_rows : params.num_tokens;
  const bool token_rows = rows < params.num_tokens;
  // An instantiation and its block size, from the same template arguments (kSeesawThreads: 512
  // where two producer warpgroups load the rows ahead, else Traits::kThreads).
  struct Instance {
    decltype(&seesaw_kernel<Q, KV, false, false, false, true>) kernel;
    int threads;
  };
  auto instance = [](auto paired, auto walks, auto short_runs) {
    constexpr bool kP = decltype(paired)::value, kT = decltype(walks)::value;
    constexpr bool kS = decltype(short_runs)::value;
    return Instance{&seesaw_kernel<Q, KV, false, kP, false, true, kT, false, kS>,
                    kSeesawThreads<Q, KV, kP, true, kT, kS>};
  };
  using No = std::false_type;
  using Yes = std::true_type;
  Instance chosen = token_rows ? instance(No{}, Yes{}, No{}) : instance(No{}, No{}, No{});
  if constexpr (KV == Elem::kFp8DsMla) {
    // Unpaired fp8_ds_mla splits of few blocks: the landing path (kShortSplits).
    if (!token_rows && short_splits) chosen = instance(No{}, No{}, Yes{});
  }
  if constexpr (kPairs) {
    if (pair) chosen = token_rows ? instance(Yes{}, Yes{}, No{}) : instance(Yes{}, No{}, No{});
  }
  cudaError_t err =
      cudaFuncSetAttribute(chosen.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(num_tiles, rows, params.num_splits);
  const CUtensorMap unused{};  // the gather reads the cache through params.kv
  return launch_in_clusters(chosen.kernel, grid, dim3(chosen.threads), smem, stream, pdl,
                            pair ? 2u : 1u, params, unused, q_map);
}

}  // namespace mla::sm90::seesaw
