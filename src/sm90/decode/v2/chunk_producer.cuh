// The v2 ring: v1's K-block ring, loaded (producer) and multiplied (chunked_gemm) by chunks.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "sm90/common.cuh"
#include "sm90/decode/v1/kv_pipeline.cuh"
#include "sm90/decode/v1/ptx.cuh"

namespace mla::sm90::v2 {

// The ring's barriers: one full barrier per chunk of each stage (the producer's transaction
// count), and per stage one empty barrier per consumer half (one arrive per consumer warp).
template <typename Traits>
__device__ __forceinline__ void init_ring_barriers(typename Traits::SharedMemoryPlan& smem) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Traits::kStages; ++s) {
      for (int c = 0; c < Traits::kChunks; ++c) v1::mbar_init(&smem.full[s][c], 1);
      v1::mbar_init(&smem.empty_l[s], 128 / 32);
      v1::mbar_init(&smem.empty_r[s], 128 / 32);
    }
    v1::fence_mbar_init();
  }
  __syncthreads();
}

struct NoHook {
  __device__ void operator()() const {}
};

// C = A B over a K block whose 64-column chunks land one by one: each chunk's k steps are issued
// once its full barrier (`full[c]`, phase `phase`) has completed; waits for the result. A and B are
// the GEMM's fragments over the block's k steps (kChunks x 4 each). `after_first_chunk` runs once
// the first chunk's k steps are issued (they are not committed yet).
template <typename Traits, typename Mma, typename FragA, typename FragB, typename Accum,
          typename Hook = NoHook>
__device__ __forceinline__ void chunked_gemm(Mma& mma, const FragA& a, const FragB& b, Accum& c,
                                             uint64_t* full, uint32_t phase,
                                             Hook after_first_chunk = {}) {
  constexpr int kStepsPerChunk = Traits::kChunkCols / 16;
  static_assert(decltype(cute::size<2>(a))::value == Traits::kChunks * kStepsPerChunk, "k steps");
  cute::warpgroup_fence_operand(c);
  mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < cute::size<2>(a); ++k) {
    if (k % kStepsPerChunk == 0) {
      v1::mbar_wait(&full[k / kStepsPerChunk], phase);
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

// Loads the split's 64-key blocks into the ring, block it into stage it % kStages. Each chunk
// (64 keys x 64 columns, one TMA box per page) completes its own full barrier, so the S GEMM can
// start on the first chunk. The V_L chunks are refilled as soon as consumer 0 releases them
// (empty_l), the V_R chunks and the rope chunk once consumer 1 has too (empty_r).
// `used0` and `used1` count the blocks stages 0 and 1 held before this run (the phase of their
// barriers): a CTA that walks several segments adds each run's blocks, (n + 1) / 2 and n / 2.
template <typename Traits>
__device__ __forceinline__ void produce_chunks(const DecodeKernelParams& p, const v1::TileWork& w,
                                               const CUtensorMap* kv_map,
                                               typename Traits::SharedMemoryPlan& smem,
                                               uint32_t used0 = 0, uint32_t used1 = 0) {
  static_assert(Traits::kStages == 2, "blocks alternate between two stages");
  constexpr int kKeys = Traits::kKeys;
  const int page_rows = min(kKeys, p.page_size);  // rows per box
  const int page_shift = p.page_shift;
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.block_table_stride;
  const uint32_t box_bytes = page_rows * Traits::kChunkCols * sizeof(typename Traits::T);

  // Page ids of a block's pieces; entries past the last needed page are never read.
  auto load_pages = [&](int block, int(&pages)[4], int& pieces) {
    const int key0 = block * kKeys;
    const int valid = min(kKeys, w.extent - key0);
    pieces = (valid + page_rows - 1) / page_rows;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      pages[q] = q < pieces ? table[(key0 + q * page_rows) >> page_shift] : 0;
    }
  };

  int pages[4], pieces = 0;
  load_pages(w.block_begin, pages, pieces);
  for (int block = w.block_begin, it = 0; block < w.block_end; ++block, ++it) {
    const int stage = it & 1;
    const uint32_t phase = ((stage == 0 ? used0 : used1) + (it >> 1)) & 1;
    int cur[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) cur[q] = pages[q];
    const int cur_pieces = pieces;
    if (block + 1 < w.block_end) load_pages(block + 1, pages, pieces);  // ahead of the waits

    const int key0 = block * kKeys;
    auto load_chunk = [&](int c) {
      uint64_t* bar = &smem.full[stage][c];
      v1::mbar_arrive_expect_tx(bar, cur_pieces * box_bytes);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q < cur_pieces) {
          const int row_in_page = (key0 + q * page_rows) & (p.page_size - 1);
          typename Traits::T* dst =
              smem.k[stage] + (c * kKeys + q * page_rows) * Traits::kChunkCols;
          v1::tma_load_3d(dst, kv_map, bar, c * Traits::kChunkCols, row_in_page, cur[q]);
        }
      }
    };
    v1::mbar_wait(&smem.empty_l[stage], phase ^ 1);
#pragma unroll
    for (int c = 0; c < Traits::kLeftChunks; ++c) load_chunk(c);
    v1::mbar_wait(&smem.empty_r[stage], phase ^ 1);
#pragma unroll
    for (int c = Traits::kLeftChunks; c < Traits::kChunks; ++c) load_chunk(c);
  }
}

}  // namespace mla::sm90::v2
