// Pieces shared by the TMA-fed decode kernels (v1, v2): the work of one CTA, the attended-set
// rule of a query row, the K-block producer and the 128-byte swizzle of a 64-column chunk.
#pragma once

#include <cstdint>

#include "sm90/common.cuh"
#include "sm90/decode/v1/launch.h"
#include "sm90/decode/v1/ptx.cuh"

namespace mla::sm90::v1 {

// The request and key range of one CTA, resolved on the device.
struct TileWork {
  int b;            // request
  int token0;       // global token index of the request's first query token
  int n;            // query tokens of the request
  int row0;         // first row of the tile (token * H + head)
  int rows;         // n * H
  int seq_len;      // seq_lens[b]
  int extent;       // keys [0, extent) may be attended by some row of the tile
  int block_begin;  // this split's run of 64-key blocks
  int block_end;
};

__device__ __forceinline__ TileWork resolve_tile(const DecodeKernelParams& p) {
  TileWork w;
  w.b = blockIdx.y;
  if (p.cum_seq_lens_q != nullptr) {
    w.token0 = p.cum_seq_lens_q[w.b];
    w.n = p.cum_seq_lens_q[w.b + 1] - w.token0;
  } else {
    w.token0 = w.b * p.q_len;
    w.n = p.q_len;
  }
  w.rows = w.n * p.num_heads;
  w.row0 = blockIdx.x * kTileRows;
  w.seq_len = p.seq_lens[w.b];
  const int last_token = min(w.n - 1, (w.row0 + kTileRows - 1) / p.num_heads);
  w.extent = p.mask != nullptr ? w.seq_len : max(0, w.seq_len - w.n + last_token + 1);
  const int num_blocks = (w.extent + kBlockKeys - 1) / kBlockKeys;
  const int per_split = (num_blocks + p.num_splits - 1) / p.num_splits;
  w.block_begin = min(num_blocks, static_cast<int>(blockIdx.z) * per_split);
  w.block_end = min(num_blocks, w.block_begin + per_split);
  return w;
}

// Which keys one query row attends: j < limit, and with a custom mask, j < first_query or the
// mask bit (j - first_query) of the row.
struct RowRule {
  int limit;            // 0 for padding rows
  int first_query;      // seq_len - n_b
  const uint8_t* mask;  // the row's mask bytes, or null
  __device__ __forceinline__ bool attends(int j) const {
    if (j >= limit) return false;
    if (mask == nullptr || j < first_query) return true;
    const int bit = j - first_query;
    return (mask[bit >> 3] >> (bit & 7)) & 1;
  }
};

// ---- producer ----

template <typename Traits>
__device__ __forceinline__ void produce_blocks(const DecodeKernelParams& p, const TileWork& w,
                                               const CUtensorMap* kv_map,
                                               typename Traits::SharedMemoryPlan& smem) {
  constexpr int kKeys = Traits::kKeys;
  const int page_rows = min(kKeys, p.page_size);  // rows per box
  const int page_shift = p.page_shift;
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.block_table_stride;
  const uint32_t piece_bytes = page_rows * Traits::kD * sizeof(typename Traits::T);

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
    const int stage = it % Traits::kStages;
    const uint32_t phase = (it / Traits::kStages) & 1;
    int cur[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) cur[q] = pages[q];
    const int cur_pieces = pieces;
    if (block + 1 < w.block_end) load_pages(block + 1, pages, pieces);  // ahead of the wait

    mbar_wait(&smem.empty[stage], phase ^ 1);
    mbar_arrive_expect_tx(&smem.full[stage], cur_pieces * piece_bytes);
    const int key0 = block * kKeys;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (q < cur_pieces) {
        const int row_in_page = (key0 + q * page_rows) & (p.page_size - 1);
        typename Traits::T* dst = smem.k[stage] + q * page_rows * Traits::kChunkCols;
#pragma unroll
        for (int c = 0; c < Traits::kChunks; ++c) {
          tma_load_3d(dst + c * Traits::kKeys * Traits::kChunkCols, kv_map, &smem.full[stage],
                      c * Traits::kChunkCols, row_in_page, cur[q]);
        }
      }
    }
  }
}

// Byte offset of element (row, col) of a [rows x 64 k] 128-byte-swizzled chunk sequence.
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col, int rows_per_chunk) {
  const int chunk = col >> 6, c = col & 63;
  return chunk * rows_per_chunk * 128 + row * 128 + ((((c >> 3) ^ (row & 7))) << 4) +
         ((c & 7) << 1);
}

}  // namespace mla::sm90::v1
