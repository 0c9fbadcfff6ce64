// The balanced schedule's records in the workspace: what the plan kernel (schedule_kernel.cu)
// writes and the seesaw and few-rows kernels (tma/kv_pipeline.cuh, PartCursor) and the combine
// kernel read.
// Plain types, shared by host and device code (params.h holds pointers to them).
#pragma once

#include <cstdint>

namespace mla::sm90::schedule {

// Every request's 64-key blocks are laid end to end, each request preceded by
// kFixedBlocks blocks' worth of cost (its per-segment overhead: query tile, partial store,
// combine; 8 measured best, docs/sm90-seesaw.md, Work split), and the line is cut into num_parts
// equal runs of `part_blocks` positions (schedule_kernel.cu says how many); part k takes positions
// [k * part_blocks, (k + 1) * part_blocks). A request's piece in one part is a segment; segment i
// of request b writes partial rows [row_base + i * rows, row_base + (i + 1) * rows).
inline constexpr int kFixedBlocks = 8;
// Equal requests take the uniform split (schedule_kernel.cu) unless its runs are longer than the
// even share by more than this many percent (docs/sm90-seesaw.md, Work split).
inline constexpr int kUniformSlackPercent = 5;
inline constexpr int kMaxParts = 1024;

struct Request {
  int32_t pos;       // position of the request's first block on the line
  int32_t blocks;    // ceil(seq_len / 64): blocks of the request's last query token
  int32_t row_base;  // first partial row of its segment 0
  int32_t rows;      // n_b * H: partial rows per segment
};

// Where the combine finds query token `token`'s partials: rows base_row + s * stride + h,
// s < splits. The plan kernel lists only the tokens the combine merges, first in token order, then
// records with splits -1 up to T: a token of a one-segment request has no partials (the seesaw
// kernel writes its out and lse).
struct Token {
  int32_t base_row;
  int32_t stride;
  int32_t splits;  // 0: the request has no key (out 0, lse -inf); -1: past the list; never 1
  int32_t token;
};

}  // namespace mla::sm90::schedule
