// The K-block ring of the TMA kernels, loaded (producer) and multiplied (chunked_gemm) by chunks.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "sm90/common.cuh"
#include "sm90/decode/output.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"

namespace mla::sm90::tma {

// Producer threads that issue the ring's TMA boxes: one per page piece of a 64-key block (lane 0
// of producer warps 0 .. n - 1; 4 at page 16, 2 at page 32, 1 from page 64 up), so that small pages
// do not put 4x the boxes on one thread's dependent issue sequence (docs/sm90-seesaw.md, Pipeline).
template <typename Traits>
__device__ __forceinline__ int producer_issuers(const DecodeKernelParams& p) {
  static_assert(Traits::kKeys / 16 <= 4, "pages of >= 16 keys: at most one issuer per warp of WG0");
  return Traits::kKeys / min(Traits::kKeys, p.page_size);
}

// The ring's barriers: one full barrier per chunk of each stage (one arrival per issuer, with its
// transaction bytes), and per stage one empty barrier per consumer half (one arrive per consumer
// warp; kPair: per consumer warp of both CTAs of the pair, whose producers both fill this ring).
// kFp8: an e4m3 cache (fp8_ring.cuh): the issuers' boxes complete the chunk's `landed` barrier
// instead, and `full` completes once every lane of the warp that widens the chunk has arrived.
// kThreadReleases: every consumer thread arrives on the empty barriers, not one per warp.
template <typename Traits, bool kPair = false, bool kFp8 = false, bool kThreadReleases = false>
__device__ __forceinline__ void init_ring_barriers(typename Traits::SharedMemoryPlan& smem,
                                                   int issuers) {
  static_assert(!(kPair && kFp8), "fp8 caches run unpaired");
  constexpr uint32_t kReleases = (kPair ? 2 : 1) * (kThreadReleases ? 128 : 128 / 32);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Traits::kStages; ++s) {
      for (int c = 0; c < Traits::kChunks; ++c) {
        mbar_init(&smem.full[s][c], kFp8 ? 32 : issuers);
        if constexpr (kFp8) mbar_init(&smem.landed[s][c], issuers);
      }
      mbar_init(&smem.empty_l[s], kReleases);
      mbar_init(&smem.empty_r[s], kReleases);
    }
    fence_mbar_init();
  }
  // NOTE: the pair's barriers take the other CTA's arrivals and boxes from here on.
  if constexpr (kPair) {
    cluster_sync_relaxed();
  } else {
    __syncthreads();
  }
}

struct NoHook {
  __device__ void operator()() const {}
};

// C = A B over a K block whose 64-column chunks land one by one: each chunk's k steps are issued
// once its full barrier (`full[c]`, phase `phase`) has completed; waits for the result. A and B are
// the GEMM's fragments over the block's k steps (kChunks x 4 each). `after_first_chunk` runs once
// the first chunk's k steps are issued (they are not committed yet). `fence`: the chunks' writer
// published them without a proxy fence (generic stores, then its release on the barrier), so each
// wait is followed by one here, on the path from those stores to the wgmma's reads.
template <typename Traits, typename Mma, typename FragA, typename FragB, typename Accum,
          typename Hook = NoHook>
__device__ __forceinline__ void chunked_gemm(Mma& mma, const FragA& a, const FragB& b, Accum& c,
                                             uint64_t* full, uint32_t phase,
                                             Hook after_first_chunk = {}, bool fence = false) {
  constexpr int kStepsPerChunk = Traits::kChunkCols / 16;
  static_assert(decltype(cute::size<2>(a))::value == Traits::kChunks * kStepsPerChunk, "k steps");
  cute::warpgroup_fence_operand(c);
  mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < cute::size<2>(a); ++k) {
    if (k % kStepsPerChunk == 0) {
      mbar_wait(&full[k / kStepsPerChunk], phase);
      if (fence) fence_proxy_async_smem();
      cute::warpgroup_arrive();
    }
    cute::gemm(mma, a(cute::_, cute::_, k), b(cute::_, cute::_, k), c);
    mma.accumulate_ = cute::GMMA::ScaleOut::One;
    if (k == kStepsPerChunk - 1) after_first_chunk();
  }
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(c);
}

// An empty split's partial rows [row0, row0 + rows): max -inf, sum 0 (its acc is never read).
// Thread `tid` writes row row0 + tid (threads 0 .. rows - 1 of the caller's group take part).
__device__ __forceinline__ void store_empty_partial(const DecodeKernelParams& p, int64_t row0,
                                                    int rows, int tid) {
  if (tid < rows) {
    p.partial_max[row0 + tid] = kNegInf;
    p.partial_sum[row0 + tid] = 0.0f;
  }
}

// A segment without a key of the tile (rows [w.row0, w.row0 + tile_rows)): a whole request's out
// rows 0 and lse -inf, or its empty partial rows; threads tid of nthreads.
__device__ __forceinline__ void store_empty_segment(const DecodeKernelParams& p, const TileWork& w,
                                                    int64_t partial_row0, int tile_rows, int tid,
                                                    int nthreads) {
  if (w.whole) {
    store_empty_rows(p, w.row0, tile_rows, w.token0, tid, nthreads);
  } else {
    store_empty_partial(p, partial_row0, tile_rows, tid);
  }
}

// Loads the split's 64-key blocks into the ring, block it into stage it % kStages: this issuer's
// page piece `piece` (keys piece * page_rows .. + page_rows of every block; see producer_issuers)
// of every chunk. Each chunk (64 keys x 64 columns, one TMA box per page) completes its own full
// barrier once every issuer has arrived and its boxes have landed, so the S GEMM can start on the
// first chunk. The V_L chunks are refilled as soon as consumer 0 releases them (empty_l), the V_R
// chunks and the rope chunk once consumer 1 has too (empty_r).
// `used0` and `used1`: the count, or its parity, of the blocks stages 0 and 1 held before this run
// (the phase of their barriers): a CTA that walks several segments adds each run's blocks, (n + 1)
// / 2 and n / 2 (walk_segments passes parities). A ring of three or four stages (block it into
// stage it % kStages) takes the stages' parities as bits 0..kStages - 1 of `used0`.
// kEvictFirst: the boxes carry an evict-first L2 policy (the seesaw kernel's direct
// split only: docs/sm90-seesaw.md, the direct split).
// kPair: the CTA is rank `rank` of a cluster of two whose tiles read the same blocks: it issues
// the chunks of its parity into both CTAs (TMA multicast) and arms its own barriers for every
// chunk; a stage is refilled once the consumers of both CTAs have released it (docs/sm90-seesaw.md,
// Pairs).
template <typename Traits, bool kEvictFirst = false, bool kPair = false>
__device__ __forceinline__ void produce_chunks(const DecodeKernelParams& p, const TileWork& w,
                                               const CUtensorMap* kv_map,
                                               typename Traits::SharedMemoryPlan& smem, int piece,
                                               uint32_t used0 = 0, uint32_t used1 = 0,
                                               uint32_t rank = 0) {
  constexpr int kStages = Traits::kStages;
  static_assert(kStages == 2 || ((kStages == 3 || kStages == 4) && !kPair),
                "rings of two, three or four stages");
  static_assert(!(kPair && kEvictFirst), "pairs run on the balanced schedule only");
  constexpr int kKeys = Traits::kKeys;
  const int page_rows = min(kKeys, p.page_size);  // rows per box
  const int page_shift = p.page_shift;
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.block_table_stride;
  const uint32_t box_bytes = page_rows * Traits::kChunkCols * Traits::kStageElemBytes;
  const int piece_key = piece * page_rows;  // the piece's first key within a block

  // Whether the block has this piece (it starts before the extent), and then its page id; a
  // piece past the extent is neither looked up nor loaded.
  auto load_page = [&](int block, int& page) {
    const int key = block * kKeys + piece_key;
    const bool has = key < w.extent;
    page = has ? table[key >> page_shift] : 0;
    return has;
  };

  const uint64_t policy = kEvictFirst ? l2_evict_first_policy() : 0;
  int page = 0;
  bool has = load_page(w.block_begin, page);
  for (int block = w.block_begin, it = 0; block < w.block_end; ++block, ++it) {
    const int stage = it % kStages;
    const uint32_t phase = kStages == 2
                               ? ((stage == 0 ? used0 : used1) + (it >> 1)) & 1
                               : ((used0 >> stage) + (kStages == 4 ? it >> 2 : it / kStages)) & 1;
    const int cur = page;
    const bool cur_has = has;
    if (block + 1 < w.block_end) has = load_page(block + 1, page);  // ahead of the waits

    const int row_in_page = (block * kKeys + piece_key) & (p.page_size - 1);
    auto load_chunk = [&](int c) {
      uint64_t* bar = &smem.full[stage][c];
      mbar_arrive_expect_tx(bar, cur_has ? box_bytes : 0u);
      if (cur_has) {
        uint8_t* dst = reinterpret_cast<uint8_t*>(smem.k[stage]) +
                       (c * kKeys + piece_key) * Traits::kChunkCols * Traits::kStageElemBytes;
        const int32_t col = p.chunk_box[c];  // a chunk the rows lack lands as zeros
        if constexpr (kPair) {
          if (static_cast<uint32_t>(c & 1) == rank) {
            tma_load_3d_multicast(dst, kv_map, bar, col, row_in_page, cur, 0x3);
          }
        } else if constexpr (kEvictFirst) {
          tma_load_3d_hint(dst, kv_map, bar, col, row_in_page, cur, policy);
        } else {
          tma_load_3d(dst, kv_map, bar, col, row_in_page, cur);
        }
      }
    };
    // NOTE: kPair: the other CTA's arrivals too. Its consumers' last reads were wgmma operand
    // reads, which their wait_group completed before the arrive; acquire at CTA scope (CUTLASS's
    // cluster pipelines do the same) keeps ptxas from invalidating L1 after every wait.
    mbar_wait_suspend(&smem.empty_l[stage], phase ^ 1);
#pragma unroll
    for (int c = 0; c < Traits::kLeftChunks; ++c) load_chunk(c);
    mbar_wait_suspend(&smem.empty_r[stage], phase ^ 1);
#pragma unroll
    for (int c = Traits::kLeftChunks; c < Traits::kChunks; ++c) load_chunk(c);
  }
}

// A ring of kStages stages (block i of a segment in stage i % kStages): the parities of the blocks
// each stage has held (bits 0..kStages - 1 of `used`) after a segment of n blocks.
template <uint32_t kStages>
__device__ __forceinline__ void advance_stage_parities(uint32_t& used, uint32_t n) {
#pragma unroll
  for (uint32_t s = 0; s < kStages; ++s) used ^= (((n + kStages - 1 - s) / kStages) & 1) << s;
}

// The producer side's walk over the CTA's segments, in the consumers' order: `run(w, used0,
// used1)` for each segment with blocks, where used0 and used1 are the parities of the blocks
// stages 0 and 1 held before it (the phase of their barriers: only the parity is ever read, and
// one bit each keeps the walk's state small for producers of 56 registers); returns those
// parities after the last segment. kStages 3 or 4: used0 holds the stages' parities as bits
// 0..kStages - 1.
template <typename Cursor, int kStages = 2, typename Run>
__device__ __forceinline__ void walk_segments(const DecodeKernelParams& p, uint32_t& used0,
                                              uint32_t& used1, Run run) {
  used0 = used1 = 0;
  Cursor cursor;
  cursor.begin(p);
  TileWork w;
  int64_t partial_row0;
  while (cursor.next(p, w, partial_row0)) {
    if (w.block_begin >= w.block_end) continue;
    run(w, used0, used1);
    const uint32_t n = w.block_end - w.block_begin;
    if constexpr (kStages != 2) {
      advance_stage_parities<kStages>(used0, n);
    } else {
      used0 ^= ((n + 1) / 2) & 1;
      used1 ^= (n / 2) & 1;
    }
  }
}

// kPair: the producer's last wait. A CTA of a pair exits only once both CTAs' consumers have
// released every block its ring held (`used0`, `used1`: all of them): the other CTA's consumers
// arrive on its empty barriers until then.
template <typename Traits>
__device__ __forceinline__ void drain_pair_ring(typename Traits::SharedMemoryPlan& smem,
                                                uint32_t used0, uint32_t used1) {
  const uint32_t used[2] = {used0, used1};
#pragma unroll
  for (int s = 0; s < Traits::kStages; ++s) {
    mbar_wait(&smem.empty_l[s], (used[s] & 1) ^ 1);
    mbar_wait(&smem.empty_r[s], (used[s] & 1) ^ 1);
  }
}

}  // namespace mla::sm90::tma
