// The kernel ABI of the sm90 backend: one plain struct, filled once from detail::Problem and
// DecodeParams at the dispatch boundary (src/sm90/host/sm90.cc). Strides count elements.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sm90/decode/schedule/format.h"

namespace mla::sm90 {

// Element formats of the kernels' template parameters (one instantiation per supported set).
// kFp8DsMla: DeepSeek-V3.2's 656-byte cache row (512 e4m3 values, 4 fp32 scales, one per 128
// values, 64 bf16 rope values), kv_cache only.
enum class Elem : int { kBf16 = 0, kFp16 = 1, kFp8E4M3 = 2, kFp8DsMla = 3 };

// Keys per online-softmax block, per skip-softmax decision and per split unit.
inline constexpr int kBlockKeys = 64;

// Most splits per query token (the combine kernel's warp 0 holds kMaxSplits / 32 per lane); a
// request of the balanced schedule has at most one split per part.
inline constexpr int kMaxSplits = 256;

// Bytes at the start of the workspace that hold the checked mode's record (the first bad index).
inline constexpr int64_t kCheckRecordBytes = 256;

struct DecodeKernelParams {
  // Inputs.
  const void* query = nullptr;            // [B, q_len, H, D] / [T, H, D], Q dtype
  const void* kv = nullptr;               // [P, page_size, D] (4-D: [P, 1, page_size, D]), KV dtype
  const int32_t* block_tables = nullptr;  // [B, max_pages] int32; dense mode
  const int32_t* seq_lens = nullptr;      // [B] int32
  const int32_t* cum_seq_lens_q = nullptr;  // [B + 1] int32; ragged queries, else null
  const void* sinks = nullptr;              // [H] fp32, bf16 or fp16 (sinks_elem), optional
  const uint8_t* mask = nullptr;            // [B, q_len, W] / [T, W] uint32 words, optional
  const int32_t* sparse_indices = nullptr;  // [B, q_len, top_k] / [T, top_k] int32; sparse mode
  const int32_t* topk_lens = nullptr;       // [B] or [B, q_len] / [T] int32, optional
  const float* bmm1_scale_ptr = nullptr;    // [1] fp32, optional; replaces bmm1_scale
  const float* bmm2_scale_ptr = nullptr;    // [1] fp32, optional; replaces bmm2_scale

  // Outputs.
  void* out = nullptr;   // [B, q_len, H, L] / [T, H, L], out dtype
  float* lse = nullptr;  // [B, q_len, H] / [T, H] fp32, optional

  // Workspace: the partials of every (split, token, head) row. o = bmm2_scale * (sum of p * v) /
  // sum, rounded to the out type (bf16 or fp16, as out_fp16 says; 0 where sum is 0), with max and
  // sum in fp32.
  void* partial_o = nullptr;     // [num_splits, T, H, L] out dtype
  float* partial_max = nullptr;  // [num_splits, T, H] fp32, running max (-inf: no key)
  float* partial_sum = nullptr;  // [num_splits, T, H] fp32, sum of exp(s - max)

  // Balanced schedule (the seesaw kernel's): set, the partial rows are those of the schedule
  // (schedule/format.h)
  // instead of [num_splits, T, H], and the grid is (tiles, num_parts).
  const schedule::Request* sched_requests = nullptr;  // [B]
  const schedule::Token* sched_tokens = nullptr;      // [T] the combine's list, in token order
  const int32_t* sched_part_first = nullptr;   // [num_parts] first request of a part (B: none)
  const int32_t* sched_part_blocks = nullptr;  // [1] positions per part
  int32_t num_parts = 0;

  // Sparse calls of one split over more than one wave of CTAs: the tokens by decreasing counted
  // blocks (schedule/sparse_order_kernel.cu); CTA row blockIdx.y takes token sparse_order[y]
  // (null: token y). Any permutation gives the same results; this one starts the longest first.
  const int32_t* sparse_order = nullptr;  // [T]
  // The seesaw kernel's sparse grid rows G (0: num_tokens, one token per CTA); G < num_tokens
  // (MLA_SM90_SPARSE_ROWS only): CTA row y walks token rows y, 2G - 1 - y, ... (tma::SparseCursor).
  int32_t sparse_rows = 0;

  // Sizes.
  int32_t batch = 0;       // B
  int32_t num_tokens = 0;  // T = B * q_len, or cum_seq_lens_q[B]
  int32_t q_len = 0;       // dense query length; 0 when ragged
  int32_t num_heads = 0;   // H
  int32_t num_splits = 0;  // splits per query token, <= kMaxSplits (a split may be empty); with
                           // the balanced schedule, the typical count (sizes the combine's CTAs)
  int32_t page_size = 0;   // a power of two
  int32_t page_shift = 0;  // log2(page_size)
  int32_t num_pages = 0;   // P
  int32_t top_k = 0;       // > 0: sparse mode
  int32_t out_fp16 = 0;    // out dtype: 1 fp16, 0 bf16 (for the kernels that write out)
  int32_t out_vec16 = 0;   // out's address and strides allow 16-byte stores of 8 values
  int32_t out_vec8 = 0;    // out's address and strides allow 8-byte stores of 4 values
  int32_t direct_out = 0;  // the decode kernel writes out and lse (one split); no combine
  // The seesaw kernels (the 16-bit one over a cache of the query's type, the FP8 ones) load their
  // query tiles through the query tensor map (tma::make_query_tensor_map) rather than through the
  // consumers' registers.
  int32_t query_tma = 0;
  // The seesaw kernel's dense rounds: consumer 1 issues a segment's first S only once consumer 0's
  // is done, so that the first one runs alone.
  int32_t hold_first_s = 0;
  int32_t sinks_elem = 0;  // sinks dtype: 0 fp32, 1 bf16, 2 fp16
  // Head dims (kv_lora_rank L, qk_rope_head_dim R): (512, 64), (256, 64) or (512, 0). The TMA and
  // gather kernels' tiles keep the 512 + 64 column layout of (512, 64): columns of the tile that
  // the call's rows lack (latent columns L..511, or the rope chunk when R is 0) hold zeros
  // (tile_column), and only out's first L columns are written (docs/architecture.md, Head dims).
  int32_t kv_lora_rank = 512;
  int32_t rope_dim = 64;
  // The TMA box column of each 64-column chunk c of the tiles (0..7 latent, 8 rope): the column of
  // the call's rows it holds (64 c for (512, 64)), or L + R for a chunk the rows lack (a box wholly
  // past the row lands as zeros). Read by index from the kernel's parameters.
  int32_t chunk_box[9] = {0, 64, 128, 192, 256, 320, 384, 448, 512};

  // Element strides of the per-token tensors: element (b, t, h) at b * batch + t * token + h * head
  // with t = i (dense) or t = cum_seq_lens_q[b] + i (ragged; batch stride 0).
  int64_t q_batch = 0, q_token = 0, q_head = 0;
  int64_t out_batch = 0, out_token = 0, out_head = 0;
  int64_t lse_batch = 0, lse_token = 0, lse_head = 0;
  int64_t mask_batch = 0, mask_token = 0;  // in BYTES: uint32 and uint16 masks share a layout
  int64_t si_batch = 0, si_token = 0;      // sparse_indices rows
  int64_t tl_batch = 0, tl_token = 0;      // topk_lens (per request: tl_token 0)
  int64_t kv_page_stride = 0;              // between physical pages
  int64_t kv_row_stride = 0;               // between tokens of one page
  int64_t block_table_stride = 0;          // between requests
  int64_t sinks_stride = 1;

  // Scalars.
  float bmm1_scale = 1.0f;           // used when bmm1_scale_ptr is null
  float bmm2_scale = 1.0f;           // used when bmm2_scale_ptr is null
  float skip_softmax_factor = 0.0f;  // f > 0 enables skip-softmax
  // The chunks a few-rows producer widens from rows it gathered a block ahead into registers are
  // published without the producer's proxy fence; each consumer fences after its wait on the chunk
  // instead (tma::gather_ahead_blocks; docs/sm90-sparse.md, The proxy fence on the consumers'
  // side). NOTE: last, so that no other member moves: the kernels that never read it compile to
  // the same SASS (a member in the middle moved the others' offsets and ptxas paired their
  // constant loads differently in every kernel).
  int32_t consumer_fence = 0;
  // kv_page_stride and kv_row_stride in 16-byte units, modulo 2^32 (the gathers that read them
  // take only 16-byte strides and caches below 64 GB, so a row's offset in those units fits 32
  // bits).
  uint32_t kv_page16 = 0, kv_row16 = 0;
};

// NOTE: a member added anywhere but last moves every later member's offset, and ptxas then pairs
// the constant loads differently in every kernel, those that never read the member included: a
// timed change to one kernel then moves all of them (docs/perf-notes.md, Changes 85 and 86; the
// ~2% those builds lost was the producer's run-time branch, not the member's place). New members
// go last (which leaves this offset as it is); the assert catches one put elsewhere.
static_assert(offsetof(DecodeKernelParams, consumer_fence) == 452,
              "DecodeKernelParams: add new members last (see the note above)");

// What the checked mode inspects; the first bad entry lands in the workspace record.
struct IndexCheckParams {
  const int32_t* block_tables = nullptr;    // [B, max_pages] (row 0 of [B, 2, max_pages]); dense
  const int32_t* seq_lens = nullptr;        // [B]
  const int32_t* cum_seq_lens_q = nullptr;  // [B + 1], ragged only
  const int32_t* sparse_indices = nullptr;  // sparse mode
  const int32_t* topk_lens = nullptr;       // optional
  unsigned long long* record = nullptr;     // [1] in the workspace: the smallest bad key

  int32_t batch = 0;
  int32_t num_tokens = 0;
  int32_t q_len = 0;  // dense; 0 when ragged
  int32_t max_pages = 0;
  int32_t page_size = 0;
  int32_t num_pages = 0;
  int32_t top_k = 0;
  int32_t max_seq_len = 0;
  int32_t max_q_len = 0;
  int32_t mask_bits = 0;  // > 0: a dense custom mask of this many bits per row
  bool topk_lens_per_token = false;
  int64_t block_table_stride = 0;
  // [B, 2, max_pages] tables: the element stride from row 0 to row 1 (0: [B, max_pages]); row 1
  // must name the same pages as row 0 on every page a request needs.
  int64_t block_table_kv_stride = 0;
  int64_t si_batch = 0, si_token = 0;
  int64_t tl_batch = 0, tl_token = 0;
};

// Key of a bad entry: the check (in the cpu backend's order) in the top bits, then the entry.
// The smallest key over all bad entries is reported.
enum class IndexCheck : unsigned long long {
  kSeqLens = 0,
  kCumSeqLensQ = 1,
  kBlockTables = 2,
  kTopkLens = 3,
  kSparseIndices = 4,
  kKvPageTables =
      5,  // row 1 of [B, 2, max_pages] tables differs from row 0 (entry b * max_pages + i)
};
inline constexpr int kIndexCheckShift = 56;
inline constexpr unsigned long long kNoBadIndex = ~0ull;

}  // namespace mla::sm90
