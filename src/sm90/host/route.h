// The routing step of the sm90 backend: which decode kernel runs a call, with how many splits, in
// which workspace layout, and whether the combine kernel follows. workspace_size, plan and run
// each compute the route once, from the validated Problem, the device's SM count and the
// environment switches; nothing else in the backend decides. The route table, and why each call
// goes where it goes: docs/architecture.md.
#pragma once

#include <cstdint>

#include "host/problem.h"
#include "sm90/host/switches.h"
#include "sm90/params.h"

namespace mla::detail::sm90 {

// The decode kernel of a route.
enum class Kernel {
  kNone,     // no query token (B = 0 or T = 0): no decode kernel (the checked mode still checks)
  kSimt,     // decode/simt/: every call the TMA kernels do not take
  kFewRows,  // decode/few_rows/: TMA + wgmma, requests of at most 32 query rows (H x max_q_len),
             // on the balanced schedule (several requests) or uniform splits (one); sparse:
             // tokens of at most 32 heads
  kSeesaw,   // decode/seesaw/: TMA + wgmma, on the balanced schedule or the direct split; sparse:
             // uniform splits of tiles of 64 of a token's heads
};

// The workspace (bytes; every piece 256-byte aligned):
//   [0, 256)                       checked mode record: one uint64 key (IndexCheck), ~0 when clean
//   partial_max [N] fp32           running max of each partial row (-inf: the split saw no key)
//   partial_sum [N] fp32           sum of exp(s - max)
//   partial_o [N, L] out dtype     bmm2_scale * sum of exp(s - max) * v / sum (0 where sum is 0)
//   balanced schedule only (schedule/format.h): schedule::Request [B], schedule::Token [T] (the
//            tokens the combine merges), first request per part [parts] int32, positions per
//            part [1] int32
//   ordered sparse calls only: the tokens by decreasing counted blocks [T] int32
// with N partial rows: S x T x H in the uniform layout [S, T, H] (S = splits) of the SIMT kernel,
// the few-rows kernel on one request and the seesaw kernel's direct split, and at most T x H +
// (parts - 1) x max_q_len x H on the balanced schedule. One split writes no partial row: the decode
// kernel writes out and lse itself. On the schedule only requests of two or more segments have
// partial rows (schedule_kernel.cu), and each such request spans at least one of the parts - 1 part
// boundaries, which each cut one request: at most 2 (parts - 1) segments of at most max_q_len x H
// rows, and never more than T x H + (parts - 1) x max_q_len x H. T query tokens, H heads,
// L = 512.
struct Layout {
  int64_t splits = 1;      // splits per query token of the uniform layout
  int64_t rows = 0;        // partial rows
  bool scheduled = false;  // the balanced schedule (seesaw, few-rows): plan() writes it
  bool direct = false;     // the seesaw kernel's direct split (uniform layout, no schedule)
  int64_t parts = 0;       // parts of the balanced schedule
  int64_t max_offset = 0, sum_offset = 0, o_offset = 0;
  int64_t requests_offset = 0, tokens_offset = 0, part_first_offset = 0, part_blocks_offset = 0;
  // A sparse call of one split over more than one wave of (token, tile) CTAs: the tokens' order
  // (params.h, sparse_order), written by run() before the decode kernel. 0: none.
  int64_t order_offset = 0;
  int64_t bytes = 0;
};

struct Route {
  Kernel kernel = Kernel::kNone;
  Layout layout;
  // The decode kernel writes partials and the combine kernel merges them into out and lse; false:
  // one split (uniform layout), where the decode kernel writes out and lse itself.
  bool combine = false;
  int few_rows = 0;  // kFewRows: padded query rows per CTA (the GEMM N), 16 or 32
  // kFewRows, per-tensor e4m3 cache: the GEMMs read the e4m3 blocks as they land (64-byte-swizzled
  // boxes; sparse calls: rows gathered as they are into the same layout): both on the FP8 tensor
  // cores with an e4m3 query, fp16 GEMMs with the cache widened in registers with a bf16 query
  // (docs/sm90-fp8.md); false: widened in shared memory. Sparse, 16 rows, fp8_ds_mla cache: the
  // rows land as they are too, for the same fp16 GEMMs per latent group with the keys' scales on
  // the scores and on P (docs/sm90-sparse.md); false: gathered a block ahead and widened by the
  // producer.
  // kSeesaw, dense, e4m3 query and cache: the FP8 seesaw kernel (seesaw_fp8_kernel.cuh, both
  // GEMMs on the FP8 tensor cores), on the balanced schedule, or on the direct split where each
  // split holds enough blocks; false: the seesaw kernel over the cache widened in shared memory.
  bool fp8_direct = false;
  // kFewRows, fp8_direct, e4m3 query and cache: the e4m3 blocks on four stages instead of two,
  // where a CTA is expected to hold at least kFewRowsDeepMinBlocks blocks (route.cc); short
  // segments keep two (docs/sm90-fp8.md).
  bool few_rows_deep = false;
  // kFewRows, fp8_direct, bf16 query over a per-tensor e4m3 cache, 16 rows: three consumer
  // warpgroups instead of two, each a stage of its own, where a CTA is expected to hold at least
  // kFewRowsThreeMinBlocks blocks (route.cc; docs/sm90-fp8.md).
  bool few_rows_three = false;
  // kFewRows, sparse, 16 rows, two splits a token: the two run as a cluster of two, and the
  // first writes the token's out and lse, merging the second's partial; no combine kernel
  // (few_rows_kernel.cuh, kPairMerge; MLA_SM90_SPARSE_PAIR_MERGE=0 keeps the combine).
  bool pair_merge = false;
  // kSeesaw, fp8_direct, balanced schedule: the FP8 seesaw kernel with three consumer warpgroups
  // (seesaw_fp8_three_kernel.cuh), unless MLA_SM90_FP8_THREE=0 (Switches::fp8_three).
  bool fp8_three = false;
  int tiles = 0;  // kSeesaw: query-row tiles of 64 per request (the grid's x); sparse: per token
  // kFewRows, kSeesaw: a sparse call, one tile per query token, its blocks gathered by index
  // (tma/gather.cuh), on uniform splits.
  bool sparse = false;
  // kSeesaw, sparse, one split: the grid's token rows (DecodeKernelParams::sparse_rows; 0, the
  // default: one row per token). MLA_SM90_SPARSE_ROWS=N: N rows whose CTAs walk several tokens
  // each (docs/sm90-sparse.md, A persistent grid).
  int64_t sparse_rows = 0;
  // kSeesaw, sparse, fp8_ds_mla rows, unpaired, one token per CTA row: each split holds fewer than
  // seesaw::kAheadMinBlocks of top_k's blocks, and gathers on the landing path rather than loading
  // its rows a block ahead (seesaw_kernel.cuh, kShortSplits).
  bool short_splits = false;
  // kSeesaw, balanced schedule: tiles 2k and 2k + 1 of a request run as a cluster of two that
  // loads each K block once for both (docs/sm90-seesaw.md, Pairs).
  bool pair = false;
  // kSeesaw, balanced schedule, 16-bit cache, unpaired and uncleaned, two or more tiles a request,
  // parts of at most 96 blocks: the cache boxes carry the evict-first L2 policy (the direct
  // split's always do), which keeps the partials the combine reads back in L2 (docs/sm90-seesaw.md,
  // the direct split). A request of one tile, bound by its bytes, measured 2 to 4% slower with it.
  bool evict_first = false;
  // kSeesaw: rows of a tile attend the request's draft keys unequally (a custom mask, or tiles
  // that span two tokens); the kernel keeps a non-finite draft key from the rows that do not
  // attend it.
  bool clean = false;
  int64_t schedule_fixed_blocks = 0;  // the plan kernel's fixed cost per request, in blocks
};

// What a route needs to know of the device.
struct DeviceFacts {
  int sm_count = 0;
  // Clusters of two CTAs of the paired seesaw kernel (query and kv_cache of type `e`) that the
  // device holds at once; asked only of a call that would pair.
  int (*pair_clusters)(::mla::sm90::Elem e) = nullptr;
};

// The kernels' element type of a validated call's query or plain kv_cache dtype.
::mla::sm90::Elem elem_of(DataType t);

// The route of a validated call.
Route route_of(const Problem& problem, const DeviceFacts& device, const Switches& switches);

// The same on the problem's device (which must be current: the entry points hold a DeviceGuard)
// with the process's switches.
Route route_of(const Problem& problem);

// The route of a call whose data addresses or kv_cache tensor map turned out unfit for TMA at
// run time (a route reads shapes and strides, not addresses): the SIMT kernel in the same
// workspace, reading no schedule. A call laid out for the balanced schedule has no uniform partial
// rows: it runs as one split, and so does a call of head dims other than (512, 64) (the SIMT
// kernel writes no partial row of those).
Route simt_fallback(Route route, const Problem& problem);

}  // namespace mla::detail::sm90
