// The routing step of the sm90 backend (route.h): kernel, splits, workspace layout, pairing.
// The route table, and why: docs/architecture.md; each kernel's own page in docs/ says how it
// splits its work.
#include "sm90/host/route.h"

#include <algorithm>
#include <climits>

#include "sm90/decode/few_rows/launch.h"
#include "sm90/decode/schedule/format.h"
#include "sm90/decode/seesaw/launch.h"
#include "sm90/decode/simt/launch.h"
#include "sm90/decode/tma/tensor_map.h"
#include "sm90/host/device.h"
#include "sm90/host/limits.h"

namespace mla::detail::sm90 {
namespace {

using ::mla::sm90::Elem;
namespace schedule = ::mla::sm90::schedule;
namespace tma = ::mla::sm90::tma;

constexpr int64_t kAlign = 256;
constexpr int64_t kMinKeysPerSplit = 256;  // SIMT kernel: a split handles at least this many keys
constexpr int64_t kSimtMaxSplits = 64;
constexpr int64_t kMaxSplits = 128;  // uniform splits per query token (any kernel)
static_assert(kMaxSplits <= ::mla::sm90::kMaxSplits, "the combine kernel's capacity");
static_assert(kAlign == ::mla::sm90::kCheckRecordBytes, "the checked mode's record");

// The seesaw kernel pairs tiles on the balanced schedule from this many tiles per request up:
// below that, and on the direct split at any tile count, the two CTAs' lockstep cost more than
// the halved L2 traffic gave (docs/sm90-seesaw.md, Pairs).
constexpr int64_t kPairMinTiles = 6;
// The balanced schedule's evict-first instantiation (Route::evict_first) where the parts hold at
// most this many blocks each (batch x max_seq_len's blocks over the parts): at 31 to 62 blocks a
// part it measured 0.7 to 2.3% faster, at 124 to 496 within 0.4% either way (docs/perf-notes.md,
// Change 87).
constexpr int64_t kEvictFirstPartBlocks = 96;
// The fewest blocks per split at which a call of one request (the direct split) with an e4m3
// query over an e4m3 cache runs the FP8 seesaw kernel rather than the seesaw kernel over the cache
// widened in shared memory (docs/perf-notes.md, Change 120: one block a split is the widened
// kernel's by ~1%, two blocks the FP8 kernel's by ~5%).
constexpr int64_t kFp8SeesawMinBlocks = 2;
// The fewest blocks a CTA is expected to hold (from max_seq_len, or top_k for a sparse call: no
// host read of seq_lens) at which the few-rows kernel's e4m3 GEMMs run on four stages
// (Route::few_rows_deep): with ~8 blocks a CTA four measured 0.6 to 0.8 us slower a call, with 16
// (sparse) 1% slower and 15.5 (dense, 32 rows) 1.6% faster, from 32 up 4 to 10% faster
// (docs/perf-notes.md, Change 132).
constexpr int64_t kFewRowsDeepMinBlocks = 24;
// The fewest blocks a CTA is expected to hold (as above) at which a few-rows call of a bf16 query
// over a per-tensor e4m3 cache at 16 rows runs three consumer warpgroups
// (Route::few_rows_three): dense, at 8 blocks a CTA three measured +1.6% (B8 H16) and -0.7% (B1
// s65536 H16), at 2 +1.5%, at 16 -0.6%, at 62 to 125 -4 to -6% (docs/perf-notes.md, Change 134);
// sparse calls take the same rule (Change 138).
constexpr int64_t kFewRowsThreeMinBlocks = 12;
// The bound (exclusive) on the blocks a CTA is expected to hold below which a sparse call's
// fp8_ds_mla rows take three consumers by the rule above: against two, B64 H16 at 16 blocks a
// CTA measured -3.0%, at 20 -1.0%, B128 H16 at 32 +0.6%, B64 H32 (two tiles of 16 heads a token,
// each CTA gathering the same rows) at 32 +3.9%; at 24 and 32 blocks (B64 H16, top_k 3072 and
// 4096) three forced -1.1% and -0.5%; with sparse_topk_lens of mean 1024 (8 blocks a CTA on
// average) +2.8% (docs/perf-notes.md, Change 139). Tokens of more than one tile keep two.
constexpr int64_t kFewRowsThreeDsMaxBlocks = 24;

int64_t align_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Query-row tiles of the TMA kernels' grids per request: ceil(max_q_len * H / 64).
int64_t tiles_of(const Problem& p) { return ceil_div(p.max_q_len * p.num_heads, tma::kTileRows); }

// Head dims (L, R) the TMA and gather kernels take: (512, 64), and (256, 64) and (512, 0) in the
// same 512 + 64 column tiles, zero where the call's rows have no column (params.h).
bool tile_dims_ok(const Problem& p) {
  return (p.L == kKvLoraRank && (p.R == kRopeHeadDim || p.R == 0)) ||
         (p.L == kKvLoraRank / 2 && p.R == kRopeHeadDim);
}

// The shape part of the TMA kernels' conditions (the rest, data addresses and the tensor map, is
// checked at run time; a call that fails it runs the SIMT kernel with this route's split count,
// which the SIMT kernel accepts).
bool tma_shape_ok(const Problem& p, const Switches& sw) {
  if (sw.kernel == Switches::Kernel::kSimt || p.sparse || !tile_dims_ok(p)) return false;
  // fp8_ds_mla (bf16 query): gathered by position, widened with its scales (tma/gather.cuh); any
  // page size, its offsets within 64 GiB.
  const bool ds_mla = p.kv_format == KvFormat::kFp8DsMla;
  if (ds_mla && (p.L != kKvLoraRank || p.R != kRopeHeadDim || p.q_dtype != dtype::kBFloat16 ||
                 p.num_pages * p.kv_page_stride > (int64_t{1} << 36))) {
    return false;
  }
  const bool bf16 = p.q_dtype == dtype::kBFloat16 && p.kv_dtype == dtype::kBFloat16 && !ds_mla;
  const bool fp16 = p.q_dtype == dtype::kFloat16 && p.kv_dtype == dtype::kFloat16;
  // e4m3 caches are widened to 16 bits in shared memory (docs/sm90-fp8.md).
  const bool fp8_cache = p.kv_dtype == dtype::kFloat8E4M3 &&
                         (p.q_dtype == dtype::kBFloat16 || p.q_dtype == dtype::kFloat8E4M3);
  if (!bf16 && !fp16 && !fp8_cache && !ds_mla) return false;
  if (!ds_mla && (p.page_size < kMinTmaPageSize || p.page_size > kMaxPageSize)) return false;
  // 16-byte-aligned strides: TMA (kv rows and pages) and vector loads (query rows).
  const int64_t kv_vec = 128 / p.kv_dtype.bits, q_vec = 128 / p.q_dtype.bits;
  if (p.kv_row_stride % kv_vec != 0 || p.kv_page_stride % kv_vec != 0) return false;
  if (p.q.batch % q_vec != 0 || p.q.token % q_vec != 0 || p.q.head % q_vec != 0) return false;
  if (p.batch > 65535) return false;  // grid.y
  // Ragged queries without a tight max_q_len: the (tile, request) grid would be mostly empty.
  const int64_t tiles = tiles_of(p);
  if (p.batch * tiles > 4 * ceil_div(p.num_tokens * p.num_heads, tma::kTileRows) + p.batch) {
    return false;
  }
  return true;
}

// The shape part of the gather kernels' conditions for a sparse call (tma/gather.cuh: the few-rows
// and seesaw kernels with their blocks gathered by index; any page size): tile_dims_ok, the
// (query, kv_cache) pairs of tma::Formats with fp8_ds_mla, 16-byte-aligned cache rows and query
// vectors (the rest, the data addresses, is checked at run time as for TMA).
bool sparse_shape_ok(const Problem& p, const Switches& sw) {
  if (sw.kernel == Switches::Kernel::kSimt || !p.sparse || !tile_dims_ok(p)) return false;
  const bool ds_mla = p.kv_format == KvFormat::kFp8DsMla;
  if (ds_mla && (p.L != kKvLoraRank || p.R != kRopeHeadDim)) return false;
  const bool bf16 = p.q_dtype == dtype::kBFloat16 && p.kv_dtype == dtype::kBFloat16 && !ds_mla;
  const bool fp16 = p.q_dtype == dtype::kFloat16 && p.kv_dtype == dtype::kFloat16;
  const bool fp8_cache = p.kv_dtype == dtype::kFloat8E4M3 &&
                         (p.q_dtype == dtype::kBFloat16 || p.q_dtype == dtype::kFloat8E4M3);
  if (!bf16 && !fp16 && !fp8_cache && !(ds_mla && p.q_dtype == dtype::kBFloat16)) return false;
  const int64_t kv_bytes = p.kv_dtype.bits / 8, q_vec = 128 / p.q_dtype.bits;
  if (p.kv_row_stride * kv_bytes % 16 != 0 || p.kv_page_stride * kv_bytes % 16 != 0) return false;
  if (p.q.batch % q_vec != 0 || p.q.token % q_vec != 0 || p.q.head % q_vec != 0) return false;
  // The gather holds a row's offset in 16-byte units in 32 bits (tma::slot_row16): 64 GiB.
  if (p.num_pages * p.kv_page_stride * kv_bytes > (int64_t{1} << 36)) return false;
  return p.num_tokens <= 65535;  // grid.y
}

// Parts of the balanced schedule: one CTA per SM for each query-row tile of a request.
int64_t schedule_parts(const Problem& p, int sms) {
  const int64_t parts = sms / tiles_of(p);
  return std::clamp<int64_t>(parts, 1,
                             std::min<int64_t>(::mla::sm90::kMaxSplits, schedule::kMaxParts));
}

// Whether the balanced schedule's int32 positions and partial rows hold the call.
bool schedule_fits(const Problem& p, int sms, int64_t fixed_blocks) {
  const int64_t max_blocks = ceil_div(p.max_seq_len, ::mla::sm90::kBlockKeys);
  const int64_t positions = p.batch * (max_blocks + fixed_blocks);
  const int64_t rows = (p.num_tokens + schedule_parts(p, sms) * p.max_q_len) * p.num_heads;
  // NOTE: half the int32 range: a part's end (parts x positions per part) may pass the total by
  // the 10% whole-request rounding of schedule_kernel.cu.
  return positions < INT32_MAX / 2 && rows < INT32_MAX;
}

// Which kernel family takes the call, from its shapes (the split count depends on it, the
// workspace cap does not change it).
struct Family {
  bool tma = false;        // the TMA kernels' shape conditions hold
  bool few_rows = false;   // ... and the few-rows kernel takes it
  bool seesaw = false;     // ... or the seesaw kernel
  bool direct = false;     // the seesaw kernel's direct split (a call of one request)
  bool scheduled = false;  // the balanced schedule (seesaw, or few-rows with several requests)
  bool sparse = false;     // a sparse call on the gather kernels (uniform splits, tiles per token)
};

Family family_of(const Problem& p, int sms, const Switches& sw) {
  Family f;
  if (p.num_tokens == 0) return f;  // no decode kernel
  if (p.sparse) {
    // One tile per query token (its heads: a token's entries are its own): the few-rows kernel up
    // to few_rows::kMaxRows heads, the seesaw kernel above, both on uniform splits.
    f.tma = f.sparse = sparse_shape_ok(p, sw);
    // NOTE: fp8_ds_mla rows at 17..32 heads take the few-rows kernel in tiles of 16 heads, read as
    // they land (sparse_few_rows_tiles); with that route off (MLA_SM90_DS_DIRECT=0) the seesaw
    // kernel: the few-rows kernel's 32-row tiles over rows widened by its producer ran 8 to 30%
    // slower than one seesaw tile (docs/sm90-sparse.md, Tiles and splits).
    f.few_rows = f.tma && p.num_heads <= ::mla::sm90::few_rows::kMaxRows &&
                 !(p.kv_format == KvFormat::kFp8DsMla && p.num_heads > 16 && !sw.ds_direct) &&
                 sw.kernel != Switches::Kernel::kSeesaw;
    f.seesaw = f.tma && !f.few_rows;
    return f;
  }
  f.tma = tma_shape_ok(p, sw);
  // The few-rows kernel takes requests of at most few_rows::kMaxRows query rows (H x max_q_len).
  // NOTE: there the seesaw kernel's 64-row tiles are mostly padding; the few-rows kernel does a
  // quarter to a half of its tensor work (docs/sm90-few-rows.md).
  f.few_rows = f.tma && p.max_q_len * p.num_heads <= ::mla::sm90::few_rows::kMaxRows &&
               sw.kernel != Switches::Kernel::kSeesaw;
  // The seesaw kernel takes every other call the TMA kernels take, within the schedule's int32
  // positions and partial rows.
  f.seesaw = f.tma && !f.few_rows && schedule_fits(p, sms, sw.schedule_fixed_blocks);
  // Its direct split: a call of one request runs split_count() equal runs of its blocks per
  // query-row tile in the uniform layout, without the plan kernel (docs/sm90-seesaw.md).
  f.direct = f.seesaw && sw.direct_split && p.batch == 1;
  // The balanced schedule: the seesaw kernel's calls but the direct split, and the few-rows
  // kernel's calls of several requests (one query-row tile each; uniform splits, cut from the
  // longest request, leave SMs idle behind the long requests of a batch of mixed lengths).
  f.scheduled = (f.seesaw && !f.direct) || (f.few_rows && p.batch > 1 && sw.few_rows_schedule &&
                                            schedule_fits(p, sms, sw.schedule_fixed_blocks));
  return f;
}

// The few-rows kernel's query-row tiles per token of a sparse call: one of 16 or 32 rows, or for
// fp8_ds_mla (read as it lands at 16 rows only) tiles of 16 heads, each CTA gathering the same
// rows (docs/sm90-sparse.md, Tiles and splits).
int64_t sparse_few_rows_tiles(const Problem& p) {
  return p.kv_format == KvFormat::kFp8DsMla ? ceil_div(p.num_heads, 16) : 1;
}

// A sparse call's (token, tile) CTAs per split: the few-rows kernel's tiles, tiles of 64 heads on
// the seesaw kernel.
int64_t sparse_ctas(const Problem& p, const Family& f) {
  return p.num_tokens *
         (f.few_rows ? sparse_few_rows_tiles(p) : ceil_div(p.num_heads, tma::kTileRows));
}

// Upper bound of the splits per query token, from shapes and the SM count only.
// SIMT kernel: enough CTAs for two waves, at least kMinKeysPerSplit keys per split, at most
// kSimtMaxSplits. TMA kernels (one CTA per SM): as many splits as fit one wave of (tile, request)
// CTAs, at least one 64-key block per split (two for the few-rows kernel). Either way the count is
// then lowered to the fewest splits that keep the same blocks per split for the longest request,
// so that no split of it is left empty (an empty split still costs the combine a partial).
int64_t split_count(const Problem& p, const Family& f, int sms, int64_t max_splits, int64_t cap) {
  if (p.num_tokens == 0) return 1;
  int64_t splits = 1, max_blocks = 1;
  if (f.sparse) {
    // One CTA per (token, tile of 64 heads), its keys the token's counted entries.
    const int64_t ctas = sparse_ctas(p, f);
    max_blocks = std::max<int64_t>(
        1, ceil_div(std::min<int64_t>(p.top_k, p.max_seq_len), ::mla::sm90::kBlockKeys));
    const int64_t min_blocks = f.few_rows ? 2 : 1;
    splits =
        std::clamp<int64_t>(sms / ctas, 1, std::min(ceil_div(max_blocks, min_blocks), kMaxSplits));
  } else if (f.tma) {
    const int64_t ctas = p.batch * tiles_of(p);
    max_blocks = std::max<int64_t>(1, ceil_div(p.max_seq_len, ::mla::sm90::kBlockKeys));
    // NOTE: the few-rows kernel's two consumers take alternate blocks: a split of one block
    // leaves one of them idle (B1 s8192 H16: 64 splits of 2 blocks 15.3 us, 128 of 1 15.9 us).
    const int64_t min_blocks = f.few_rows ? 2 : 1;
    splits =
        std::clamp<int64_t>(sms / ctas, 1, std::min(ceil_div(max_blocks, min_blocks), kMaxSplits));
  } else {
    const int64_t head_groups = ceil_div(p.num_heads, ::mla::sm90::simt::kHeadsPerCta);
    const int64_t want = ceil_div(2 * sms, p.num_tokens * head_groups);
    const int64_t key_bound = p.sparse ? std::min<int64_t>(p.top_k, p.max_seq_len) : p.max_seq_len;
    const int64_t key_cap = std::max<int64_t>(1, ceil_div(key_bound, kMinKeysPerSplit));
    splits = std::clamp<int64_t>(want, 1, std::min(key_cap, kSimtMaxSplits));
    max_blocks = std::max<int64_t>(1, ceil_div(key_bound, ::mla::sm90::kBlockKeys));
  }
  if (max_splits > 0) splits = std::min(splits, max_splits);
  splits = std::max<int64_t>(1, std::min(splits, cap));
  return ceil_div(max_blocks, ceil_div(max_blocks, splits));
}

// The layout with at most `cap` splits (parts of the balanced schedule).
Layout layout_with(const Problem& p, const Family& f, int sms, const Switches& sw, int64_t cap) {
  Layout l;
  if (p.batch == 0) return l;
  l.splits = split_count(p, f, sms, sw.max_splits, cap);
  l.direct = p.num_tokens > 0 && f.direct;
  l.scheduled = p.num_tokens > 0 && f.scheduled;
  int64_t rows = 0;
  if (l.scheduled) {
    l.parts = std::min(schedule_parts(p, sms), cap);
    const int64_t cut = l.parts - 1;
    rows = std::min(p.num_tokens + cut * p.max_q_len, 2 * cut * p.max_q_len) * p.num_heads;
  } else if (l.splits > 1) {
    rows = l.splits * p.num_tokens * p.num_heads;
  }
  l.rows = rows;
  l.max_offset = kAlign;  // after the checked mode's record
  l.sum_offset = l.max_offset + align_up(rows * 4);
  l.o_offset = l.sum_offset + align_up(rows * 4);
  // NOTE: 512 columns whatever L is: partial rows hold the TMA kernels' whole tile width (a
  // call of other head dims on the SIMT kernel runs one split: no partial row).
  l.bytes = l.o_offset + align_up(rows * kKvLoraRank * 2);  // bf16 or fp16: the out type
  // A sparse call with sparse_topk_lens, of one split, whose (token, tile) CTAs are more than one
  // wave: started longest first (params.h, sparse_order; docs/sm90-sparse.md, Varied lens).
  // NOTE: not without lens: the order kernel costs a launch and its two passes (it took ~7 us at
  // B 128 H 128 without PDL, ~4.5 us less since its prefix sums run in one warp), and counts then
  // differ only where a request is shorter than top_k.
  if (f.sparse && l.splits == 1 && sparse_ctas(p, f) > sms &&
      p.topk_lens_mode != TopkLensMode::kNone) {
    l.order_offset = l.bytes;
    l.bytes = l.order_offset + align_up(p.num_tokens * 4);
  }
  if (l.scheduled) {
    l.requests_offset = l.bytes;
    l.tokens_offset = l.requests_offset + align_up(p.batch * sizeof(schedule::Request));
    l.part_first_offset = l.tokens_offset + align_up(p.num_tokens * sizeof(schedule::Token));
    l.part_blocks_offset = l.part_first_offset + align_up(l.parts * 4);
    l.bytes = l.part_blocks_offset + kAlign;
  }
  return l;
}

// Where the preferred split's partials do not fit the workspace cap, the splits (parts) halve
// until they do. One split (one part) writes no partial row, so the loop ends.
Layout layout_of(const Problem& p, const Family& f, int sms, const Switches& sw) {
  // NOTE: the SIMT kernel runs head dims other than (512, 64) in one split: its partial rows would
  // be L wide, the combine's are 512.
  int64_t cap = f.tma || (p.L == kKvLoraRank && p.R == kRopeHeadDim)
                    ? std::max<int64_t>(kMaxSplits, schedule::kMaxParts)
                    : 1;
  Layout l = layout_with(p, f, sms, sw, cap);
  // The contract caps the workspace at 128 MiB (FlashInfer's documented buffer): Switches.
  while (l.bytes > sw.workspace_cap && cap > 1) {
    cap /= 2;
    l = layout_with(p, f, sms, sw, cap);
  }
  return l;
}

// The element type of a call the TMA kernels take (query and kv_cache alike).
Elem tma_elem(DataType t) { return t == dtype::kBFloat16 ? Elem::kBf16 : Elem::kFp16; }

int pair_clusters(Elem e) {
  return e == Elem::kBf16 ? ::mla::sm90::seesaw::pair_clusters_resident<Elem::kBf16>()
                          : ::mla::sm90::seesaw::pair_clusters_resident<Elem::kFp16>();
}

}  // namespace

Elem elem_of(DataType t) {
  if (t == dtype::kBFloat16) return Elem::kBf16;
  if (t == dtype::kFloat16) return Elem::kFp16;
  return Elem::kFp8E4M3;  // validate() admits no other dtype on this backend
}

Route route_of(const Problem& p, const DeviceFacts& device, const Switches& sw) {
  const int sms = device.sm_count;
  const Family f = family_of(p, sms, sw);
  Route r;
  r.layout = layout_of(p, f, sms, sw);
  r.schedule_fixed_blocks = sw.schedule_fixed_blocks;
  if (p.num_tokens == 0) return r;  // kNone
  if (f.few_rows) {
    r.kernel = Kernel::kFewRows;
    r.sparse = f.sparse;
    const int64_t rows = f.sparse ? ceil_div(p.num_heads, sparse_few_rows_tiles(p))
                                  : p.max_q_len * p.num_heads;  // per tile
    r.few_rows = rows <= 16 ? 16 : 32;
    // An e4m3 cache is read by the GEMMs as it lands (e4m3 query: the FP8 tensor cores; bf16
    // query: widened in registers), not widened in shared memory (docs/sm90-fp8.md); sparse calls
    // gather its rows as they are (tma::gather_e4m3_direct; docs/sm90-sparse.md).
    r.fp8_direct =
        sw.fp8_direct && p.kv_dtype == dtype::kFloat8E4M3 && p.kv_format == KvFormat::kPlain;
    // A sparse call's fp8_ds_mla rows (16 rows: family_of) land as they are too: the latent
    // groups' GEMMs take their scales on the scores and on P (docs/sm90-sparse.md, fp8_ds_mla rows
    // read as they land).
    if (f.sparse && p.kv_format == KvFormat::kFp8DsMla && sw.ds_direct) {
      r.fp8_direct = true;
    }
    // The blocks a CTA is expected to hold.
    const int64_t keys = f.sparse ? std::min<int64_t>(p.top_k, p.max_seq_len) : p.max_seq_len;
    const int64_t request_blocks = ceil_div(std::max<int64_t>(1, keys), ::mla::sm90::kBlockKeys);
    const int64_t cta_blocks = r.layout.scheduled
                                   ? ceil_div(p.batch * request_blocks, r.layout.parts)
                                   : ceil_div(request_blocks, r.layout.splits);
    // The e4m3 GEMMs' ring: four stages where a CTA's blocks are many, two where its segments are
    // short (kFewRowsDeepMinBlocks).
    if (r.fp8_direct && p.q_dtype == dtype::kFloat8E4M3 && p.kv_dtype == dtype::kFloat8E4M3) {
      r.few_rows_deep =
          sw.few_rows_deep >= 0 ? sw.few_rows_deep == 1 : cta_blocks >= kFewRowsDeepMinBlocks;
    }
    // A bf16 query over it at 16 rows (dense, or a sparse call's tile of 16 heads): three
    // consumers, whose chains bound the block rate, where a CTA holds enough blocks for the third
    // (kFewRowsThreeMinBlocks).
    // A sparse call's fp8_ds_mla rows the same, but only for one tile a token, below
    // kFewRowsThreeDsMaxBlocks blocks a CTA and without sparse_topk_lens (whose CTAs hold fewer
    // blocks than top_k says).
    const bool ds_rows = f.sparse && p.kv_format == KvFormat::kFp8DsMla;
    if (r.fp8_direct && r.few_rows == 16 && p.q_dtype == dtype::kBFloat16 &&
        ((p.kv_dtype == dtype::kFloat8E4M3 && p.kv_format == KvFormat::kPlain) || ds_rows)) {
      r.few_rows_three = sw.few_rows_three >= 0
                             ? sw.few_rows_three == 1
                             : cta_blocks >= kFewRowsThreeMinBlocks &&
                                   (!ds_rows || (cta_blocks < kFewRowsThreeDsMaxBlocks &&
                                                 sparse_few_rows_tiles(p) == 1 &&
                                                 p.topk_lens_mode == TopkLensMode::kNone));
    }
    // A sparse call of two splits a token at 16 rows: the two as a cluster of two, the first
    // merging the second's partial, so that no combine kernel runs (its launch was 3.2 to 3.6 us
    // of the B64 H16 calls; docs/perf-notes.md, "What the combine's launch costs a call"). Any
    // number of waves: the device must run clusters of two at all.
    // It runs on two consumers (the three-consumer form spilled in its block loop with it), and
    // is preferred to three where both apply; MLA_SM90_FEW_ROWS_THREE=1 keeps three, unmerged.
    r.pair_merge = f.sparse && r.few_rows == 16 && r.layout.splits == 2 && sw.sparse_pair_merge &&
                   sw.few_rows_three != 1 && device.pair_clusters(tma_elem(p.q_dtype)) > 0;
    if (r.pair_merge) r.few_rows_three = false;
  } else if (f.sparse && f.seesaw) {
    r.kernel = Kernel::kSeesaw;
    r.sparse = true;
    r.tiles = static_cast<int>(ceil_div(p.num_heads, tma::kTileRows));  // per token
    // The two tiles of a token over e4m3 rows (per-tensor fp8, fp8_ds_mla) run as a cluster of
    // two whose producers each gather and widen half of every block's rows for both CTAs
    // (tma::gather_ahead_blocks; docs/sm90-sparse.md, Pairs). Any number of waves: the sparse grid
    // assumes none, but the device must run clusters of two at all.
    const bool e4m3_rows = p.kv_format == KvFormat::kFp8DsMla || p.kv_dtype == dtype::kFloat8E4M3;
    r.pair =
        r.tiles == 2 && e4m3_rows && sw.pair != 0 && device.pair_clusters(tma_elem(p.q_dtype)) > 0;
    // One split: a row of CTAs per token (sparse_rows 0). MLA_SM90_SPARSE_ROWS=N runs N token
    // rows whose CTAs walk several tokens each, their ring carried from one to the next
    // (docs/sm90-sparse.md, A persistent grid); not the default: that instantiation spills and
    // was slower on every row measured (B128 H128 fp8_ds_mla +8%, B256 H64 +22%).
    if (r.layout.splits == 1 && sw.sparse_rows > 0 && sw.sparse_rows < p.num_tokens) {
      r.sparse_rows = sw.sparse_rows;
    }
    // Unpaired fp8_ds_mla rows, one token per CTA row: splits of few blocks take the landing path.
    // NOTE: top_k's blocks, not those of min(top_k, max_seq_len): contexts shorter than top_k ran
    // 8 to 24% slower on the landing path (B128 H64 at 256 to 768 keys, B64 H64 at 512;
    // docs/perf-notes.md, Change 109).
    if (p.kv_format == KvFormat::kFp8DsMla && !r.pair && r.sparse_rows == 0) {
      const int64_t blocks = ceil_div(std::max<int64_t>(1, p.top_k), ::mla::sm90::kBlockKeys);
      r.short_splits = ceil_div(blocks, r.layout.splits) < ::mla::sm90::seesaw::kAheadMinBlocks;
    }
  } else if (r.layout.scheduled || r.layout.direct) {
    r.kernel = Kernel::kSeesaw;
    r.tiles = static_cast<int>(tiles_of(p));
    r.clean = p.has_mask || (p.max_q_len > 1 && p.num_heads % tma::kTileRows != 0);
    // Tiles 2k and 2k + 1 of every request cover the same query tokens (one token per tile pair
    // at H = 128; one token at max_q_len 1), so their blocks and key ranges are the same. Paired
    // only on the balanced schedule, without cleaning, and where the device holds the whole grid
    // (tiles x parts) in clusters of two at once, as the one-wave schedule assumes.
    const bool allowed =
        r.tiles % 2 == 0 && (p.num_heads == 2 * tma::kTileRows || p.max_q_len == 1);
    const bool wanted = sw.pair >= 0 ? sw.pair == 1 : r.tiles >= kPairMinTiles;
    // NOTE: fp8 caches run unpaired: the widening warps of each CTA would need the other CTA's
    // boxes too (docs/sm90-fp8.md).
    r.pair = allowed && wanted && r.layout.scheduled && !r.clean &&
             p.kv_dtype != dtype::kFloat8E4M3 && p.kv_format == KvFormat::kPlain &&
             r.tiles * r.layout.parts <= 2LL * device.pair_clusters(tma_elem(p.q_dtype));
    // The cache evict-first where a part's run is short against the partials it leaves (at most
    // kEvictFirstPartBlocks blocks a part, from max_seq_len: no host read of seq_lens).
    const int64_t request_blocks =
        ceil_div(std::max<int64_t>(1, p.max_seq_len), ::mla::sm90::kBlockKeys);
    r.evict_first = sw.kv_evict_first && r.layout.scheduled && !r.pair && !r.clean &&
                    r.tiles >= 2 && p.kv_format == KvFormat::kPlain &&
                    ::mla::sm90::seesaw::has_evict_first(elem_of(p.q_dtype), elem_of(p.kv_dtype)) &&
                    p.batch * request_blocks <= kEvictFirstPartBlocks * r.layout.parts;
    // An e4m3 query over an e4m3 cache: the FP8 seesaw kernel, both GEMMs on the FP8 tensor
    // cores (docs/sm90-fp8.md). On the direct split only where each split holds enough blocks:
    // the FP8 kernel's longer chain per block is exposed where a CTA has few of them, and the
    // seesaw kernel over the cache widened in shared memory is faster there.
    const int64_t blocks = ceil_div(
        std::max<int64_t>(1, ceil_div(p.max_seq_len, ::mla::sm90::kBlockKeys)), r.layout.splits);
    const int64_t min_blocks =
        sw.fp8_seesaw_min_blocks > 0 ? sw.fp8_seesaw_min_blocks : kFp8SeesawMinBlocks;
    r.fp8_direct = sw.fp8_direct && (r.layout.scheduled || blocks >= min_blocks) &&
                   p.q_dtype == dtype::kFloat8E4M3 && p.kv_dtype == dtype::kFloat8E4M3 &&
                   p.kv_format == KvFormat::kPlain;
    // Its three-consumer form on the balanced schedule, where asked for (Switches::fp8_three).
    r.fp8_three = r.fp8_direct && r.layout.scheduled && sw.fp8_three;
  } else {
    r.kernel = Kernel::kSimt;
  }
  // One split of the uniform layout: the decode kernel writes out and lse, no combine; nor where
  // a token's two splits merge in their cluster.
  r.combine = (r.layout.scheduled || r.layout.splits > 1) && !r.pair_merge;
  return r;
}

Route route_of(const Problem& p) {
  DeviceFacts device;
  // A call without query tokens launches no decode kernel: its route needs no device fact.
  if (p.num_tokens > 0) device.sm_count = sm_count(p.device.device_id);
  device.pair_clusters = &pair_clusters;
  return route_of(p, device, switches());
}

Route simt_fallback(Route r, const Problem& p) {
  if (r.layout.scheduled || p.L != kKvLoraRank || p.R != kRopeHeadDim) r.layout.splits = 1;
  r.layout.scheduled = r.layout.direct = false;
  r.kernel = Kernel::kSimt;
  r.few_rows = 0;
  r.fp8_direct = false;
  r.few_rows_deep = false;
  r.few_rows_three = false;
  r.tiles = 0;
  r.sparse = false;
  r.sparse_rows = 0;
  r.short_splits = false;
  r.pair = r.clean = r.pair_merge = false;
  r.combine = r.layout.splits > 1;
  return r;
}

}  // namespace mla::detail::sm90
