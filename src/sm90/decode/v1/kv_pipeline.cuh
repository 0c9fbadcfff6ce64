// Pieces shared by the TMA-fed decode kernels (v2, rows): the work of one CTA, the attended-set
// rule of a query row and the 128-byte swizzle of a 64-column chunk.
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

// Byte offset of element (row, col) of a [rows x 64 k] 128-byte-swizzled chunk sequence.
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col, int rows_per_chunk) {
  const int chunk = col >> 6, c = col & 63;
  return chunk * rows_per_chunk * 128 + row * 128 + ((((c >> 3) ^ (row & 7))) << 4) +
         ((c & 7) << 1);
}

}  // namespace mla::sm90::v1
