// Few-rows decode kernel: the chunked TMA ring (tma/) with the GEMMs transposed, keys as M, for
// requests of at most kRows = 16 or 32 query rows (H x q_len), where 64-row tiles would be mostly
// padding.
//
// Work of a CTA (FewRowsCursor): on the balanced schedule (calls of several requests, p.sched_*
// set) part blockIdx.y of the plan's line, one segment per request it touches, in order, grid
// (1, parts); otherwise (one request, or the uniform layout) grid (1, B, S): request blockIdx.y,
// split blockIdx.z of num_splits equal runs of its 64-key blocks (tma::resolve_tile). Each segment
// writes its unnormalized partial (acc, max, sum) of each row, which the combine kernel merges, or,
// where it covers its request (w.whole), out and lse themselves.
//
// Warpgroup roles (384 threads; 512 with three consumers, FewRowsTraits::kConsumers):
//   WG0 producer: tma/chunk_producer.cuh, one K block (64 keys x 576) per stage of a ring of 2, 3
//     or 4 stages, every segment's blocks in turn (tma::walk_segments).
//   WG1, WG2 (, WG3) consumers: consumer c takes the blocks i % kC == c of a segment (on stage c,
//     or stages c and c + 2) on its own, with its own running max, row sums and O^T (512 x kRows,
//     fp32): per block
//       S^T = K Q^T                  (36 x wgmma m64nNk16, A = K block, B = Q tile)
//       m = max(m, colmax S^T), P = exp2(S^T - m), O^T = a O^T + V^T P^T  (32 x m64nNk16,
//       A = V^T: the K block read MN-major, B = P from shared memory)
//     The consumers share no state until the segment's end, where they merge their (m, l, O^T)
//     through the stages of their last blocks, which they release only then.
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

// kC: the CTA's consumer warpgroups (two: `first + consumer`, no test of the index on the path).
template <int kC = 2>
__device__ __forceinline__ uint32_t barrier_id(NamedBarrier b, int consumer = 0) {
  if (kC == 2 || consumer < 2) return static_cast<uint32_t>(b) + consumer;
  const NamedBarrier third = b == NamedBarrier::kMaxFirst    ? NamedBarrier::kMaxThird
                             : b == NamedBarrier::kPFirst    ? NamedBarrier::kPThird
                             : b == NamedBarrier::kVoteFirst ? NamedBarrier::kVoteThird
                                                             : NamedBarrier::kLocalThird;
  return static_cast<uint32_t>(third);
}

// fp8_ds_mla rows as they land (few_rows_kernel's kDsRegs): the power of two 2^(126 - e) for the
// biased exponent e of x >= 0 (at most 252; NaN as the largest): x times it is below 1 (below 4
// for x >= 2^126), and it is 2^126 for x = 0. Every value lies in [2^-126, 2^126].
__device__ __forceinline__ float ds_inv_of(float x) {
  const uint32_t e = min(__float_as_uint(x) >> 23, 252u);
  return __uint_as_float((253u - e) << 23);
}
// 1 / x for a power of two x in [2^-126, 2^126], exactly.
__device__ __forceinline__ float ds_pow2_inverse(float x) {
  return __uint_as_float((254u << 23) - __float_as_uint(x));
}

// Column slot (query row of the thread, 0 .. kRows / 4) of value v of a 64 x N GMMA accumulator:
// values come in pairs of adjacent columns, then the row 8 below, then the next 8 columns.
__device__ __forceinline__ constexpr int col_slot(int v) { return (v & 1) | ((v >> 2) << 1); }

// The segments of a dense call's CTA: on the balanced schedule (p.sched_requests set: calls of
// several requests) tma::PartCursor's, part blockIdx.y of the line (query-row tile 0, the request's
// only one); otherwise one segment, request blockIdx.y's split blockIdx.z (tma::resolve_tile),
// partial rows in the uniform layout [split, T, H]. The producer and the consumers walk the same
// list.
struct FewRowsCursor {
  // Balanced schedule: the next request to look at (tma::PartCursor's b; its other fields follow
  // from blockIdx.y and are recomputed per segment, not held in registers across the segment's
  // blocks). Uniform layout: 0 before the one segment, 1 after it.
  int next_b;

  __device__ __forceinline__ void begin(const DecodeKernelParams& p) {
    next_b = p.sched_requests != nullptr ? p.sched_part_first[blockIdx.y] : 0;
  }

  __device__ __forceinline__ bool next(const DecodeKernelParams& p, tma::TileWork& w,
                                       int64_t& partial_row0) {
    if (p.sched_requests != nullptr) {
      tma::PartCursor part;
      part.part = blockIdx.y;
      part.per = *p.sched_part_blocks;
      part.lo = part.part * part.per;
      part.hi = part.lo + part.per;
      part.b = next_b;
      const bool more = part.next(p, w, partial_row0);
      next_b = part.b;
      return more;
    }
    if (next_b != 0) return false;
    next_b = 1;
    w = tma::resolve_tile(p);
    if (w.row0 >= w.rows) return false;  // a request without query rows
    partial_row0 =
        (static_cast<int64_t>(blockIdx.z) * p.num_tokens + w.token0) * p.num_heads + w.row0;
    return true;
  }
};

// What the consumers need of their segment besides its block count: kept in shared memory
// (SharedMemoryPlan::segment) and read where used, so that the block loop holds no more registers
// than a CTA of one segment did (held in registers, the walk's state spilled loop invariants of
// the N = 32 instantiations to the stack, whose reloads inside the block loop miss L1: +23% at
// B64 q2 H16 bf16-fp8).
struct SegmentState {
  tma::TileWork w;
  int64_t partial_row0;
  int tile_rows;         // the tile's query rows (the rest is padding)
  int tile_limit;        // the first key some row of the tile does not attend
  float skip_threshold;  // skip-softmax: f / seq_len (sparse: / the counted entries); 0: off
};

// The traits of the few-rows kernel for (Q, KV): with kFp8Direct (an e4m3 cache read by the GEMMs
// as it lands, dense or sparse) e4m3 GEMMs for an e4m3 query, fp16 GEMMs with A from registers
// for a bf16 one (its rows scaled into fp16's range); a sparse call's bf16 query over an e4m3
// cache widened by the gather: fp16 GEMMs over the scaled query too; else the 16-bit GEMMs of
// tma::Formats.
template <Elem Q, Elem KV, bool kSparse>
inline constexpr bool kScaledSparseQuery = kSparse&& Q == Elem::kBf16&& KV == Elem::kFp8E4M3;
// A sparse call's fp8_ds_mla rows read as they land (kFp8Direct) land whole, one bulk copy a row
// (tma::gather_rows_bulk), at their own 656 bytes. Per-tensor e4m3 rows keep the 64-byte swizzle
// of the chunks (0): landed whole (at a pitch of 592 bytes) they ran 1 to 2% slower at B64 H16 and
// H32 (docs/perf-notes.md, fp8_ds_mla rows landed whole).
template <Elem KV, bool kFp8Direct, bool kSparse>
inline constexpr int kBulkRowPitch =
    kFp8Direct&& kSparse&& KV == Elem::kFp8DsMla ? tma::kDsMlaRowBytes : 0;
// kDeepRing: the e4m3 GEMMs (an e4m3 query over an e4m3 cache read as it lands) on four stages
// (FewRowsTraits::kStages; the route's few_rows_deep).
// kConsumers: consumer warpgroups (FewRowsTraits::kConsumers).
template <Elem Q, Elem KV, int kRows, bool kFp8Direct, bool kSparse = false, bool kDeepRing = false,
          int kConsumers = 2>
using FewRowsTraitsOf =
    FewRowsTraits<kFp8Direct ? (Q == Elem::kFp8E4M3 ? Elem::kFp8E4M3 : Elem::kFp16)
                  : kScaledSparseQuery<Q, KV, kSparse> ? Elem::kFp16
                                                       : tma::Formats<Q, KV>::kCompute,
                  kRows, kFp8Direct && Q == Elem::kBf16, kFp8Direct && KV == Elem::kFp8DsMla,
                  kBulkRowPitch<KV, kFp8Direct, kSparse>, kDeepRing, kConsumers>;

// The K fragment of chunk `c` (64 columns, four k steps of 16) of this warp's 16 keys for an fp16
// S^T GEMM with A from registers, widened from the e4m3 stage (64-byte swizzle): lane t holds
// keys t / 4 and t / 4 + 8 and, per k step, the k slots 2q, 2q + 1, 2q + 8, 2q + 9 (q = t % 4).
// A plain ldmatrix of 16-bit elements gives lane t columns 4q .. 4q + 3 of a 16-column group, so
// slots 2q, 2q + 1 take columns 4q, 4q + 1 and slots 2q + 8, 2q + 9 columns 4q + 2, 4q + 3: the
// query tile is stored with its columns in that order (load_query_tile_rows, kPermute16).
// In two steps, so that a chunk's loads can go ahead of its widening: load_e4m3_k_words (two
// ldmatrix; raw[4 x + 2 h + k]: k step pair x, keys g + 8 k of group h), then widen_e4m3_k_words
// (out[4 u + r]: register r of k step u; each pair widened from its half of the word).
// kPitch: whole rows at that pitch (FewRowsTraits::kRowPitch), the same bytes at
// e4m3_offset<kPitch>.
template <int kPitch>
__device__ __forceinline__ uint32_t e4m3_offset(int c, int key, int u) {
  if constexpr (kPitch > 0) {
    return key * kPitch + c * 64 + (u << 4);
  } else {
    return c * 64 * 64 + key * 64 + ((u ^ ((key >> 1) & 3)) << 4);
  }
}
template <int kPitch>
__device__ __forceinline__ void load_e4m3_k_words(uint32_t stage_addr, int c, int warp, int lane,
                                                  uint32_t (&raw)[8]) {
  const int j = lane >> 3, r = lane & 7;
  const int key = 16 * warp + 8 * (j & 1) + r;  // lane i: row i % 8 of matrix i / 8
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int u = 2 * x + (j >> 1);  // the matrix's 16-column group of the chunk
    const uint32_t addr = stage_addr + e4m3_offset<kPitch>(c, key, u);
    // keys g and g + 8 of groups 2x and 2x + 1
    tma::ldmatrix_x4(addr, raw[4 * x], raw[4 * x + 1], raw[4 * x + 2], raw[4 * x + 3]);
  }
}
__device__ __forceinline__ void widen_e4m3_k_words(const uint32_t (&raw)[8], uint32_t (&out)[16]) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t* o = out + 4 * (2 * x + h);
      const uint32_t w0 = raw[4 * x + 2 * h], w1 = raw[4 * x + 2 * h + 1];
      o[0] = tma::widen_e4m3x2_half_of<false>(w0);
      o[1] = tma::widen_e4m3x2_half_of<false>(w1);
      o[2] = tma::widen_e4m3x2_half_of<true>(w0);
      o[3] = tma::widen_e4m3x2_half_of<true>(w1);
    }
  }
}

// The V^T fragment of m tile `m` (V columns 64 m ..) for an fp16 O^T GEMM with A from registers,
// four k steps of 16 keys, widened from the e4m3 stage: the transposed ldmatrix of
// load_fp8_v_fragment, each register one key pair of one column (the same row relabelling,
// fp8_o_row; the keys keep their order). In two steps as the K fragment's: load_e4m3_vt_words
// (raw[4 x + 2 h + k]), then widen_e4m3_vt_words (out[4 u + r]: register r of k step u; one byte
// permute puts both columns' pairs of a word in its two halves, each widened from its half).
template <int kPitch>
__device__ __forceinline__ void load_e4m3_vt_words(uint32_t stage_addr, int m, int warp, int lane,
                                                   uint32_t (&raw)[8]) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int key = 32 * x + lane;
    const uint32_t addr = stage_addr + e4m3_offset<kPitch>(m, key, warp);
    // keys 0..7, 8..15, 16..23, 24..31 of the pair of k steps
    tma::ldmatrix_x4_trans(addr, raw[4 * x], raw[4 * x + 1], raw[4 * x + 2], raw[4 * x + 3]);
  }
}
__device__ __forceinline__ void widen_e4m3_vt_words(const uint32_t (&raw)[8], uint32_t (&out)[16]) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t* o = out + 4 * (2 * x + h);
      // Bytes 0 and 2: keys 2q, 2q + 1 of column 2 (t / 4); bytes 1 and 3: of column 2 (t / 4) + 1.
      const uint32_t w0 = __byte_perm(raw[4 * x + 2 * h], 0, 0x3120);
      const uint32_t w1 = __byte_perm(raw[4 * x + 2 * h + 1], 0, 0x3120);
      o[0] = tma::widen_e4m3x2_half_of<false>(w0);
      o[1] = tma::widen_e4m3x2_half_of<true>(w0);
      o[2] = tma::widen_e4m3x2_half_of<false>(w1);
      o[3] = tma::widen_e4m3x2_half_of<true>(w1);
    }
  }
}

// Loads the V^T fragment of m tile `m` (V columns 64 m .. 64 m + 63, the stage's chunk m) for both
// k steps of 32 keys of an e4m3 PV GEMM (wgmma A from registers, 8-bit layout: lane t holds rows
// t / 4 and t / 4 + 8 of its warp's 16, k columns 4 (t % 4) .. + 3 and 16 + 4 (t % 4) .. + 3).
// One transposed ldmatrix per k step gives lane t the byte pairs of keys 2q, 2q + 1 (q = t % 4) of
// four 8-key matrices at value columns 2 (t / 4) and 2 (t / 4) + 1; two byte permutes make the A
// registers without any exchange between lanes, at the price of two fixed relabellings:
//   - A row r (< 8) of warp w is value column 16 w + 2 r, row r + 8 is 16 w + 2 r + 1 (the O^T
//     accumulator rows follow: fp8_o_row);
//   - k slot 4 q + j of each group of 16 keys is key 2 q (j 0), 8 + 2 q (1), 2 q + 1 (2), 9 + 2 q
//     (3) of the group, so P^T is stored with that order of its keys (fp8_p_slot).
__device__ __forceinline__ void load_fp8_v_fragment(uint32_t stage_addr, int m, int warp, int lane,
                                                    uint32_t (&a)[2][4]) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int key = 32 * k + lane;  // lane i: row i % 8 of matrix i / 8
    const uint32_t addr = stage_addr + e4m3_offset<0>(m, key, warp);
    uint32_t x0, y0, x1, y1;  // keys 0..7, 8..15, 16..23, 24..31 of the k step
    tma::ldmatrix_x4_trans(addr, x0, y0, x1, y1);
    a[k][0] = tma::byte_perm(x0, y0, 0x6240);  // row r: keys 2q, 8 + 2q, 2q + 1, 9 + 2q
    a[k][1] = tma::byte_perm(x0, y0, 0x7351);  // row r + 8
    a[k][2] = tma::byte_perm(x1, y1, 0x6240);
    a[k][3] = tma::byte_perm(x1, y1, 0x7351);
  }
}

// The k slot of key `key` (0..63) of a block in the e4m3 PV GEMM (load_fp8_v_fragment).
__device__ __forceinline__ constexpr int fp8_p_slot(int key) {
  return (key & ~15) | (((key & 7) >> 1) << 2) | ((key & 1) << 1) | ((key >> 3) & 1);
}
// The V column of O^T accumulator row `l` (the GMMA's row index) of the e4m3 PV GEMM.
__device__ __forceinline__ constexpr int fp8_o_row(int l) {
  return (l & ~15) | ((l & 7) << 1) | ((l >> 3) & 1);
}

// One m tile's partial of the e4m3 PV GEMM over a block's two k steps, issued as one commit group:
// t = V^T P^T, A (V^T) from the registers `frag` (load_fp8_v_fragment) through tOrA's registers,
// B (P^T) the shared-memory fragment tOrP.
template <typename Mma, typename FragA, typename FragB, typename Acc>
__device__ __forceinline__ void issue_fp8_pv(Mma& mma, FragA& tOrA, FragB& tOrP, Acc& t,
                                             const uint32_t (&frag)[2][4]) {
  using namespace cute;
  warpgroup_fence_operand(t);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < 2; ++k) {
    Tensor a = recast<uint32_t>(tOrA(_, 0, k));
    CUTE_UNROLL
    for (int i = 0; i < 4; ++i) a(i) = frag[k][i];
    cute::gemm(mma, tOrA(_, 0, k), tOrP(_, 0, k), t(_, 0, 0));
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// Q, KV: the query's and kv_cache's formats (tma::Formats): an e4m3 cache is widened in shared
// memory by the producer warpgroup (tma/fp8_ring.cuh), an e4m3 query as its tile loads; or, with
// kFp8Direct (a per-tensor e4m3 cache; sparse calls: gathered as e4m3 by
// tma::gather_e4m3_direct), the cache lands as e4m3 and the GEMMs read it there:
// with an e4m3 query (kFp8Mma) both GEMMs run on the FP8 tensor cores; with a bf16 query
// (kFp8Regs) fp16 GEMMs take their A operands (K, V^T) widened into registers, the query's rows
// scaled by powers of two into fp16's range (docs/sm90-fp8.md).
// kSparse: a sparse call, one CTA per (query token, split) (tma::resolve_sparse_tile), its blocks
// gathered by index (tma/gather.cuh); the keys are the token's counted entries, each attended by
// every row unless it is -1.
// kPairMerge (sparse calls of two splits a token, one token per CTA row): the two splits run as a
// cluster of two (grid z); rank 1 stores its partial as usual and then arrives on rank 0's
// merge_bar (release at cluster scope, after every consumer thread's fence), and rank 0 writes the
// token's out and lse itself from its own O and rank 1's partial, with the combine's formulas
// (combine_kernel.cuh), so that no combine kernel runs.
template <Elem Q, Elem KV, int kRowsN, bool kSparse, bool kFp8Direct = false,
          bool kDeepRing = false, int kConsumersN = 2, bool kPairMerge = false>
__global__ void __launch_bounds__(
    FewRowsTraitsOf<Q, KV, kRowsN, kFp8Direct, kSparse, kDeepRing, kConsumersN>::kThreads, 1)
    few_rows_kernel(const __grid_constant__ DecodeKernelParams p,
                    const __grid_constant__ CUtensorMap kv_map) {
  using namespace cute;
  using F = tma::Formats<Q, KV>;
  // kDsRegs: a sparse call's fp8_ds_mla rows as they land, whole (tma::gather_rows_bulk): the
  // kFp8Regs GEMMs over the latent chunks, one partial per latent group scaled by the keys'
  // group scales, the rope part in bf16, and P scaled per group (docs/sm90-sparse.md, fp8_ds_mla
  // rows read as they land).
  constexpr bool kDsRegs = kFp8Direct && KV == Elem::kFp8DsMla;
  static_assert(!kFp8Direct || (F::kFp8Cache && KV == Elem::kFp8E4M3) ||
                    (kDsRegs && kSparse && kRowsN == 16 && Q == Elem::kBf16),
                "a per-tensor e4m3 cache, or a sparse call's fp8_ds_mla rows at 16 rows");
  constexpr bool kFp8Mma = kFp8Direct && F::kFp8Query;
  constexpr bool kFp8Regs = kFp8Direct && !F::kFp8Query;
  // A bf16 query in fp16 GEMMs, its rows scaled by powers of two into fp16's range.
  constexpr bool kScaledQuery = kFp8Regs || kScaledSparseQuery<Q, KV, kSparse>;
  using Traits = FewRowsTraitsOf<Q, KV, kRowsN, kFp8Direct, kSparse, kDeepRing, kConsumersN>;
  using T = typename Traits::T;
  constexpr int kC = Traits::kConsumers;
  // Each consumer on a stage of its own (two stages of two consumers, three of three), or (four
  // stages of two) on stages c and c + 2 by round parity.
  constexpr bool kOwnStage = Traits::kStages == kC;
  using Plan = typename Traits::SharedMemoryPlan;
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys, kL = Traits::kL;
  constexpr int kCols = Traits::kColsPerThread;
  // kFp8Mma: chunks of the K block per promoted partial of the score sums (below, qk_gemm).
  constexpr int kPartialChunks = 3;

  extern __shared__ uint8_t smem_raw[];
  Plan& smem = shared_plan<Plan>(smem_raw);

  pdl_wait();  // inputs may come from the previous grid in the stream
  pdl_launch_dependents();

  // Gathered blocks: sparse calls, and the fp8_ds_mla cache (no TMA box widens it) of dense ones.
  constexpr bool kGather = kSparse || KV == Elem::kFp8DsMla;
  // NOTE: sparse calls have a row per token here too, but tma::SparseTokenCursor (which the seesaw
  // kernel's sparse instantiations take) cost B64 H16 fp8_ds_mla +3% in this kernel.
  using Cursor = std::conditional_t<kSparse, tma::SparseCursor<kRowsN>, FewRowsCursor>;
  // The producer warpgroup's registers: 56 where it widens or gathers; 72 where it walks the
  // segments of a dense call while it does (the consumers keep 216): with 56, the walk's state
  // spilled, and its reloads missed L1 in every block (B64 q2 H16 bf16-fp8 +23%).
  constexpr bool kWiden = F::kFp8Cache && !kFp8Direct;  // the producer widens the cache
  constexpr bool kWideProducer = kWiden || kGather;
  using Split = tma::RegisterSplit<Traits, kWideProducer>;
  constexpr bool kRoomy = kWideProducer && !kSparse;
  // Sparse calls of 16 rows over e4m3 rows load each block's 64 rows into registers one block
  // ahead (tma::gather_ahead_blocks): a producer lane holds 352 bytes of two rows (136 registers;
  // the consumers' 184 fit N 16 without spills, not N 32, which keeps the landing path).
  constexpr bool kAhead =
      kSparse && !kFp8Direct && tma::GatherFormat<KV>::kE4m3 && Traits::kRows == 16;
  // Sparse calls over a per-tensor e4m3 cache read as it lands (kFp8Direct): the producer only
  // issues copies (tma::gather_e4m3_direct), the consumers keep the dense direct route's registers.
  constexpr bool kDirectGather = kSparse && kFp8Direct;
  constexpr uint32_t kProducerRegs = kAhead          ? 136
                                     : kDirectGather ? Traits::kProducerRegs
                                     : kRoomy        ? 72
                                                     : Split::kProducer;
  constexpr uint32_t kConsumerRegs = kAhead          ? 184
                                     : kDirectGather ? Traits::kConsumerRegs
                                     : kRoomy        ? 216
                                                     : Split::kConsumer;
  static_assert(kProducerRegs + kC * kConsumerRegs <= (kC == 3 ? 4 * 128 : 3 * 168),
                "registers the CTA holds at launch");
  const int issuers = tma::producer_issuers<Traits>(p);
  if constexpr (kAhead) {
    tma::init_gather_ahead_barriers<Traits, KV, false>(smem);
  } else if constexpr (kDirectGather) {
    // Full barriers: one arrival per producer thread's copies of the chunk (kRowPitch: per row,
    // on chunk 0's alone); empty barriers: one per consumer thread.
    tma::init_ring_barriers<Traits, false, false, true>(
        smem, Traits::kRowPitch > 0 ? Traits::kKeys : 128);
  } else if constexpr (kGather) {
    tma::init_gather_barriers<Traits, KV>(smem);
  } else {
    tma::init_ring_barriers<Traits, false, kWiden, kFp8Direct>(smem, issuers);
  }
  static_assert(!kPairMerge || kSparse, "the pair merge is a sparse call's");
  if constexpr (kPairMerge) {
    // Rank 1 arrives on rank 0's merge_bar: initialized and made visible to the cluster first.
    if (threadIdx.x == 0) {
      tma::mbar_init(&smem.merge_bar, 1);
      tma::fence_mbar_init();
    }
    tma::cluster_sync_relaxed();
  }

  // NOTE: CUTLASS broadcasts the index from lane 0, so the compiler knows it is warp-uniform: the
  // consumer index, its stage addresses and the GMMA descriptors then live in uniform registers
  // (from threadIdx.x / 128, ~4 R2UR and the descriptor arithmetic came before every wgmma:
  // docs/sm90-seesaw.md, Resources).
  const int wg = cutlass::canonical_warp_group_idx();
  if (wg == 0) {
    // ---- producer warpgroup: every segment's blocks through one ring; lane 0 of warp q issues
    // page piece q ----
    tma::regs_dealloc<kProducerRegs>();
    uint32_t used0, used1;  // parity of the blocks each stage has held (its phase)
    if constexpr (kSparse) {
      // One segment: no walk (its state would cost the gather registers).
      const tma::TileWork w = tma::resolve_sparse_tile(p, blockIdx.x, blockIdx.y, kRows);
      if (w.row0 < w.rows && w.block_begin < w.block_end) {
        if constexpr (kAhead) {
          tma::gather_ahead_blocks<Traits, KV, false>(p, w, smem, threadIdx.x, 0, 0, 0);
        } else if constexpr (kDirectGather && Traits::kRowPitch > 0) {
          if (threadIdx.x < Traits::kKeys) tma::gather_rows_bulk<Traits>(p, w, smem, threadIdx.x);
        } else if constexpr (kDirectGather) {
          tma::gather_e4m3_direct<Traits>(p, w, smem, threadIdx.x);
        } else {
          tma::gather_blocks<Traits, KV, false, true>(p, w, smem, threadIdx.x, 0, 0);
        }
      }
      return;
    } else if constexpr (kGather) {
      tma::walk_segments<Cursor>(
          p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
            tma::gather_blocks<Traits, KV, false, false>(p, w, smem, threadIdx.x, u0, u1);
          });
      return;
    } else if constexpr (kWiden) {
      // fp8 cache: lane q of warp 0 issues page piece q into the landing areas, warps 1..3 widen.
      const bool issuer = threadIdx.x < issuers;
      if (threadIdx.x >= 32 || issuer) {
        if (issuer) tma::prefetch_tensor_map(&kv_map);
        tma::walk_segments<Cursor>(
            p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
              if (issuer) {
                tma::issue_fp8_chunks<Traits>(p, w, &kv_map, smem, threadIdx.x, u0, u1);
              } else {
                tma::widen_fp8_chunks<Traits>(w, smem, threadIdx.x - 32, u0, u1,
                                              barrier_id(NamedBarrier::kWiden));
              }
            });
      }
      return;
    }
    const int piece = threadIdx.x / 32;
    if (piece < issuers && threadIdx.x % 32 == 0) {
      tma::prefetch_tensor_map(&kv_map);
      tma::walk_segments<Cursor, Traits::kStages>(
          p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
            tma::produce_chunks<Traits>(p, w, &kv_map, smem, piece, u0, u1);
          });
    }
    return;
  }

  // ---- consumer warpgroups ----
  tma::regs_alloc<kConsumerRegs>();
  const int cw = wg - 1;                    // consumer index: its blocks (i % kC) and stage
  const int ctid = threadIdx.x - 128;       // 0..kConsumerThreads - 1 over the consumers
  const int wtid = threadIdx.x - 128 * wg;  // 0..127 within the warpgroup
  const int lane = threadIdx.x & 31;
  const int warp = wtid / 32;
  // NOTE: before every consumers' barrier that hands stores of one consumer warpgroup to the
  // others, each warpgroup syncs itself: with the consumers' barrier alone, racecheck reported such
  // pairs as hazards (docs/sm90-few-rows.md, Sanitizers).
  auto sync_local = [&] { named_barrier_sync(barrier_id<kC>(NamedBarrier::kLocalFirst, cw), 128); };

  typename Traits::TiledMmaQk mma_qk;
  typename Traits::TiledMmaPv mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(wtid);
  auto thr_pv = mma_pv.get_thread_slice(wtid);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_B(sQ);  // (MMA, 1, 36) descriptors
  Tensor sP = make_tensor(make_smem_ptr(smem.p[cw][0]), typename Traits::SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_B(sP);  // (MMA, 1, 4)
  // kDsRegs: P^T of latent group g (the B operand of m tiles 2 g and 2 g + 1).
  auto group_p = [&](int g) {
    return thr_pv.partition_fragment_B(
        make_tensor(make_smem_ptr(smem.p[cw][g]), typename Traits::SmemLayoutP{}));
  };
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kKeys>, Int<kRows>>{});
  // kFp8Mma: each GEMM's partial sums go through fp32 (below, promoted); the V^T fragments.
  Tensor tSrT0 = partition_fragment_C(mma_qk, Shape<Int<kKeys>, Int<kRows>>{});
  Tensor tSrT1 = partition_fragment_C(mma_qk, Shape<Int<kKeys>, Int<kRows>>{});
  Tensor tOrT0 = partition_fragment_C(mma_pv, Shape<Int<64>, Int<kRows>>{});
  Tensor tOrT1 = partition_fragment_C(mma_pv, Shape<Int<64>, Int<kRows>>{});
  // kFp8Regs: the widened K fragments of a chunk (double-buffered) and V^T fragments of an m tile.
  auto regs_a = [&](auto& mma) {  // (MMA, 1, 4) bf16 registers
    if constexpr (kFp8Regs) {
      return mma.get_thread_slice(wtid).partition_fragment_A(
          make_tensor(make_smem_ptr(smem.q), Layout<Shape<Int<64>, Int<64>>>{}));
    } else {
      return 0;
    }
  };
  auto tSrA0 = regs_a(mma_qk);
  auto tSrA1 = regs_a(mma_qk);
  auto tOrA0 = regs_a(mma_pv);
  auto tOrA1 = regs_a(mma_pv);
  auto tOrA = [&] {  // (MMA, 1, 2) e4m3 registers
    if constexpr (kFp8Mma) {
      return thr_pv.partition_fragment_A(
          make_tensor(make_smem_ptr(smem.k[0]), Layout<Shape<Int<64>, Int<kKeys>>>{}));
    } else {
      return 0;
    }
  }();
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kL>, Int<kRows>>{});
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kKeys>, Int<kRows>>{}));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kL>, Int<kRows>>{}));
  static_assert(size(decltype(tSrS){}) == kRows / 2, "S^T fragment: 64 x N over 128 threads");
  static_assert(size(decltype(tOrO){}) == 4 * kRows, "O^T fragment: 512 x N over 128 threads");

  // The thread's query rows (columns of S^T and O^T): slot s is the column of the values v with
  // col_slot(v) == s.
  auto my_col = [&](int s) { return 2 * (lane & 3) + (s & 1) + 8 * (s >> 1); };
  // A 16-bit P tile (rows x keys, SmemLayoutP at byte address `base`) from S^T's fragment, value v
  // being value(v): per 16 rows one transposed stmatrix of the warp's four 8 x 8 matrices (keys
  // 16 w + 8 h .. + 7 by rows 8 b .. + 7 in register h + 2 b: values 2 h + 4 b and the next, two
  // adjacent rows of one key), each of whose transposed rows (one query row, 8 keys) is a 16-byte
  // unit of the swizzled row. One store instead of eight 2-byte ones, and one address a thread
  // instead of one a value: held across the blocks, those were what ptxas spilled (2 reloads a
  // block in the three-consumer kernel, 8 in the 32-row bf16-query one; docs/perf-notes.md,
  // Change 136).
  const uint32_t p_lane_offset =
      tma::swizzled_offset(8 * (lane >> 4) + (lane & 7), 16 * warp + 8 * ((lane >> 3) & 1), kRows);
  auto store_p16 = [&](uint32_t base, auto value) {
    auto pack = [&](int v) {
      if constexpr (std::is_same_v<T, cute::bfloat16_t>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(value(v), value(v + 1));
        return *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(value(v), value(v + 1));
        return *reinterpret_cast<const uint32_t*>(&h);
      }
    };
#pragma unroll
    for (int q = 0; q < kRows / 16; ++q) {
      tma::stmatrix_x4_trans(base + p_lane_offset + tma::swizzled_offset(16 * q, 0, kRows),
                             pack(8 * q), pack(8 * q + 2), pack(8 * q + 4), pack(8 * q + 6));
    }
  };
  const float bmm1_scale = bmm1_scale_of(p);
  const float score_scale = bmm1_scale * 1.4426950408889634f;  // log2(e): scores in base 2

  // One arrive per consumer warp on one of the stage's empty barriers; kFp8Direct: one per thread,
  // which is not a divergent path (the releases come while the P V GEMMs run, and a divergent
  // arrive there made ptxas serialize them).
  // kGather: one per thread too (tma::kGatherReleases), each thread's reads of the block's entries
  // ordered before the producer's next ones by its own arrive.
  auto release = [&](uint64_t* bar) {
    if constexpr (kFp8Direct || kGather) {
      mbar_arrive(bar);
    } else {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    }
  };

  // kPairMerge, rank 0: row c of the tile (own max m0 in natural-log units, own sum l0; -inf and 0
  // without a key) merged with rank 1's partial row: lse written, and out_row, out_scale (what the
  // own staged O is multiplied by) and other_scale (what rank 1's partial o is) for the stores.
  // The combine's formulas (combine_kernel.cuh): w_s = z_s exp(m_s - M), Z = w0 + w1, out = (w0
  // o0 + w1 o1) / (Z + exp(sink - M)), o0 = bmm2 O0 / l0 unrounded here.
  auto pair_row = [&](const tma::TileWork& pw, int64_t own_row0, int c, float m0, float l0) {
    int t, h;
    const bool ok = row_token(p, pw.row0 + c, pw.token0, t, h);
    const int64_t at = own_row0 + static_cast<int64_t>(p.num_tokens) * p.num_heads + c;
    const float m1 = __ldcg(&p.partial_max[at]), l1 = __ldcg(&p.partial_sum[at]);
    const float m = fmaxf(m0, m1);
    const float w0 = m0 == kNegInf ? l0 * 0.0f : l0 * expf(m0 - m);
    const float w1 = m1 == kNegInf ? l1 * 0.0f : l1 * expf(m1 - m);
    const float bmm2 = bmm2_scale_of(p);
    const float bmm2_ok = isfinite(bmm2) ? 1.0f : __int_as_float(0x7fffffff);
    const RowOutput ro = row_output(bmm2_ok, ok ? sink_of(p, h) : kNegInf, m, w0 + w1);
    if (ok && p.lse != nullptr) p.lse[lse_offset(p, t, h)] = ro.lse;
    smem.out_row[c] = ok ? out_offset(p, t, h) : int64_t{-1};
    smem.out_scale[c] = w0 != 0.0f ? w0 * __fdiv_rn(bmm2, l0) * ro.scale : 0.0f;
    smem.other_scale[c] = w1 != 0.0f ? w1 * ro.scale : 0.0f;
  };
  // kPairMerge, rank 0: 8 values of rank 1's partial o (row `row`, columns d..), read from L2.
  auto load_other = [&](int64_t row, int d) {
    return __ldcg(
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.partial_o) + row * kL + d));
  };
  // kPairMerge, rank 0: those 8 values (u) times g, added to v.
  auto add_other = [&](float(&v)[8], const uint4& u, float g) {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 f;
      if (p.out_fp16) {
        f = __half22float2(*reinterpret_cast<const __half2*>(&words[k]));
      } else {
        f = make_float2(__uint_as_float(words[k] << 16), __uint_as_float(words[k] & 0xffff0000u));
      }
      v[2 * k] = fmaf(f.x, g, v[2 * k]);
      v[2 * k + 1] = fmaf(f.y, g, v[2 * k + 1]);
    }
  };

  uint32_t used = 0;  // blocks this consumer's stage has held before the segment (its phase)
  Cursor cursor;
  cursor.begin(p);
  tma::TileWork w;
  int64_t partial_row0;
  SegmentState& seg = *reinterpret_cast<SegmentState*>(smem.segment);
  static_assert(sizeof(SegmentState) <= sizeof(smem.segment), "segment state");
  while (cursor.next(p, w, partial_row0)) {
    const int tile_rows = min(kRows, w.rows - w.row0);
    if (w.block_begin >= w.block_end) {  // no key of the tile in this segment
      if constexpr (kPairMerge) {
        if (blockIdx.z != 0) {  // rank 1: its empty partial, then rank 0's barrier
          tma::store_empty_segment(p, w, partial_row0, tile_rows, ctid, Traits::kConsumerThreads);
          __threadfence();
          sync_local();
          named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
          if (ctid == 0) tma::mbar_arrive_cluster_release(&smem.merge_bar, 0);
        } else {  // rank 0: out from rank 1's partial alone
          tma::mbar_wait_cluster(&smem.merge_bar, 0);
          if (ctid < tile_rows) pair_row(w, partial_row0, ctid, kNegInf, 0.0f);
          sync_local();
          named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
          const int64_t other_row0 =
              partial_row0 + static_cast<int64_t>(p.num_tokens) * p.num_heads;
          for (int e = ctid; e < tile_rows * (kL / 8); e += Traits::kConsumerThreads) {
            const int c = e / (kL / 8), d = (e - c * (kL / 8)) * 8;
            const int64_t o = smem.out_row[c];
            if (o < 0 || d >= p.kv_lora_rank) continue;
            float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            const float g = smem.other_scale[c];
            if (g != 0.0f) add_other(v, load_other(other_row0 + c, d), g);
            store_out8(p, o + d,
                       make_uint4(pack_out(p, v[0], v[1]), pack_out(p, v[2], v[3]),
                                  pack_out(p, v[4], v[5]), pack_out(p, v[6], v[7])));
          }
          sync_local();
          named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
        }
        continue;
      }
      tma::store_empty_segment(p, w, partial_row0, tile_rows, ctid, Traits::kConsumerThreads);
      continue;
    }
    const int num_blocks = w.block_end - w.block_begin;
    // NOTE: the previous segment's reads of seg ended before its last barrier; this segment's
    // reads come after the first barrier of the query tile's load.
    if (ctid == 0) {
      const int first_query = w.seq_len - w.n;
      const int skip_len = kSparse ? w.extent : w.seq_len;
      seg.w = w;
      seg.partial_row0 = partial_row0;
      seg.tile_rows = tile_rows;
      seg.tile_limit =
          kSparse ? w.extent : max(0, p.mask != nullptr ? first_query : first_query + 1);
      seg.skip_threshold = p.skip_softmax_factor > 0.0f && skip_len > 0
                               ? __fdiv_rn(p.skip_softmax_factor, static_cast<float>(skip_len))
                               : 0.0f;
    }

    // Query tile into shared memory (padding rows 0). The previous segment's GEMMs are complete:
    // every consumer passed its final barrier.
    {
      tma::load_query_tile_rows<kRows, Traits::kConsumerThreads,
                                std::conditional_t<F::kFp8Query && !kFp8Mma, __half, void>, kFp8Mma,
                                kScaledQuery, kFp8Regs, kDsRegs>(
          p, w, tile_rows, reinterpret_cast<uint8_t*>(smem.q), smem.query_row, ctid,
          [&] {
            sync_local();  // the row pointers, stored by the first warp
            named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
          },
          [] {}, smem.query_max, smem.query_unscale);
      fence_proxy_async_smem();
      named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
    }
    clear(tOrO);
    // What the raw scores of the thread's column slot s are multiplied by (base 2): kScaledQuery,
    // the bmm1 scale times the inverse of the row's fp16 scale (read where used: held across the
    // blocks, the N = 32 loop spilled).
    auto col_scale = [&](int s) {
      return kScaledQuery ? score_scale * smem.query_unscale[my_col(s)] : score_scale;
    };

    // A row attends keys j < limit (and, with a custom mask, the mask rule). Sparse: every row
    // counts the token's entries [0, extent). Read from seg where a block needs it.
    auto limit_of = [&](int r) {
      const tma::TileWork& sw = seg.w;
      if (kSparse || r >= seg.tile_rows) return sw.extent;  // padding: a column nobody reads
      if (p.mask != nullptr) return sw.seq_len;
      return max(0, sw.seq_len - sw.n + (sw.row0 + r) / p.num_heads + 1);
    };
    // The first key some row of the tile does not attend (with a mask: the first draft key), the
    // thread's rows' least limit below it. Blocks past it take the masked path in every thread,
    // and their V rows from it on are cleaned (tma::clean_v_rows). Sparse: the gather lands keys
    // past the extent and -1 entries as zeros.
    int min_limit = seg.tile_limit;
#pragma unroll
    for (int s = 0; s < kCols; ++s) min_limit = min(min_limit, limit_of(my_col(s)));
    // The attended-set rule of slot s (tma::RowRule), built where a block needs masking.
    auto rule_of = [&](int s) {
      const tma::TileWork& sw = seg.w;
      tma::RowRule rule;
      const int r = my_col(s);
      rule.limit = limit_of(r);
      rule.first_query = sw.seq_len - sw.n;
      rule.mask = nullptr;
      if (!kSparse && p.mask != nullptr && r < seg.tile_rows) {
        const int i = (sw.row0 + r) / p.num_heads;  // the row's token (the tile starts at row0)
        const int t = p.cum_seq_lens_q != nullptr ? sw.token0 + i : i;
        rule.mask = p.mask + sw.b * p.mask_batch + t * p.mask_token;
      }
      return rule;
    };

    float col_max[kCols], col_sum[kCols];  // this consumer's running max (base 2), own-key sums
#pragma unroll
    for (int s = 0; s < kCols; ++s) {
      col_max[s] = kNegInf;
      col_sum[s] = 0.0f;
    }
    // kDsRegs: per latent group, the power of two P is multiplied by (with the keys' scales) before
    // it is rounded to fp16: below 1 / (the largest |scale| of the consumer's keys so far), so that
    // P s < 1; O^T's m tiles of the group are in its units (ds_inv_of).
    float ds_inv[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) ds_inv[g] = ds_inv_of(0.0f);

    for (int it = cw; it < num_blocks; it += kC) {
      const int round = it / kC;
      const int par = round & 1;
      // Stage of the block and its phase: 16-bit rings, stage cw (used: its blocks so far); e4m3
      // rings, stages cw and cw + 2 by round parity (used: their parities, bits 0 and 1).
      // NOTE: broadcast from lane 0 (as cutlass::canonical_warp_group_idx does), so that the
      // compiler knows the stage is warp-uniform and builds its GMMA descriptors in uniform
      // registers (from `it`, ~8 R2UR and moves came before every chunk's wgmmas).
      const int stage = __shfl_sync(0xffffffffu, kOwnStage ? cw : cw + 2 * (round & 1), 0);
      const uint32_t phase =
          kOwnStage ? (used + round) & 1 : ((used >> (round & 1)) + (round >> 1)) & 1;
      const int key0 = (seg.w.block_begin + it) * kKeys;
      T* k_stage = smem.k[stage];
      // kDsRegs: the group scales of the thread's two keys (tScS rows r and r + 8), and each
      // group's factor for O^T where its units change (ds_inv).
      float ds_scale[2][4];
      float ds_factor[4];

      // ---- qk_gemm: S^T = K Q^T over the whole block, each 64-column chunk issued as it lands
      // ----
      {
        Tensor sK = make_tensor(make_smem_ptr(k_stage), typename Traits::SmemLayoutK{});
        Tensor tSrK = thr_qk.partition_fragment_A(sK);
        // kFp8Regs, kDsRegs: chunk c's e4m3 words are loaded once it lands (`load`), then widened
        // into the A registers `a` and issued as the chunk's four k steps into `acc` (from zero
        // where `zero`), and chunk c + 1's words loaded behind them (below `chunks`).
        const uint32_t stage_addr = tma::smem_addr(k_stage);
        uint32_t raw[8];
        auto load = [&](int c) {
          // kRowPitch: the block lands whole on chunk 0's barrier.
          if (Traits::kRowPitch == 0 || c == 0) mbar_wait(&smem.full[stage][c], phase);
          load_e4m3_k_words<Traits::kRowPitch>(stage_addr, c, warp, lane, raw);
        };
        auto issue_widened = [&](int c, auto& a, auto& acc, bool zero, int chunks) {
          uint32_t words[16];
          widen_e4m3_k_words(raw, words);
          Tensor aw = recast<uint32_t>(a);
          CUTE_UNROLL
          for (int i = 0; i < 16; ++i) aw(i) = words[i];
          warpgroup_fence_operand(acc);
          warpgroup_arrive();
          CUTE_UNROLL
          for (int u = 0; u < 4; ++u) {
            mma_qk.accumulate_ = zero && u == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
            cute::gemm(mma_qk, a(_, _, u), tSrQ(_, _, 4 * c + u), acc);
          }
          warpgroup_commit_batch();
          if (c + 1 < chunks) load(c + 1);
        };
        if constexpr (kFp8Mma) {
          // NOTE: the FP8 tensor cores keep ~13 bits of the sum they accumulate into; the block's
          // score sums are taken in three partials of three chunks (six k steps, 192 products)
          // each, every one started from zero, and added in fp32 (the error model:
          // docs/sm90-fp8.md, Precision): the first into S itself, the next two issued before the
          // previous one is added. (Partials of one chunk each cost the 64-row tiles this
          // kernel once ran on the seesaw kernel's calls ~900 more FADD per block, ~10% of their
          // instructions and 3.7% of their time: docs/perf-notes.md.)
          auto issue = [&](int c0, auto& t) {
            warpgroup_fence_operand(t);
            CUTE_UNROLL
            for (int c = c0; c < c0 + kPartialChunks; ++c) {
              mbar_wait(&smem.full[stage][c], phase);
              warpgroup_arrive();
              mma_qk.accumulate_ = c == c0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
              cute::gemm(mma_qk, tSrK(_, _, 2 * c), tSrQ(_, _, 2 * c), t);
              mma_qk.accumulate_ = GMMA::ScaleOut::One;
              cute::gemm(mma_qk, tSrK(_, _, 2 * c + 1), tSrQ(_, _, 2 * c + 1), t);
            }
            warpgroup_commit_batch();
          };
          auto add = [&](auto& t) {
            warpgroup_fence_operand(t);
            CUTE_UNROLL
            for (int v = 0; v < size(tSrS); ++v) tSrS(v) += t(v);
          };
          static_assert(Traits::kChunks == 3 * kPartialChunks, "three partials");
          issue(0, tSrS);
          issue(kPartialChunks, tSrT0);
          issue(2 * kPartialChunks, tSrT1);
          warpgroup_wait<1>();
          warpgroup_fence_operand(tSrS);
          add(tSrT0);
          warpgroup_wait<0>();
          add(tSrT1);
        } else if constexpr (kDsRegs) {
          // Latent group g's two chunks (widened and issued by issue_widened, as in kFp8Regs below)
          // into partial T[g % 2] from zero, added to S^T in fp32 times each key's scale of the
          // group once done (the next group's chunks already issued), then the rope part (bf16 x
          // bf16, K_rope from registers) into T[0] from zero, added as it is: S^T = sum_g s_kg (K_g
          // Q_g^T) + K_rope Q_rope^T, every product exact. The keys' scales are read from their
          // rows (bytes 512..527) before the first sum is added.
          auto add_group = [&](int g, auto& t) {
            warpgroup_fence_operand(t);
            CUTE_UNROLL
            for (int v = 0; v < size(tSrS); ++v) {
              tSrS(v) = g == 0 ? ds_scale[(v >> 1) & 1][g] * t(v)
                               : fmaf(ds_scale[(v >> 1) & 1][g], t(v), tSrS(v));
            }
          };
          auto issue = [&](int c, auto& a, auto& t) {
            if (c >= 2) warpgroup_wait<1>();
            if (c == 4) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int key = get<0>(tScS(2 * h));
                const float4 f = *reinterpret_cast<const float4*>(
                    reinterpret_cast<const uint8_t*>(k_stage) + key * Traits::kRowPitch +
                    tma::kDsMlaScaleOffset);
                ds_scale[h][0] = f.x;
                ds_scale[h][1] = f.y;
                ds_scale[h][2] = f.z;
                ds_scale[h][3] = f.w;
              }
            }
            if (c >= 4 && c % 2 == 0) {
              // Group c / 2 - 2's chunks (c - 4, c - 3) are done.
              warpgroup_fence_operand(tSrS);
              add_group(c / 2 - 2, t);
            }
            issue_widened(c, a, t, c % 2 == 0, Traits::kL / 64);
          };
          static_assert(Traits::kL / 64 == 8, "four groups of two chunks");
          load(0);
          issue(0, tSrA0, tSrT0);
          issue(1, tSrA1, tSrT0);
          issue(2, tSrA0, tSrT1);
          issue(3, tSrA1, tSrT1);
          issue(4, tSrA0, tSrT0);
          issue(5, tSrA1, tSrT0);
          issue(6, tSrA0, tSrT1);
          issue(7, tSrA1, tSrT1);
          warpgroup_wait<1>();  // chunks 4 and 5 done
          warpgroup_fence_operand(tSrS);
          add_group(2, tSrT0);
          {
            // The rope part: bf16, the query tile's rope chunk stored in bf16, K_rope from
            // registers: one ldmatrix a k step, lane i giving the address of key 16 warp + i % 8 +
            // 8 ((i / 8) % 2), columns 8 (i / 16) .. of the step.
            typename Traits::TiledMmaRope mma_rope;
            auto thr_rope = mma_rope.get_thread_slice(wtid);
            Tensor tSrQr = thr_rope.partition_fragment_B(make_tensor(
                make_smem_ptr(reinterpret_cast<cute::bfloat16_t*>(
                    reinterpret_cast<uint8_t*>(smem.q) + Traits::kL / 64 * kRows * 128)),
                typename Traits::SmemLayoutRopeQ{}));      // (MMA, 1, 4)
            Tensor tSrKr = thr_rope.partition_fragment_A(  // (MMA, 1, 4) registers
                make_tensor(make_smem_ptr(reinterpret_cast<cute::bfloat16_t*>(smem.q)),
                            Layout<Shape<Int<kKeys>, Int<64>>>{}));
            const int key = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
            const uint32_t base =
                stage_addr + key * Traits::kRowPitch + tma::kDsMlaRopeOffset + ((lane >> 4) << 4);
            CUTE_UNROLL
            for (int k = 0; k < 4; ++k) {
              Tensor a = recast<uint32_t>(tSrKr(_, 0, k));
              tma::ldmatrix_x4(base + 32 * k, a(0), a(1), a(2), a(3));
            }
            warpgroup_fence_operand(tSrT0);
            warpgroup_arrive();
            CUTE_UNROLL
            for (int k = 0; k < 4; ++k) {
              mma_rope.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
              cute::gemm(mma_rope, tSrKr(_, _, k), tSrQr(_, _, k), tSrT0);
            }
            warpgroup_commit_batch();
          }
          warpgroup_wait<0>();
          add_group(3, tSrT1);
          warpgroup_fence_operand(tSrT0);
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); ++v) tSrS(v) += tSrT0(v);
          warpgroup_fence_operand(tSrS);
        } else if constexpr (kFp8Regs) {
          // Chunk c's k steps issued as it lands: its e4m3 words are loaded once chunk c - 1's
          // GEMMs are issued (their latency under the wait that follows), and widened into the
          // registers of A buffer c % 2 once chunk c - 2's GEMMs (the buffer's previous reader)
          // are done.
          auto issue = [&](int c, auto& a) {
            if (c >= 2) warpgroup_wait<1>();
            issue_widened(c, a, tSrS, c == 0, Traits::kChunks);
          };
          static_assert(Traits::kChunks == 9, "chunks issued in pairs after the first");
          load(0);
          issue(0, tSrA0);
          CUTE_UNROLL
          for (int c = 1; c < Traits::kChunks; c += 2) {
            issue(c, tSrA1);
            issue(c + 1, tSrA0);
          }
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
        } else {
          tma::chunked_gemm<Traits>(mma_qk, tSrK, tSrQ, tSrS, smem.full[stage], phase,
                                    tma::NoHook{}, kAhead && p.consumer_fence != 0);
        }
      }

      // ---- mask; column max over the block's keys (scaled, base 2) ----
      // NOTE: where every row of the thread attends every key of the block, S^T stays unscaled and
      // the scale goes into P's FFMA (docs/sm90-seesaw.md, Softmax).
      // Sparse: the keys whose entry is -1 (slot[stage], landed with the block) are masked too.
      uint64_t absent = 0;  // bit k: key key0 + k is -1
      if constexpr (kSparse) {
        absent = (static_cast<uint64_t>(__ballot_sync(0xffffffffu, smem.slot[stage][lane + 32] < 0))
                  << 32) |
                 __ballot_sync(0xffffffffu, smem.slot[stage][lane] < 0);
      }
      const bool unmasked = (kSparse || p.mask == nullptr) && score_scale > 0.0f &&
                            key0 + kKeys <= min_limit && absent == 0;
      float s_mul[kCols];  // what tSrS still needs
#pragma unroll
      for (int s = 0; s < kCols; ++s) s_mul[s] = unmasked ? col_scale(s) : 1.0f;
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
              x = tSrS(v) * col_scale(s);
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
      if constexpr (kDsRegs) {
        // The block's largest |scale| of each group: over the warp's 16 keys, then the 4 warps.
        float gmax[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          gmax[g] = fmaxf(fabsf(ds_scale[0][g]), fabsf(ds_scale[1][g]));
          gmax[g] = fmaxf(gmax[g], __shfl_xor_sync(0xffffffffu, gmax[g], 4));
          gmax[g] = fmaxf(gmax[g], __shfl_xor_sync(0xffffffffu, gmax[g], 8));
          gmax[g] = fmaxf(gmax[g], __shfl_xor_sync(0xffffffffu, gmax[g], 16));
        }
        if (lane == 0) {
          *reinterpret_cast<float4*>(smem.ds_max[cw][par][warp]) =
              make_float4(gmax[0], gmax[1], gmax[2], gmax[3]);
        }
      }
      named_barrier_sync(barrier_id<kC>(NamedBarrier::kMaxFirst, cw), 128);
      if constexpr (kDsRegs) {
        float gmax[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const float4 m = *reinterpret_cast<const float4*>(smem.ds_max[cw][par][x]);
          gmax[0] = fmaxf(gmax[0], m.x);
          gmax[1] = fmaxf(gmax[1], m.y);
          gmax[2] = fmaxf(gmax[2], m.z);
          gmax[3] = fmaxf(gmax[3], m.w);
        }
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          const float inv = fminf(ds_inv[g], ds_inv_of(gmax[g]));
          ds_factor[g] = inv * ds_pow2_inverse(ds_inv[g]);  // exact: powers of two (or 0)
          ds_inv[g] = inv;
        }
      }
#pragma unroll
      for (int s = 0; s < kCols; ++s) {
        float m = smem.max[cw][par][0][my_col(s)];
#pragma unroll
        for (int x = 1; x < 4; ++x) m = fmaxf(m, smem.max[cw][par][x][my_col(s)]);
        block_max[s] = m * s_mul[s];  // scale > 0: the max of the scaled scores
      }

      // ---- skip-softmax: a block every row of the tile finds negligible counts as empty ----
      if (p.skip_softmax_factor > 0.0f && seg.skip_threshold > 0.0f) {
        const float skip_threshold = seg.skip_threshold;
        const int tile_rows = seg.tile_rows;
        bool negligible = true;
#pragma unroll
        for (int s = 0; s < kCols; ++s) {
          negligible = negligible && (my_col(s) >= tile_rows ||
                                      exp2f(block_max[s] - col_max[s]) < skip_threshold);
        }
        if (named_barrier_and(barrier_id<kC>(NamedBarrier::kVoteFirst, cw), 128, negligible)) {
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
      // kFp8Mma: P is taken 2^8 times larger (at most 2^8 <= 448, e4m3's largest finite value),
      // so that it is rounded in e4m3's normal range down to 2^-14; the factor leaves with the sums
      // at the segment's end (kPUnscale).
      constexpr float kPShift = kFp8Mma ? 8.0f : 0.0f;
      CUTE_UNROLL
      for (int v = 0; v < size(tSrS); ++v) {
        const float e =
            tma::exp2_ftz(fmaf(tSrS(v), s_mul[col_slot(v)], kPShift - block_max[col_slot(v)]));
        tSrS(v) = e;
        col_sum[col_slot(v)] += e;
      }

      // ---- P into shared memory (16-bit, rows x keys); zero V rows of keys past the extent ----
      {
        // NOTE: rounding P to 16 bits moves out by up to half an ulp of P times
        // sum_j p_j |v_j| / Z, which dominates where the terms cancel (docs/sm90-tma.md,
        // Precision).
        uint8_t* p_bytes = reinterpret_cast<uint8_t*>(smem.p[cw][0]);
        if constexpr (kFp8Mma) {
          // NOTE: e4m3 P (3 mantissa bits) moves out by up to 2^-4 times sum_j p_j |v_j| / Z, and
          // P below 2^-14 of the max is subnormal, below 2^-18 0 (docs/sm90-fp8.md, Precision).
          // The thread's keys g and g + 8 of its warp's 16 take adjacent k slots (fp8_p_slot):
          // one 2-byte store per query row.
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); ++v) {
            if (v & 2) continue;  // v | 2: the same query row, key + 8
            const int key = get<0>(tScS(v)), row = get<1>(tScS(v));
            const uint32_t offset = tma::swizzled_offset_e4m3(row, fp8_p_slot(key), kRows);
            *reinterpret_cast<uint16_t*>(p_bytes + offset) = tma::e4m3x2(tSrS(v), tSrS(v | 2));
          }
        } else if constexpr (kDsRegs) {
          // NOTE: P s_kg 2^-E_g (ds_inv) below 1, rounded to fp16: within 2^-11 of itself from
          // 2^-14 up, within 2^-25 absolute below (subnormal); out moves by at most 2^-11
          // sum_j p_j |s_j v_j| / Z plus 2^-24 max |s| sum_j |v_j| / Z over the group
          // (tests/common/fp8_ds_mla.h, the direct route's allowance).
          float w[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int g = 0; g < 4; ++g) w[h][g] = ds_scale[h][g] * ds_inv[g];
          }
#pragma unroll
          for (int g = 0; g < 4; ++g) {
            store_p16(tma::smem_addr(smem.p[cw][g]),
                      [&](int v) { return tSrS(v) * w[(v >> 1) & 1][g]; });
          }
        } else {
          store_p16(tma::smem_addr(p_bytes), [&](int v) { return tSrS(v); });
        }
        // NOTE: TMA loads whole boxes and skips pages past the extent; those rows may hold NaN
        // (poisoned cache, stale stage), and P = 0 times NaN is NaN. The fp8 ring widens them
        // into zeros (kWiden: nothing to zero, and no store into the widening warps' rows). The
        // gathers (kSparse) land keys past the extent and -1 entries as zeros.
        const int valid = min(kKeys, seg.w.extent - key0);
        const int zero_end = kWiden ? valid : kKeys;  // rows [valid, zero_end) are zeroed
        // From the first key some row of the tile does not attend (tile_limit).
        const int clean0 = min(valid, max(0, seg.tile_limit - key0));
        if (kFp8Direct && !kSparse && clean0 < kKeys) {
          tma::clean_v_rows_e4m3(reinterpret_cast<uint8_t*>(k_stage), kKeys,
                                 kL / Traits::kChunkCols, clean0, valid, wtid, 128);
        } else if (!kSparse && clean0 < zero_end) {
          tma::clean_v_rows(reinterpret_cast<uint8_t*>(k_stage), kKeys, kL / Traits::kChunkCols,
                            clean0, zero_end, valid,
                            std::is_same_v<T, cute::half_t> ? 0x7c00u : 0x7f80u, wtid, 128);
        }
        fence_proxy_async_smem();
        named_barrier_sync(barrier_id<kC>(NamedBarrier::kPFirst, cw), 128);
      }

      // The consumer's last block of the segment keeps its stage (the merge below goes through it).
      const bool keep = it + kC >= num_blocks;
      if constexpr (kFp8Mma) {
        // ---- pv_gemm on the FP8 tensor cores: per m tile (V chunk), V^T from registers into a
        // partial accumulator from zero, then O^T = a O^T + partial in fp32; the next tile's
        // loads and GEMM go ahead of the previous tile's add. A chunk's bytes are in registers
        // once its fragment is built: chunks 0..3 go back to the producer after tile 3's loads,
        // 4..8 after tile 7's (the rope chunk served S alone). ----
        const uint32_t stage_addr = tma::smem_addr(k_stage);
        uint32_t frag[2][2][4];  // [tile parity][k step][register]
        auto issue = [&](int m, auto& t) {
          load_fp8_v_fragment(stage_addr, m, warp, lane, frag[m & 1]);
          if (!keep && m == Traits::kLeftChunks - 1) release(&smem.empty_l[stage]);
          if (!keep && m == kL / 64 - 1) release(&smem.empty_r[stage]);
          issue_fp8_pv(mma_pv, tOrA, tOrP, t, frag[m & 1]);
        };
        auto add = [&](int m, auto& t) {
          warpgroup_fence_operand(t);
          CUTE_UNROLL
          for (int i = 0; i < size(t); ++i) {
            tOrO(i, m, 0) = fmaf(alpha[col_slot(i)], tOrO(i, m, 0), t(i));
          }
        };
        static_assert(kL / 64 == 8, "tiles issued in pairs");
        issue(0, tOrT0);
        CUTE_UNROLL
        for (int m = 1; m < kL / 64; m += 2) {
          issue(m, tOrT1);
          warpgroup_wait<1>();
          add(m - 1, tOrT0);
          if (m + 1 < kL / 64) {
            issue(m + 1, tOrT0);
            warpgroup_wait<1>();
          } else {
            warpgroup_wait<0>();
          }
          add(m, tOrT1);
        }
      } else if constexpr (kFp8Regs) {
        // ---- rescale_o; pv_gemm: O^T = a O^T + V^T P^T per m tile, V^T widened into the
        // registers of A buffer m % 2 (m tile m - 2's GEMMs waited for first), its e4m3 words
        // loaded once m tile m - 1's GEMMs are issued (the first under the rescale); the stage's
        // halves go back once their fragments are built (as on the FP8 tensor cores above). ----
        const uint32_t stage_addr = tma::smem_addr(k_stage);
        uint32_t raw[8];
        load_e4m3_vt_words<Traits::kRowPitch>(stage_addr, 0, warp, lane, raw);
        if constexpr (kDsRegs) {
          // m tile m (values v / (kRows / 2)) belongs to latent group m / 2.
          CUTE_UNROLL
          for (int v = 0; v < size(tOrO); ++v) {
            tOrO(v) *= alpha[col_slot(v % (kRows / 2))] * ds_factor[v / kRows];
          }
        } else {
          CUTE_UNROLL
          for (int v = 0; v < size(tOrO); ++v) tOrO(v) *= alpha[col_slot(v % (kRows / 2))];
        }
        warpgroup_fence_operand(tOrO);
        auto issue = [&](int m, auto& a) {
          if (m >= 2) warpgroup_wait<1>();
          uint32_t words[16];
          widen_e4m3_vt_words(raw, words);
          if (m + 1 < kL / 64) {
            load_e4m3_vt_words<Traits::kRowPitch>(stage_addr, m + 1, warp, lane, raw);
          }
          if (!keep && m == Traits::kLeftChunks - 1) release(&smem.empty_l[stage]);
          if (!keep && m == kL / 64 - 1) release(&smem.empty_r[stage]);
          Tensor aw = recast<uint32_t>(a);
          CUTE_UNROLL
          for (int i = 0; i < 16; ++i) aw(i) = words[i];
          warpgroup_arrive();
          // kDsRegs: P^T of the m tile's latent group (m / 2).
          auto tOrPm = [&] {
            if constexpr (kDsRegs) {
              return group_p(m / 2);
            } else {
              return tOrP;
            }
          }();
          CUTE_UNROLL
          for (int k = 0; k < 4; ++k) cute::gemm(mma_pv, a(_, 0, k), tOrPm(_, 0, k), tOrO(_, m, 0));
          warpgroup_commit_batch();
        };
        static_assert(kL / 64 == 8, "tiles issued in pairs");
        CUTE_UNROLL
        for (int m = 0; m < kL / 64; m += 2) {
          issue(m, tOrA0);
          issue(m + 1, tOrA1);
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
      } else {
        // ---- rescale_o; pv_gemm: O^T = a O^T + V^T P^T, chunks 0..3 and 4..7 as two batches
        // ----
        CUTE_UNROLL
        for (int v = 0; v < size(tOrO); ++v) tOrO(v) *= alpha[col_slot(v % (kRows / 2))];
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
        // NOTE: the first half's chunks go back to the producer while the second half runs. The
        // consumer's last block of the segment keeps its stage: the segment's end merges through
        // it and releases it afterwards.
        warpgroup_wait<1>();
        if (!keep) release(&smem.empty_l[stage]);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        if (!keep) release(&smem.empty_r[stage]);
      }
    }

    // ---- store_partials: merge the consumers' (max, sum, O^T) through their stages ----
    // A non-finite O value comes from a non-finite attended key or value (an inf value whose score
    // came out -inf leaves NaN in its column only; an inf value with P > 0 an inf): its row turns
    // NaN, out and lse (contract section 1), through its sum. Once per segment.
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
    // kFp8Mma: P was 2^8 times larger (kPShift), and so are the sums and O.
    constexpr float kPUnscale = kFp8Mma ? 1.0f / 256.0f : 1.0f;
    // Consumer c holds the stage of its last block (kept above) where it had one (c < num_blocks):
    // a segment of fewer blocks than consumers leaves the others none, and their stages may then
    // already hold the next segment's blocks.
    // NOTE: two consumers keep the form `c == 0 || has_second` (another form moved ptxas's register
    // allocation of the 32-row bf16-query kernel: +16 bytes of spill loads, +2%).
    const bool has_second = num_blocks >= 2;
    auto has_block = [&](int c) { return kC == 2 ? c == 0 || has_second : c < num_blocks; };
    // NOTE: the consumers' barrier orders the final_max and sum stores above before every read
    // below, and the barrier after the last reads orders those before the next segment's stores.
    sync_local();
    named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
    // Row r's max over the consumers (base 2; a consumer without a block holds -inf and 0).
    auto merged_max = [&](int r) {
      float m = smem.final_max[0][r];
#pragma unroll
      for (int c = 1; c < kC; ++c) m = fmaxf(m, smem.final_max[c][r]);
      return m;
    };
    // Row r's max over the consumers (natural log units) and its sum at that max.
    auto row_total = [&](int r, float& m_nat, float& l) {
      // NOTE: two consumers keep their own form (the loop below moved the register allocation of
      // the two-consumer instantiations, as the form of has_block above did).
      if constexpr (kC == 2) {
        const float m0 = smem.final_max[0][r], m1 = smem.final_max[1][r];
        const float m = fmaxf(m0, m1);
        const float m_use = m == kNegInf ? 0.0f : m;
        float l0 = 0.0f, l1 = 0.0f;
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          l0 += smem.sum[0][x][r];
          l1 += smem.sum[1][x][r];
        }
        m_nat = m == kNegInf ? kNegInf : m * 0.6931471805599453f;
        l = (exp2f(m0 - m_use) * l0 + exp2f(m1 - m_use) * l1) * kPUnscale;
        return;
      }
      const float m = merged_max(r);
      const float m_use = m == kNegInf ? 0.0f : m;
      l = 0.0f;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        float lc = 0.0f;
#pragma unroll
        for (int x = 0; x < 4; ++x) lc += smem.sum[c][x][r];
        l += exp2f(smem.final_max[c][r] - m_use) * lc;
      }
      m_nat = m == kNegInf ? kNegInf : m * 0.6931471805599453f;
      l *= kPUnscale;
    };
    // The stage of consumer c's last block of the segment (it kept it).
    auto kept_stage = [&](int c) {
      const int rounds = (num_blocks + kC - 1 - c) / kC;
      return kOwnStage ? c : c + 2 * ((rounds - 1) & 1);
    };
    const int own_stage = kept_stage(cw);
    // Consumer c's kept stage holds factor x O^T as [row][kMergeStride] floats (conflict-free
    // stores), kMergeCols columns per pass.
    constexpr int kStride = Traits::kMergeStride;
    constexpr int kPassCols = Traits::kMergeCols;
    constexpr int kTilesPerPass = kPassCols / 64;  // O^T m tiles (64 columns each) per pass
    float factor[kCols];                           // exp2(own max - merged max)
#pragma unroll
    for (int s = 0; s < kCols; ++s) {
      const float m = merged_max(my_col(s));
      factor[s] = exp2f(col_max[s] - (m == kNegInf ? 0.0f : m)) * kPUnscale;
    }
    const int tile_rows_end = seg.tile_rows;
    const bool whole = seg.w.whole;
    const float* first = reinterpret_cast<const float*>(smem.k[kept_stage(0)]);
    const float* second = reinterpret_cast<const float*>(smem.k[has_block(1) ? kept_stage(1) : 0]);
    const float* third =
        reinterpret_cast<const float*>(smem.k[kC == 3 && has_block(2) ? kept_stage(2) : 0]);
    // kPairMerge: rank 0 writes out (merged with rank 1's partial), rank 1 its partial. Rank 0's
    // threads read their pieces of rank 1's o right after the wait, in flight with the maxima and
    // sums, not after the barrier that hands those over (one L2 round trip less at the tail).
    const bool merge_out = kPairMerge && blockIdx.z == 0;
    static_assert(!kPairMerge || Traits::kMergePasses == 1, "the pair merge's pieces: one pass");
    constexpr int kOtherIters =
        kPairMerge ? (kRows * (kL / 8) + Traits::kConsumerThreads - 1) / Traits::kConsumerThreads
                   : 1;
    uint4 other_o[kOtherIters];
    // Partial rows are 512 wide whatever L is (route.h); out rows L.
    const int cols = whole || merge_out ? p.kv_lora_rank : kL;
    CUTE_UNROLL
    for (int pass = 0; pass < Traits::kMergePasses; ++pass) {
      // NOTE: the previous pass's reads of the stages end at the barrier at the end of this loop.
      if (has_block(cw)) {
        float* own = reinterpret_cast<float*>(smem.k[own_stage]);
        CUTE_UNROLL
        for (int v = 0; v < size(tOrO); ++v) {
          if (v / (kRows / 2) / kTilesPerPass != pass) continue;  // its m tile
          const int l = kFp8Direct ? fp8_o_row(get<0>(tOcO(v))) : get<0>(tOcO(v));
          // kDsRegs: O^T's m tiles of group g are in units of 1 / ds_inv[g].
          const float units = kDsRegs ? ds_pow2_inverse(ds_inv[v / kRows]) : 1.0f;
          own[get<1>(tOcO(v)) * kStride + l - pass * kPassCols] =
              factor[col_slot(v % (kRows / 2))] * units * tOrO(v);
        }
      }
      if (pass == 0) {
        // Rank 1's partial is stored (and fenced) before its arrive: every reader waits.
        if constexpr (kPairMerge) {
          if (merge_out) {
            tma::mbar_wait_cluster(&smem.merge_bar, 0);
            const int64_t other_row0 =
                seg.partial_row0 + static_cast<int64_t>(p.num_tokens) * p.num_heads;
#pragma unroll
            for (int i = 0; i < kOtherIters; ++i) {
              const int e = ctid + i * Traits::kConsumerThreads;
              if (e < tile_rows_end * (kL / 8)) {
                const int c = e / (kL / 8);
                other_o[i] = load_other(other_row0 + c, (e - c * (kL / 8)) * 8);
              }
            }
          }
        }
        // Thread c < tile_rows finishes row c while the others stage their O: where it goes (out
        // or partial_o) and what its O is multiplied by.
        if (ctid < tile_rows_end) {
          const int64_t row0 = seg.partial_row0;  // the segment's first partial row
          float m_nat, l;
          row_total(ctid, m_nat, l);
          if (kPairMerge && merge_out) {
            pair_row(seg.w, row0, ctid, m_nat, l);
          } else if (whole) {
            // The request's only segment: the combine's normalization (output.cuh) here.
            const RowTarget target = finish_row(p, seg.w.row0 + ctid, seg.w.token0, m_nat, l);
            smem.out_row[ctid] = target.offset;
            smem.out_scale[ctid] = target.scale;
          } else {
            // A partial: max, sum and o = bmm2 O / sum (params.h).
            p.partial_max[row0 + ctid] = m_nat;
            p.partial_sum[row0 + ctid] = l;
            smem.out_row[ctid] = (row0 + ctid) * kL;
            smem.out_scale[ctid] = l != 0.0f ? __fdiv_rn(bmm2_scale_of(p), l) : 0.0f;
          }
        }
      }
      sync_local();
      named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
      for (int e = ctid; e < tile_rows_end * (kPassCols / 8); e += Traits::kConsumerThreads) {
        const int c = e / (kPassCols / 8), dp = (e - c * (kPassCols / 8)) * 8;
        const int d = pass * kPassCols + dp;
        const int64_t o = smem.out_row[c];
        if (o < 0 || d >= cols) continue;
        const float f = smem.out_scale[c];  // NOTE: a row without a key gets 0, whatever O holds
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k += 4) {
          float4 a = *reinterpret_cast<const float4*>(first + c * kStride + dp + k);
          if (has_block(1)) {
            const float4 b = *reinterpret_cast<const float4*>(second + c * kStride + dp + k);
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
          }
          if (kC == 3 && has_block(2)) {
            const float4 b = *reinterpret_cast<const float4*>(third + c * kStride + dp + k);
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
          }
          v[k + 0] = f != 0.0f ? a.x * f : 0.0f;
          v[k + 1] = f != 0.0f ? a.y * f : 0.0f;
          v[k + 2] = f != 0.0f ? a.z * f : 0.0f;
          v[k + 3] = f != 0.0f ? a.w * f : 0.0f;
        }
        if constexpr (kPairMerge) {
          if (merge_out) {
            const float g = smem.other_scale[c];
            // This thread's iteration of the loop (static indices: no local memory).
            const int it = (e - ctid) / Traits::kConsumerThreads;
            uint4 u = other_o[0];
#pragma unroll
            for (int k = 1; k < kOtherIters; ++k) {
              if (it == k) u = other_o[k];
            }
            if (g != 0.0f) add_other(v, u, g);
          }
        }
        const uint4 words = make_uint4(pack_out(p, v[0], v[1]), pack_out(p, v[2], v[3]),
                                       pack_out(p, v[4], v[5]), pack_out(p, v[6], v[7]));
        if (whole || merge_out) {
          store_out8(p, o + d, words);
        } else {
          *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.partial_o) + o + d) = words;
        }
      }
      // kPairMerge, rank 1: its partial's stores ordered before the arrive below (after the
      // barrier), cumulatively, for rank 0's reads.
      if constexpr (kPairMerge) {
        if (!merge_out && pass == Traits::kMergePasses - 1) __threadfence();
      }
      // Every thread's reads of both stages (and, after the last pass, of out_row, out_scale, sum
      // and final_max) are done: the next pass may overwrite them, and after the last pass the
      // kept stages go back to the producer, which may already wait for them with the next
      // segment's first blocks.
      sync_local();
      named_barrier_sync(barrier_id(NamedBarrier::kConsumers), Traits::kConsumerThreads);
    }
    if constexpr (kPairMerge) {
      if (!merge_out && ctid == 0) tma::mbar_arrive_cluster_release(&smem.merge_bar, 0);
    }
    if (has_block(cw)) {
      release(&smem.empty_l[own_stage]);
      release(&smem.empty_r[own_stage]);
    }
    if constexpr (kOwnStage) {
      used += (num_blocks + kC - 1 - cw) / kC;
    } else {
      const uint32_t rounds = (num_blocks + 1 - cw) / 2;  // on stages cw and cw + 2 by parity
      used ^= (((rounds + 1) / 2) & 1) | (((rounds / 2) & 1) << 1);
    }
  }  // segments
}

template <Elem Q, Elem KV, int kRows, bool kFp8Direct, bool kDeepRing = false, int kConsumers = 2>
cudaError_t launch_few_rows_as(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                               cudaStream_t stream, bool pdl) {
  using Traits = FewRowsTraitsOf<Q, KV, kRows, kFp8Direct, false, kDeepRing, kConsumers>;
  constexpr size_t smem = Traits::kSmemBytes;
  auto* kernel = &few_rows_kernel<Q, KV, kRows, false, kFp8Direct, kDeepRing, kConsumers>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // The balanced schedule: one CTA per part (FewRowsCursor).
  const dim3 grid = params.sched_requests != nullptr ? dim3(1, params.num_parts)
                                                     : dim3(1, params.batch, params.num_splits);
  return launch(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, params, kv_map);
}

template <Elem Q, Elem KV, int kRows>
cudaError_t launch_few_rows(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                            cudaStream_t stream, bool pdl, bool fp8_direct, bool deep_ring,
                            bool three) {
  if constexpr (Q == Elem::kBf16 && KV == Elem::kFp8E4M3 && kRows == 16) {
    if (fp8_direct && three && !deep_ring) {
      return launch_few_rows_as<Q, KV, kRows, true, false, 3>(params, kv_map, stream, pdl);
    }
  }
  // The route asks for three consumers of a bf16 query over an e4m3 cache at 16 rows only.
  if (three) return cudaErrorInvalidValue;
  if constexpr (Q == Elem::kFp8E4M3 && KV == Elem::kFp8E4M3) {
    if (fp8_direct && deep_ring) {
      return launch_few_rows_as<Q, KV, kRows, true, true>(params, kv_map, stream, pdl);
    }
  }
  // The route asks for the deep ring of the e4m3 GEMMs only.
  if (deep_ring) return cudaErrorInvalidValue;
  if constexpr (KV == Elem::kFp8E4M3) {
    if (fp8_direct) return launch_few_rows_as<Q, KV, kRows, true>(params, kv_map, stream, pdl);
  }
  if (fp8_direct) return cudaErrorInvalidValue;  // the route asks it of e4m3 caches only
  return launch_few_rows_as<Q, KV, kRows, false>(params, kv_map, stream, pdl);
}

template <Elem Q, Elem KV, int kRows, bool kPairMerge, bool kFp8Direct, bool kDeepRing = false,
          int kConsumers = 2>
cudaError_t launch_few_rows_sparse_as(const DecodeKernelParams& params, cudaStream_t stream,
                                      bool pdl) {
  using Traits = FewRowsTraitsOf<Q, KV, kRows, kFp8Direct, true, kDeepRing, kConsumers>;
  constexpr size_t smem = Traits::kSmemBytes;
  auto* kernel =
      &few_rows_kernel<Q, KV, kRows, true, kFp8Direct, kDeepRing, kConsumers, kPairMerge>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // A tile of kRows heads per CTA (grid x: a token's heads past kRows take several; route.cc).
  const dim3 grid((params.num_heads + kRows - 1) / kRows, params.num_tokens, params.num_splits);
  const CUtensorMap unused{};  // the gather reads the cache through params.kv
  if constexpr (kPairMerge) {
    // A token's two splits as a cluster of two (grid z).
    if (params.num_splits != 2) return cudaErrorInvalidValue;
    return launch_in_cluster_shape(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl,
                                   dim3(1, 1, 2), params, unused);
  }
  return launch(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, params, unused);
}

// The route's choice of instantiation (launch_few_rows_sparse's arguments).
template <Elem Q, Elem KV, int kRows, bool kPairMerge>
cudaError_t launch_few_rows_sparse_pick(const DecodeKernelParams& params, cudaStream_t stream,
                                        bool pdl, bool fp8_direct, bool deep_ring, bool three) {
  // NOTE: no pair merge on three consumers: at 160 registers its epilogue tipped the block loop
  // into 17 spill reloads (2 without it); the route takes two consumers where it merges.
  if constexpr (Q == Elem::kBf16 && (KV == Elem::kFp8E4M3 || KV == Elem::kFp8DsMla) &&
                kRows == 16 && !kPairMerge) {
    if (fp8_direct && three && !deep_ring) {
      return launch_few_rows_sparse_as<Q, KV, kRows, false, true, false, 3>(params, stream, pdl);
    }
  }
  // The route asks for three consumers of a bf16 query over per-tensor e4m3 or fp8_ds_mla rows at
  // 16 rows only, and not with the pair merge.
  if (three) return cudaErrorInvalidValue;
  if constexpr (Q == Elem::kFp8E4M3 && KV == Elem::kFp8E4M3) {
    if (fp8_direct && deep_ring) {
      return launch_few_rows_sparse_as<Q, KV, kRows, kPairMerge, true, true>(params, stream, pdl);
    }
  }
  if (deep_ring) return cudaErrorInvalidValue;  // the e4m3 GEMMs' only
  if constexpr (KV == Elem::kFp8E4M3 || (KV == Elem::kFp8DsMla && kRows == 16)) {
    if (fp8_direct) {
      return launch_few_rows_sparse_as<Q, KV, kRows, kPairMerge, true>(params, stream, pdl);
    }
  }
  // The route asks it of per-tensor e4m3 caches, and of fp8_ds_mla ones at 16 rows.
  if (fp8_direct) return cudaErrorInvalidValue;
  return launch_few_rows_sparse_as<Q, KV, kRows, kPairMerge, false>(params, stream, pdl);
}

template <Elem Q, Elem KV, int kRows>
cudaError_t launch_few_rows_sparse(const DecodeKernelParams& params, cudaStream_t stream, bool pdl,
                                   bool fp8_direct, bool deep_ring, bool three, bool pair_merge) {
  if constexpr (kRows == 16) {
    if (pair_merge) {
      return launch_few_rows_sparse_pick<Q, KV, kRows, true>(params, stream, pdl, fp8_direct,
                                                             deep_ring, three);
    }
  }
  if (pair_merge) return cudaErrorInvalidValue;  // the route asks it at 16 rows only
  return launch_few_rows_sparse_pick<Q, KV, kRows, false>(params, stream, pdl, fp8_direct,
                                                          deep_ring, three);
}

}  // namespace mla::sm90::few_rows
