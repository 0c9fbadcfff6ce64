// Pieces shared by the TMA-fed decode kernels (seesaw/, few_rows/): the work of one CTA, the
// attended-set rule of a query row and the 128-byte swizzle of a 64-column chunk.
#pragma once

#include <cstdint>
#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/tma/ptx.cuh"
#include "sm90/decode/tma/tensor_map.h"
#include "sm90/decode/tma/widen.cuh"

namespace mla::sm90::tma {

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
  bool whole;  // balanced schedule: one segment covers the request (the CTA writes out and lse)
  // Sparse mode (one query token per tile): the token's sparse_indices row; the tile's keys are
  // its counted entries [0, extent) (contract section 2.2), rows [row0, rows) its heads.
  const int32_t* slots = nullptr;
};

// The keys a tile's rows may attend: w.seq_len and w.extent from w.b, w.n and w.row0. Returns the
// 64-key blocks they span.
__device__ __forceinline__ int resolve_extent(const DecodeKernelParams& p, TileWork& w) {
  w.seq_len = p.seq_lens[w.b];
  const int last_token = min(w.n - 1, (w.row0 + kTileRows - 1) / p.num_heads);
  w.extent = p.mask != nullptr ? w.seq_len : max(0, w.seq_len - w.n + last_token + 1);
  return (w.extent + kBlockKeys - 1) / kBlockKeys;
}

// Request b's query tokens: w.b, w.token0, w.n and w.rows.
__device__ __forceinline__ void resolve_request(const DecodeKernelParams& p, int b, TileWork& w) {
  w.b = b;
  if (p.cum_seq_lens_q != nullptr) {
    w.token0 = p.cum_seq_lens_q[b];
    w.n = p.cum_seq_lens_q[b + 1] - w.token0;
  } else {
    w.token0 = b * p.q_len;
    w.n = p.q_len;
  }
  w.rows = w.n * p.num_heads;
}

__device__ __forceinline__ TileWork resolve_tile(const DecodeKernelParams& p) {
  TileWork w;
  resolve_request(p, blockIdx.y, w);
  w.row0 = blockIdx.x * kTileRows;
  const int num_blocks = resolve_extent(p, w);
  const int per_split = (num_blocks + p.num_splits - 1) / p.num_splits;
  w.block_begin = min(num_blocks, static_cast<int>(blockIdx.z) * per_split);
  w.block_end = min(num_blocks, w.block_begin + per_split);
  w.whole = p.direct_out != 0;  // one split (the host's choice): the CTA writes out and lse
  return w;
}

// The L2 lines of query rows [row0, row0 + kRows) of request b of a dense call, requested by the
// kThreads threads tid before the CTA's first reads of seq_lens, so that the query's DRAM reads go
// ahead of the K blocks' (the seesaw kernel's direct split: docs/sm90-seesaw.md, the direct split;
// on the balanced schedule the part's first segment: PartCursor::prefetch_first_query).
// A ragged call's rows need cum_seq_lens_q: nothing is requested.
// kQueryBytes: bytes per query element (2, or 1 for an e4m3 query).
template <int kRows, int kThreads, int kQueryBytes = 2>
__device__ __forceinline__ void prefetch_query_rows(const DecodeKernelParams& p, int b, int row0,
                                                    int tid) {
  if (p.cum_seq_lens_q != nullptr) return;
  constexpr int kLines = 576 * kQueryBytes / 128 + 1;  // lines a 16-byte-aligned row can touch
  const int row_bytes = (p.kv_lora_rank + p.rope_dim) * kQueryBytes;
  const int rows = p.q_len * p.num_heads;
  for (int e = tid; e < kRows * kLines; e += kThreads) {
    const int r = e / kLines, line = e - r * kLines;
    const int row = row0 + r;
    if (row >= rows) break;  // e grows with r
    const int t = row / p.num_heads, h = row - t * p.num_heads;
    const uint8_t* base = static_cast<const uint8_t*>(p.query) +
                          kQueryBytes * (b * p.q_batch + t * p.q_token + h * p.q_head);
    prefetch_l2(base + min(line * 128, row_bytes - 1));
  }
}

// The token of a sparse call's CTA row blockIdx.y (sparse_order's entry where there is one, a
// read), its request b and index i in it, without the reads that resolve its extent. False for a
// ragged call (its request takes a search of cum_seq_lens_q) and a row past the tokens.
__device__ __forceinline__ bool sparse_row_token(const DecodeKernelParams& p, int& b, int& i) {
  const int row = static_cast<int>(blockIdx.y);
  if (p.cum_seq_lens_q != nullptr || row >= p.num_tokens) return false;
  const int t = p.sparse_order != nullptr ? p.sparse_order[row] : row;
  b = t / p.q_len;
  i = t - b * p.q_len;
  return true;
}

// Query token t (global index) of a sparse call: its request's work (resolve_request), its heads'
// rows [row0, rows) (token * H .. of the request), its counted entries
// min(top_k, topk_len, seq_len - n_b + i + 1) as the extent (contract section 2.2; the SIMT
// kernel's rule) and its index row.
__device__ __forceinline__ void resolve_sparse_token(const DecodeKernelParams& p, int t,
                                                     TileWork& w) {
  const int b = request_of_token(p, t);
  resolve_request(p, b, w);
  const int i = t - w.token0;
  w.row0 = i * p.num_heads;
  w.rows = (i + 1) * p.num_heads;
  w.seq_len = p.seq_lens[b];
  const int row = p.cum_seq_lens_q != nullptr ? t : i;  // per-token tensors' row (ragged: t)
  int count = p.top_k;
  if (p.topk_lens != nullptr) count = min(count, p.topk_lens[b * p.tl_batch + row * p.tl_token]);
  w.extent = max(0, min(count, w.seq_len - w.n + i + 1));
  w.slots = p.sparse_indices + b * p.si_batch + static_cast<int64_t>(row) * p.si_token;
}

// The tile of a sparse call (one query token's heads): token `row`, or sparse_order's entry `row`
// (params.h), query-row tile `tile` of its H heads, split blockIdx.z of num_splits equal runs of
// the 64-key blocks over its counted entries. w.rows is the row after the token's last head, so
// that rows - row0 is the tile's row count. tile_rows: the kernel's tile (the seesaw kernel's 64
// rows; the few-rows kernel's 16 where a token's heads take several: route.cc).
__device__ __forceinline__ TileWork resolve_sparse_tile(const DecodeKernelParams& p, int tile,
                                                        int row, int tile_rows = kTileRows) {
  TileWork w;
  const int t = p.sparse_order != nullptr ? p.sparse_order[row] : row;
  resolve_sparse_token(p, t, w);
  w.row0 += tile * tile_rows;
  const int num_blocks = (w.extent + kBlockKeys - 1) / kBlockKeys;
  const int per_split = (num_blocks + p.num_splits - 1) / p.num_splits;
  w.block_begin = min(num_blocks, static_cast<int>(blockIdx.z) * per_split);
  w.block_end = min(num_blocks, w.block_begin + per_split);
  w.whole = p.direct_out != 0;
  return w;
}

// The one segment of a CTA of a sparse call whose grid has a row per token (resolve_sparse_tile
// with tile blockIdx.x, row blockIdx.y). Its walk ends after one segment where the compiler sees
// it, so that nothing of it stays live across the segment's blocks (with SparseCursor's rounds,
// the seesaw kernel's sparse consumers spilled 48 bytes, +24% at B128 H64 fp8_ds_mla).
struct SparseTokenCursor {
  bool done;

  __device__ __forceinline__ void begin(const DecodeKernelParams&) { done = false; }

  __device__ __forceinline__ bool next(const DecodeKernelParams& p, TileWork& w,
                                       int64_t& partial_row0) {
    if (done) return false;
    done = true;
    w = resolve_sparse_tile(p, blockIdx.x, blockIdx.y);
    if (w.row0 >= w.rows) return false;  // a tile past the token's heads
    partial_row0 =
        (static_cast<int64_t>(blockIdx.z) * p.num_tokens + w.token0) * p.num_heads + w.row0;
    return true;
  }
};

// The segments of a CTA of a sparse call (resolve_sparse_tile with tile blockIdx.x): token rows
// blockIdx.y of rounds of gridDim.y rows, in snake order (rows y, 2G - 1 - y, 2G + y, ... of a
// grid of G rows), one per segment; a grid of num_tokens rows gives each CTA one segment. With the
// longest-first order (sparse_order) the snake pairs a round's longest tokens with the next
// round's shortest. Partial rows in the uniform layout [split, T, H]. kTileRowsN: the kernel's
// query-row tile (resolve_sparse_tile).
template <int kTileRowsN = kTileRows>
struct SparseCursor {
  int round;

  __device__ __forceinline__ void begin(const DecodeKernelParams&) { round = 0; }

  __device__ __forceinline__ bool next(const DecodeKernelParams& p, TileWork& w,
                                       int64_t& partial_row0) {
    const int g = static_cast<int>(gridDim.y);
    const int y = static_cast<int>(blockIdx.y);
    int row;
    do {
      if (round * g >= p.num_tokens) return false;
      row = round * g + ((round & 1) != 0 ? g - 1 - y : y);
      ++round;
    } while (row >= p.num_tokens);  // the last round's rows past the tokens
    w = resolve_sparse_tile(p, blockIdx.x, row, kTileRowsN);
    if (w.row0 >= w.rows) return false;  // a tile past the token's heads (every token's)
    partial_row0 =
        (static_cast<int64_t>(blockIdx.z) * p.num_tokens + w.token0) * p.num_heads + w.row0;
    return true;
  }
};

// The segments of one CTA of the balanced schedule (params.h, schedule::Request): part blockIdx.y,
// query-row tile blockIdx.x, in request order. The producer and the consumers walk the same list.
struct PartCursor {
  int b;       // next request to look at
  int part;    // blockIdx.y
  int per;     // positions per part
  int lo, hi;  // the part's positions [lo, hi)

  __device__ __forceinline__ void begin(const DecodeKernelParams& p) {
    part = blockIdx.y;
    per = *p.sched_part_blocks;
    lo = part * per;
    hi = lo + per;
    b = p.sched_part_first[part];
  }

  // The next segment of this tile: its work and first partial row; false when the part is done.
  // A segment past the tile's extent (an earlier token's causal limit) has no block and still gets
  // its (empty) partial; a request without rows in this tile has no segment here.
  __device__ __forceinline__ bool next(const DecodeKernelParams& p, TileWork& w,
                                       int64_t& partial_row0) {
    while (b < p.batch) {
      const schedule::Request r = p.sched_requests[b];
      if (r.pos >= hi) return false;
      const int cur = b++;
      const int first = max(lo, r.pos) - r.pos;
      const int last = min(hi, r.pos + r.blocks) - r.pos;
      if (first >= last) continue;  // no block of this request in the part
      w.row0 = blockIdx.x * kTileRows;
      if (w.row0 >= r.rows) continue;
      w.b = cur;
      w.rows = r.rows;
      w.n = r.rows / p.num_heads;
      w.token0 = p.cum_seq_lens_q != nullptr ? p.cum_seq_lens_q[cur] : cur * p.q_len;
      const int tile_blocks = resolve_extent(p, w);
      w.block_begin = min(first, tile_blocks);
      w.block_end = min(last, tile_blocks);
      // NOTE: the plan's segment count (schedule_kernel.cu) from the same positions: the combine's
      // list holds exactly the tokens of the other requests.
      w.whole = (r.pos + r.blocks - 1) / per == r.pos / per;
      partial_row0 = r.row_base + static_cast<int64_t>(part - r.pos / per) * r.rows + w.row0;
      // NOTE: the next call reads the next record (and its seq_lens entry) after this segment's
      // blocks; fetched now, the read after a CTA's last segment is an L2 hit, not a DRAM miss.
      if (b < p.batch) {
        prefetch_l2_keep(&p.sched_requests[b]);
        prefetch_l2_keep(&p.seq_lens[b]);
      }
      return true;
    }
    return false;
  }

  // This tile's query rows (kRows from next()'s row0) of the part's first segment into L2, right
  // after begin(): next() reads the request's record and seq_lens meanwhile (a dense call's rows
  // need neither; a ragged call's need cum_seq_lens_q, and nothing is asked). Asking for each next
  // segment's rows as well, at the previous segment's start or at the end of its GEMMs, cost 1 to
  // 4% at many segments per part (docs/perf-notes.md, Change 68).
  template <int kRows, int kThreads, int kQueryBytes>
  __device__ __forceinline__ void prefetch_first_query(const DecodeKernelParams& p, int tid) const {
    if (b < p.batch) {
      prefetch_query_rows<kRows, kThreads, kQueryBytes>(p, b, blockIdx.x * kTileRows, tid);
    }
  }
};

// The one segment of a CTA of the seesaw kernel's direct split (a call of one request; no plan
// kernel): request 0, query-row tile blockIdx.x, run blockIdx.y of gridDim.y equal runs of the
// tile's 64-key blocks (possibly empty). Run s writes partial rows [s, T, H] (the uniform layout),
// or, with p.direct_out (one run), out and lse.
struct SplitCursor {
  bool done;

  __device__ __forceinline__ void begin(const DecodeKernelParams&) { done = false; }

  __device__ __forceinline__ bool next(const DecodeKernelParams& p, TileWork& w,
                                       int64_t& partial_row0) {
    if (done) return false;
    done = true;
    resolve_request(p, 0, w);
    w.row0 = blockIdx.x * kTileRows;
    if (w.row0 >= w.rows) return false;  // a tile past a ragged request's rows: nothing to do
    const int64_t blocks = resolve_extent(p, w), runs = gridDim.y, run = blockIdx.y;
    w.block_begin = static_cast<int>(blocks * run / runs);
    w.block_end = static_cast<int>(blocks * (run + 1) / runs);
    w.whole = p.direct_out != 0;
    partial_row0 = (run * p.num_tokens + w.token0) * p.num_heads + w.row0;
    return true;
  }
};

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

// The rule of row r of segment w's tile in a dense call: a padding row (valid false) attends no
// key; under a mask, the keys below seq_len its token's mask bytes allow; else its token's causal
// bound.
__device__ __forceinline__ RowRule dense_row_rule(const DecodeKernelParams& p, const TileWork& w,
                                                  int r, bool valid) {
  RowRule rule;
  const int i = (w.row0 + r) / p.num_heads;  // token of the row
  rule.first_query = w.seq_len - w.n;
  rule.mask = nullptr;
  if (!valid) {
    rule.limit = 0;
  } else if (p.mask != nullptr) {
    rule.limit = w.seq_len;
    const int t = p.cum_seq_lens_q != nullptr ? w.token0 + i : i;
    rule.mask = p.mask + w.b * p.mask_batch + t * p.mask_token;
  } else {
    rule.limit = max(0, w.seq_len - w.n + i + 1);
  }
  return rule;
}

// V rows [r_begin, r_end) of a stage (v_chunks chunks of `keys` rows of 64 values; r_end is
// `keys`, or `valid` where the rows past it are zero already: the fp8 ring's widening,
// fp8_ring.cuh) made safe for P V: rows from `valid` on (keys past the extent: TMA loads whole
// boxes and skips pages past it, so they may hold NaN from a poisoned cache or a stale stage)
// become 0; rows [r_begin, valid) (draft keys, positions seq_len - n_b .. seq_len - 1, which some
// rows of a tile attend and others do not) keep their finite values and lose their non-finite ones.
// P is 0 for a row that does not attend a key, and 0 times NaN is NaN; a row that attends a
// non-finite key already holds a NaN score, which carries the NaN into its sum, lse and out
// (contract section 1). Call once S is computed. Threads tid, tid + nthreads, ... share the 16-byte
// pieces. kElemBytes 2: 16-bit values, 128-byte rows, non-finite where the exponent bits `exp_mask`
// are all ones (0x7f80 bf16, 0x7c00 fp16); 1: e4m3 values, 64-byte rows (the 64-byte swizzle keeps
// a row's bytes within it), whose only non-finite values are NaN, 0x7f and 0xff.
template <int kElemBytes>
__device__ __forceinline__ void clean_v_rows_of(uint8_t* k_bytes, int keys, int v_chunks,
                                                int r_begin, int r_end, int valid,
                                                uint32_t exp_mask, int tid, int nthreads) {
  constexpr int kRowBytes = 64 * kElemBytes, kPieces = kRowBytes / 16;  // 8 or 4
  const int n = (r_end - r_begin) * v_chunks * kPieces;
  for (int e = tid; e < n; e += nthreads) {
    const int piece = e & (kPieces - 1), rest = e >> (kElemBytes == 2 ? 3 : 2);
    const int chunk = rest % v_chunks, r = r_begin + rest / v_chunks;
    uint4* at =
        reinterpret_cast<uint4*>(k_bytes + chunk * keys * kRowBytes + r * kRowBytes + piece * 16);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) {
      v = *at;
      uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (kElemBytes == 2) {
          if ((w[k] & exp_mask) == exp_mask) w[k] &= 0xffff0000u;
          if (((w[k] >> 16) & exp_mask) == exp_mask) w[k] &= 0x0000ffffu;
        } else {
#pragma unroll
          for (int b = 0; b < 32; b += 8) {
            if (((w[k] >> b) & 0x7fu) == 0x7fu) w[k] &= ~(0xffu << b);
          }
        }
      }
    }
    *at = v;
  }
}
__device__ __forceinline__ void clean_v_rows(uint8_t* k_bytes, int keys, int v_chunks, int r_begin,
                                             int r_end, int valid, uint32_t exp_mask, int tid,
                                             int nthreads) {
  clean_v_rows_of<2>(k_bytes, keys, v_chunks, r_begin, r_end, valid, exp_mask, tid, nthreads);
}
__device__ __forceinline__ void clean_v_rows_e4m3(uint8_t* k_bytes, int keys, int v_chunks,
                                                  int r_begin, int valid, int tid, int nthreads) {
  clean_v_rows_of<1>(k_bytes, keys, v_chunks, r_begin, keys, valid, 0, tid, nthreads);
}

// Byte offset of element (row, col) of a [rows x 64 k] 128-byte-swizzled chunk sequence.
__device__ __forceinline__ uint32_t swizzled_offset(int row, int col, int rows_per_chunk) {
  const int chunk = col >> 6, c = col & 63;
  return chunk * rows_per_chunk * 128 + row * 128 + ((((c >> 3) ^ (row & 7))) << 4) +
         ((c & 7) << 1);
}

// Byte offset of byte `col` of row `row` of a [rows x 64 k] 64-byte-swizzled chunk sequence of
// e4m3 values (GMMA's K-major 64-byte swizzle: 16-byte unit u of row r sits at u ^ ((r / 2) % 4)).
__device__ __forceinline__ uint32_t swizzled_offset_e4m3(int row, int col, int rows_per_chunk) {
  const int chunk = col >> 6, c = col & 63;
  return chunk * rows_per_chunk * 64 + row * 64 + (((c >> 4) ^ ((row >> 1) & 3)) << 4) + (c & 15);
}

// The query tile of segment w through the query's tensor map (make_query_tensor_map): kChunks
// boxes of 64 rows x kChunkCols columns at `dst` (chunk c at c * 64 * kChunkCols elements of
// kElemBytes), complete on `bar` (one arrival, the tile's bytes). Heads h0 .. h0 + 63 of token i
// (H a multiple of 64), or every head of tokens i .. i + 64 / H - 1 (h0 = 0; H divides 64). One
// thread issues it, after every reader of the previous tile's bytes is done with them.
template <int kChunks, int kChunkCols, int kElemBytes, typename T>
__device__ __forceinline__ void issue_query_tile(const DecodeKernelParams& p, const TileWork& w,
                                                 const CUtensorMap* q_map, uint64_t* bar, T* dst) {
  constexpr int kRows = kTileRows;
  const int i = w.row0 / p.num_heads, h0 = w.row0 - i * p.num_heads;
  const bool ragged = p.cum_seq_lens_q != nullptr;
  mbar_arrive_expect_tx(bar, kRows * kChunks * kChunkCols * kElemBytes);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    tma_load_4d(dst + c * kRows * kChunkCols, q_map, bar, c * kChunkCols, h0,
                ragged ? w.token0 + i : i, ragged ? 0 : w.b);
  }
}

// The tile's query rows [w.row0, w.row0 + kRows) into a [kRows x 576] 128-byte-swizzled chunk
// sequence of 16-bit values (rows past tile_rows zero), in 16-byte vectors from the kThreads
// threads tid; an e4m3 query (Widen = __half: its GEMMs run in fp16) is widened exactly. Threads
// 0 .. kRows - 1 write row r's first vector (null for a padding row) into `row_ptr` (shared),
// `sync` makes them visible to all kThreads, then every load is that pointer plus its vector, all
// of them in flight before the first store (a (token, head) division and 64-bit stride products per
// load were ~125 instructions each, ~2 us of issue per segment: docs/sm90-seesaw.md, Work split).
// `in_flight` runs while the loads are in flight, before any thread stores into `dst` (every
// thread calls it). The caller fences and syncs.
// kE4m3Tile: an e4m3 query kept as e4m3 for the FP8 tensor cores, into a 64-byte-swizzled chunk
// sequence (swizzled_offset_e4m3).
// kScaledHalf: a bf16 query stored as fp16 (for fp16 GEMMs over a widened e4m3 cache), each row
// scaled by the power of two 2^s that puts its largest |value| in [2^14, 2^15) (exact for every
// value above 2^-31 of that largest one: docs/sm90-fp8.md), 2^-s written to row_unscale[r] (1 for
// a row of zeros or a non-finite value). `row_max` (kRows words of shared memory) takes the rows'
// largest |value| bits; `sync` runs once more, between the maxima and the stores. kPermute16 (with
// kScaledHalf): the columns in the k-slot order of the few-rows kernel's K fragments from
// registers (few_rows_kernel.cuh, load_e4m3_k_words): in each group of 16 columns the 4-byte
// words 0, 2, 4, 6 first, then 1, 3, 5, 7 (two vectors per load unit). kRopeBf16 (with
// kPermute16): the rope chunk (columns 512..575) in bf16 instead, scaled by the same 2^s and in
// column order (the S GEMM's rope part runs in bf16 from shared memory: the few-rows kernel over
// fp8_ds_mla rows as they land); exact unless a scaled value falls below 2^-126.
template <int kRows, int kThreads, typename Widen = void, bool kE4m3Tile = false,
          bool kScaledHalf = false, bool kPermute16 = false, bool kRopeBf16 = false, typename Sync,
          typename InFlight>
__device__ __forceinline__ void load_query_tile_rows(const DecodeKernelParams& p, const TileWork& w,
                                                     int tile_rows, uint8_t* dst,
                                                     const uint4** row_ptr, int tid, Sync sync,
                                                     InFlight in_flight,
                                                     uint32_t* row_max = nullptr,
                                                     float* row_unscale = nullptr) {
  static_assert(!(kE4m3Tile && !std::is_void_v<Widen>), "an e4m3 tile is not widened");
  static_assert(!kScaledHalf || (!kE4m3Tile && std::is_void_v<Widen>), "a 16-bit query");
  static_assert(!kPermute16 || kScaledHalf, "the permuted tile is the scaled one");
  static_assert(!kRopeBf16 || kPermute16, "a bf16 rope chunk beside the permuted fp16 tile");
  constexpr bool kFp8 = !std::is_void_v<Widen>;
  constexpr int kElemBytes = kFp8 || kE4m3Tile ? 1 : 2;
  if (tid < kRows) {
    const uint4* ptr = nullptr;
    if (tid < tile_rows) {
      const int row = w.row0 + tid;
      const int i = row / p.num_heads, h = row - i * p.num_heads;
      const int t = p.cum_seq_lens_q != nullptr ? w.token0 + i : i;
      const int64_t e = w.b * p.q_batch + t * p.q_token + h * p.q_head;
      ptr = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.query) + e * kElemBytes);
    }
    row_ptr[tid] = ptr;
    if constexpr (kScaledHalf) row_max[tid] = 0;
  }
  sync();
  if constexpr (kScaledHalf) {
    // Units of two vectors (16 columns); the head-dims mapping per vector as below.
    constexpr int kUnits = 576 / 16;
    constexpr int kPerThreadU = (kRows * kUnits + kThreads - 1) / kThreads;
    uint4 value[kPerThreadU][2];
    const int latent_vecs = p.kv_lora_rank * 2 / 16;
    const int rope_vec0 = p.rope_dim > 0 ? latent_vecs : -72;
    const bool plain = p.kv_lora_rank == 512 && p.rope_dim == 64;
    auto row_vec = [&](int v) {
      return plain ? v : v < 64 ? (v < latent_vecs ? v : -1) : rope_vec0 + (v - 64);
    };
#pragma unroll
    for (int k = 0; k < kPerThreadU; ++k) {
      const int e = tid + k * kThreads;
      const int r = e / kUnits, g = e - r * kUnits;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        value[k][h] = make_uint4(0, 0, 0, 0);
        if (kRows * kUnits % kThreads == 0 || r < kRows) {
          const uint4* src = row_ptr[r];
          const int u = row_vec(2 * g + h);
          if (src != nullptr && u >= 0) value[k][h] = __ldg(src + u);
        }
      }
    }
    in_flight();
    // The rows' largest |value| (as bits: non-negative floats order as their bits; NaN above).
    auto abs_max2 = [](uint32_t word) {  // two bf16 values: the larger |value|, as float bits
      return max(word << 16, word & 0xffff0000u) & 0x7fffffffu;
    };
#pragma unroll
    for (int k = 0; k < kPerThreadU; ++k) {
      const int e = tid + k * kThreads;
      const int r = e / kUnits;
      if (kRows * kUnits % kThreads == 0 || r < kRows) {
        const uint32_t* x = reinterpret_cast<const uint32_t*>(&value[k][0]);
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) m = max(m, abs_max2(x[i]));
        if (m != 0) atomicMax(&row_max[r], m);
      }
    }
    sync();
    // 2^s (s = 14 - the largest value's exponent) in two factors of at most 2^74 each: a row's
    // largest value may be as small as bf16's 2^-133.
    auto scale_of = [](uint32_t bits, float& lo, float& hi, float& unscale) {
      const int e = static_cast<int>(bits >> 23) - 127;  // exponent of the largest |value|
      if (bits == 0 || bits >= 0x7f800000u) {            // zeros; inf or NaN (the row turns NaN)
        lo = hi = unscale = 1.0f;
        return;
      }
      if (e < -126) {  // every |value| below 2^-126: its scores are below 2^-116, taken as 0
        lo = hi = 0.0f;
        unscale = 1.0f;
        return;
      }
      const int s = 14 - e;
      lo = exp2f(static_cast<float>(s / 2));
      hi = exp2f(static_cast<float>(s - s / 2));
      unscale = exp2f(static_cast<float>(-s));
    };
    if (tid < kRows) {
      float lo, hi, unscale;
      scale_of(row_max[tid], lo, hi, unscale);
      row_unscale[tid] = unscale;
    }
#pragma unroll
    for (int k = 0; k < kPerThreadU; ++k) {
      const int e = tid + k * kThreads;
      const int r = e / kUnits, g = e - r * kUnits;
      if (kRows * kUnits % kThreads == 0 || r < kRows) {
        float lo, hi, unscale;
        scale_of(row_max[r], lo, hi, unscale);
        const uint32_t* x = reinterpret_cast<const uint32_t*>(&value[k][0]);
        uint32_t h[8];  // fp16 pairs of the scaled values (kRopeBf16, rope units: bf16 pairs)
        const bool rope_bf16 = kRopeBf16 && g >= 512 / 16;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float a = __uint_as_float(x[i] << 16) * lo * hi;
          const float b = __uint_as_float(x[i] & 0xffff0000u) * lo * hi;
          if (rope_bf16) {
            const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
            h[i] = *reinterpret_cast<const uint32_t*>(&v);
          } else {
            const __half2 v = __floats2half2_rn(a, b);
            h[i] = *reinterpret_cast<const uint32_t*>(&v);
          }
        }
        const bool permute = kPermute16 && !rope_bf16;
        *reinterpret_cast<uint4*>(dst + swizzled_offset(r, 16 * g, kRows)) =
            permute ? make_uint4(h[0], h[2], h[4], h[6]) : make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4*>(dst + swizzled_offset(r, 16 * g + 8, kRows)) =
            permute ? make_uint4(h[1], h[3], h[5], h[7]) : make_uint4(h[4], h[5], h[6], h[7]);
      }
    }
    return;
  }
  constexpr int kVecs = 576 * kElemBytes / 16;  // per row of the tile
  constexpr int kLatentVecs = 512 * kElemBytes / 16;
  constexpr int kPerThread = (kRows * kVecs + kThreads - 1) / kThreads;
  uint4 value[kPerThread];
  // Head dims other than (512, 64) (params.h): tile vector v holds row vector v (latent columns
  // below L), v - (512 - L) (rope columns, R 64), or zeros (columns the rows lack). A loop of its
  // own, so that (512, 64)'s loop keeps its registers (the consumers' O fills theirs).
  auto load = [&](auto row_vec) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int e = tid + k * kThreads;
      const int r = e / kVecs, v = e - r * kVecs;
      value[k] = make_uint4(0, 0, 0, 0);
      if (kRows * kVecs % kThreads == 0 || r < kRows) {
        const uint4* src = row_ptr[r];
        const int u = row_vec(v);
        if (src != nullptr && u >= 0) value[k] = __ldg(src + u);
      }
    }
  };
  if (p.kv_lora_rank == 512 && p.rope_dim == 64) {
    load([](int v) { return v; });
  } else {
    const int latent_vecs = p.kv_lora_rank * kElemBytes / 16;
    const int rope_vec0 = p.rope_dim > 0 ? latent_vecs : -kVecs;  // row vector of tile rope 0
    load([&](int v) {
      return v < kLatentVecs ? (v < latent_vecs ? v : -1) : rope_vec0 + (v - kLatentVecs);
    });
  }
  in_flight();
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int e = tid + k * kThreads;
    const int r = e / kVecs, v = e - r * kVecs;
    if (kRows * kVecs % kThreads == 0 || r < kRows) {
      if constexpr (kE4m3Tile) {
        *reinterpret_cast<uint4*>(dst + swizzled_offset_e4m3(r, v * 16, kRows)) = value[k];
      } else if constexpr (kFp8) {
        uint4 lo, hi;
        widen_e4m3x16<Widen>(value[k], lo, hi);
        *reinterpret_cast<uint4*>(dst + swizzled_offset(r, v * 16, kRows)) = lo;
        *reinterpret_cast<uint4*>(dst + swizzled_offset(r, v * 16 + 8, kRows)) = hi;
      } else {
        *reinterpret_cast<uint4*>(dst + swizzled_offset(r, v * 8, kRows)) = value[k];
      }
    }
  }
}

}  // namespace mla::sm90::tma
