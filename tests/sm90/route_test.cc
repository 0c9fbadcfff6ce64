// The sm90 route table (src/sm90/host/route.cc, docs/architecture.md): which kernel a validated
// call runs, with how many splits, in which workspace layout, paired or not, for given device
// facts and environment switches. No GPU needed: the calls are validated as host calls (shapes,
// strides and dtypes are all a route reads; no buffer is allocated or read) and routed for an
// H100/H200-sized device (132 SMs, 66 clusters of two paired seesaw CTAs at once).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "host/backends.h"
#include "mla/mla.h"
#include "sm90/decode/schedule/format.h"
#include "sm90/host/route.h"

namespace {

using mla::DataType;
using mla::TensorView;
using mla::detail::Problem;
using mla::detail::sm90::DeviceFacts;
using mla::detail::sm90::Kernel;
using mla::detail::sm90::Route;
using mla::detail::sm90::Switches;
namespace dt = mla::dtype;

const DataType kBf16 = dt::kBFloat16, kFp16 = dt::kFloat16, kFp8 = dt::kFloat8E4M3;

int clusters_66(mla::sm90::Elem) { return 66; }
int clusters_10(mla::sm90::Elem) { return 10; }
int clusters_0(mla::sm90::Elem) { return 0; }
const DeviceFacts kHopper{132, &clusters_66};

// One call's shapes: dense queries [B, q_len, H, L + R] unless `ragged` lists each request's query
// tokens; kv_cache [P, page_size, L + R + kv_row_pad]; block tables of max_seq_len keys per
// request; head dims (L, R) = (512, 64) unless set.
// The setters return the call, so that a table row states one call in one expression.
struct Call {
  int64_t B = 128, H = 128, q_len = 1;
  std::vector<int64_t> ragged;
  int64_t page_size = 64;
  int64_t max_seq_len = 8192;
  DataType q = kBf16, kv = kBf16;
  bool ds_mla = false;  // the fp8_ds_mla cache (uint8 rows of 656 bytes), bf16 query
  int64_t top_k = 0;    // > 0: sparse mode
  bool lens = false;    // sparse_topk_lens per request
  bool mask = false;
  int64_t kv_row_pad = 0;
  int64_t L = 512, R = 64;

  Call& dims(int64_t l, int64_t r) { return L = l, R = r, *this; }
  Call& pages(int64_t n) { return page_size = n, *this; }
  Call& keys(int64_t n) { return max_seq_len = n, *this; }
  Call& dtypes(DataType query, DataType cache) { return q = query, kv = cache, *this; }
  Call& fp8_ds_mla() { return ds_mla = true, *this; }
  Call& sparse(int64_t k) { return top_k = k, *this; }
  Call& topk_lens() { return lens = true, *this; }
  Call& masked() { return mask = true, *this; }
  Call& padded_kv_rows(int64_t n) { return kv_row_pad = n, *this; }
};

Call dense(int64_t B, int64_t H, int64_t q_len) {
  Call c;
  c.B = B;
  c.H = H;
  c.q_len = q_len;
  return c;
}

Call ragged(std::vector<int64_t> q_lens, int64_t H) {
  Call c;
  c.B = static_cast<int64_t>(q_lens.size());
  c.H = H;
  c.ragged = std::move(q_lens);
  return c;
}

// The Problem validate() derives for `c`, as the sm90 entry points receive it.
Problem problem_of(const Call& c) {
  // Distinct, never-dereferenced host addresses: validate() reads shapes, strides and dtypes.
  const auto fake = [](int k) {
    return reinterpret_cast<void*>(uintptr_t{1} << 40 | uintptr_t(k) << 36);
  };
  const bool ragged = !c.ragged.empty();
  int64_t T = c.B * c.q_len;
  if (ragged) {
    T = 0;
    for (int64_t n : c.ragged) T += n;
  }
  const int64_t max_pages = (c.max_seq_len + c.page_size - 1) / c.page_size;
  const int64_t P = c.B * max_pages + 1;
  mla::DecodeParams p;
  const int64_t D = c.L + c.R;
  p.query = ragged ? TensorView::contiguous(fake(1), c.q, {T, c.H, D})
                   : TensorView::contiguous(fake(1), c.q, {c.B, c.q_len, c.H, D});
  p.kv_lora_rank = static_cast<int32_t>(c.L);
  p.qk_rope_head_dim = static_cast<int32_t>(c.R);
  if (c.ds_mla) {
    p.kv_cache = TensorView::contiguous(fake(2), dt::kUInt8, {P, c.page_size, 656});
  } else {
    const int64_t row = D + c.kv_row_pad;
    p.kv_cache =
        TensorView::strided(fake(2), c.kv, {P, c.page_size, D}, {c.page_size * row, row, 1});
  }
  p.seq_lens = TensorView::contiguous(fake(3), dt::kInt32, {c.B});
  if (c.top_k > 0) {
    if (c.lens) p.sparse_topk_lens = TensorView::contiguous(fake(8), dt::kInt32, {c.B});
    p.sparse_top_k = static_cast<int32_t>(c.top_k);
    p.sparse_indices = ragged
                           ? TensorView::contiguous(fake(4), dt::kInt32, {T, c.top_k})
                           : TensorView::contiguous(fake(4), dt::kInt32, {c.B, c.q_len, c.top_k});
  } else {
    p.block_tables = TensorView::contiguous(fake(4), dt::kInt32, {c.B, max_pages});
  }
  if (ragged) {
    p.cum_seq_lens_q = TensorView::contiguous(fake(5), dt::kInt32, {c.B + 1});
    int64_t longest = 0;
    for (int64_t n : c.ragged) longest = std::max(longest, n);
    p.max_q_len = static_cast<int32_t>(longest);
  }
  if (c.mask) {
    p.mask = ragged ? TensorView::contiguous(fake(6), dt::kUInt32, {T, 1})
                    : TensorView::contiguous(fake(6), dt::kUInt32, {c.B, c.q_len, 1});
  }
  p.out = ragged ? TensorView::contiguous(fake(7), kBf16, {T, c.H, c.L})
                 : TensorView::contiguous(fake(7), kBf16, {c.B, c.q_len, c.H, c.L});
  p.max_seq_len = static_cast<int32_t>(c.max_seq_len);
  p.backend = mla::Backend::kCpu;
  Problem problem = mla::detail::validate(p);
  problem.backend = mla::Backend::kSm90;
  problem.device = mla::cuda_device(0);
  return problem;
}

// The route of `c` with the given switches (default: none set) on `device`.
Route route(const Call& c, const Switches& sw = Switches(), const DeviceFacts& device = kHopper) {
  return mla::detail::sm90::route_of(problem_of(c), device, sw);
}

// A route in one line: the kernel, then the split of its work (the balanced schedule's parts, or
// the splits per query token of the uniform layout, `direct` for the seesaw kernel's direct
// split), the few-rows kernel's padded rows, the seesaw kernel's tiles, pairing and cleaning, and
// whether the combine kernel follows.
std::string describe(const Route& r) {
  static const char* const kKernels[] = {"none", "simt", "few_rows", "seesaw"};
  std::ostringstream s;
  s << kKernels[static_cast<int>(r.kernel)];
  if (r.kernel == Kernel::kNone) return s.str();
  if (r.layout.scheduled) {
    s << " schedule parts=" << r.layout.parts;
  } else {
    s << " splits=" << r.layout.splits;
  }
  if (r.layout.direct) s << " direct";
  if (r.few_rows > 0) s << " rows=" << r.few_rows;
  if (r.fp8_direct) s << " fp8_direct";
  if (r.few_rows_deep) s << " deep";
  if (r.few_rows_three) s << " three";
  if (r.fp8_three) s << " fp8_three";
  if (r.tiles > 0) s << " tiles=" << r.tiles;
  if (r.pair) s << " pair";
  if (r.evict_first) s << " evict_first";
  if (r.clean) s << " clean";
  if (r.sparse) s << " sparse";
  if (r.sparse_rows > 0) s << " token_rows=" << r.sparse_rows;
  if (r.short_splits) s << " short_splits";
  if (r.pair_merge) s << " pair_merge";
  if (r.sparse && r.layout.order_offset > 0) s << " ordered";
  if (r.combine) s << " combine";
  return s.str();
}

struct Row {
  const char* what;
  Call call;
  std::string route;  // describe()
};

void expect_routes(const std::vector<Row>& rows, const Switches& sw = Switches(),
                   const DeviceFacts& device = kHopper) {
  for (const Row& row : rows) {
    EXPECT_EQ(describe(route(row.call, sw, device)), row.route) << row.what;
  }
}

// ---- The route table ------------------------------------------------------------------------

// The default routing (docs/architecture.md, the route table).
TEST(Sm90Route, Table) {
  expect_routes({
      // 16-bit dense calls with pages of 16 to 256 keys and aligned strides: the TMA kernels.
      {"DeepSeek-V3, B128 q1: 2 tiles per request, unpaired below 6", dense(128, 128, 1),
       "seesaw schedule parts=66 tiles=2 combine"},
      {"B128 q4: 8 tiles x 16 parts, paired", dense(128, 128, 4),
       "seesaw schedule parts=16 tiles=8 pair combine"},
      {"a custom mask: cleaned, unpaired", dense(128, 128, 4).masked(),
       "seesaw schedule parts=16 tiles=8 clean combine"},
      {"tiles that span two tokens: cleaned", dense(64, 96, 2),
       "seesaw schedule parts=44 tiles=3 clean combine"},
      {"one request: the direct split, 8 blocks per run", dense(1, 128, 4),
       "seesaw splits=16 direct tiles=8 combine"},
      {"fp16, pages of 16", dense(8, 64, 1).dtypes(kFp16, kFp16).pages(16),
       "seesaw schedule parts=132 tiles=1 combine"},
      {"H x q_len <= 16: the few-rows kernel, two blocks per split", dense(1, 16, 1),
       "few_rows splits=64 rows=16 combine"},
      {"H x q_len <= 32, several requests: the balanced schedule, one part per SM",
       dense(128, 16, 2), "few_rows schedule parts=132 rows=32 combine"},
      {"ragged, at most 32 rows per request", ragged({2, 1, 0}, 16),
       "few_rows schedule parts=132 rows=32 combine"},
      {"ragged, tiles span tokens", ragged({2, 1, 3}, 96),
       "seesaw schedule parts=26 tiles=5 clean combine"},
      // fp8 caches: the same grids and schedules, never paired; an e4m3 query over an e4m3 cache
      // on the FP8 tensor cores (the FP8 seesaw kernel; on the direct split from two blocks a
      // split), a bf16 query widened in shared memory.
      {"fp8 query and cache", dense(4, 128, 1).dtypes(kFp8, kFp8),
       "seesaw schedule parts=66 fp8_direct fp8_three tiles=2 combine"},
      {"fp8, B128", dense(128, 128, 1).dtypes(kFp8, kFp8),
       "seesaw schedule parts=66 fp8_direct fp8_three tiles=2 combine"},
      {"fp8, one request, one block a split: the direct split, widened",
       dense(1, 128, 1).dtypes(kFp8, kFp8).keys(4096), "seesaw splits=64 direct tiles=2 combine"},
      {"fp8, one request, two blocks a split: the direct split on the FP8 tensor cores",
       dense(1, 128, 1).dtypes(kFp8, kFp8), "seesaw splits=64 direct fp8_direct tiles=2 combine"},
      {"fp8, one request, five blocks a split", dense(1, 128, 1).dtypes(kFp8, kFp8).keys(20000),
       "seesaw splits=63 direct fp8_direct tiles=2 combine"},
      {"fp8, one request, 16 blocks a split", dense(1, 128, 1).dtypes(kFp8, kFp8).keys(65536),
       "seesaw splits=64 direct fp8_direct tiles=2 combine"},
      {"bf16 query, fp8 cache", dense(4, 128, 1).dtypes(kBf16, kFp8),
       "seesaw schedule parts=66 tiles=2 combine"},
      {"fp8 cache, q_len 4: unpaired", dense(8, 128, 4).dtypes(kBf16, kFp8),
       "seesaw schedule parts=16 tiles=8 combine"},
      {"fp8 query and cache, H x q_len <= 16: the FP8 tensor cores",
       dense(1, 16, 1).dtypes(kFp8, kFp8), "few_rows splits=64 rows=16 fp8_direct combine"},
      {"bf16 query, fp8 cache, H x q_len <= 32: widened in registers",
       dense(1, 16, 2).dtypes(kBf16, kFp8), "few_rows splits=64 rows=32 fp8_direct combine"},
      {"fp8 cache, kv rows not 16-byte aligned",
       dense(4, 128, 1).dtypes(kBf16, kFp8).padded_kv_rows(8), "simt splits=9 combine"},
      // Sparse calls: the same kernels with their blocks gathered by index, one tile per token's
      // heads, on uniform splits; any page size.
      {"sparse, B4 H128: 2 tiles per token", dense(4, 128, 1).sparse(2048),
       "seesaw splits=16 tiles=2 sparse combine"},
      {"sparse, B128 q2 H128: a split per token", dense(128, 128, 2).sparse(2048),
       "seesaw splits=1 tiles=2 sparse"},
      {"... with sparse_topk_lens: longest tokens first",
       dense(128, 128, 2).sparse(2048).topk_lens(), "seesaw splits=1 tiles=2 sparse ordered"},
      {"sparse, H64 with pages of 1", dense(4, 64, 1).sparse(2048).pages(1),
       "seesaw splits=32 tiles=1 sparse combine"},
      {"sparse, fp8_ds_mla, B64 H16: the few-rows kernel, rows read as they land",
       dense(64, 16, 1).sparse(2048).fp8_ds_mla(),
       "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
      {"sparse, fp8_ds_mla, H32: the few-rows kernel's tiles of 16 heads, two a token",
       dense(64, 32, 1).sparse(2048).fp8_ds_mla(), "few_rows splits=1 rows=16 fp8_direct sparse"},
      {"sparse, fp8 query and cache, H32 q2: tiles of one token",
       dense(8, 32, 2).sparse(512).dtypes(kFp8, kFp8),
       "few_rows splits=4 rows=32 fp8_direct sparse combine"},
      {"sparse, kv rows not 16-byte aligned", dense(4, 128, 1).sparse(2048).padded_kv_rows(4),
       "simt splits=8 combine"},
      // Head dims (256, 64) and (512, 0): the same kernels, their tiles zero where the rows have
      // no column.
      {"(256, 64), B128 q1 H128", dense(128, 128, 1).dims(256, 64),
       "seesaw schedule parts=66 tiles=2 combine"},
      {"(256, 64), B1 H16", dense(1, 16, 1).dims(256, 64), "few_rows splits=64 rows=16 combine"},
      {"(512, 0), fp8 cache", dense(4, 128, 1).dims(512, 0).dtypes(kBf16, kFp8),
       "seesaw schedule parts=66 tiles=2 combine"},
      {"(512, 0), sparse, H128", dense(4, 128, 1).dims(512, 0).sparse(2048),
       "seesaw splits=16 tiles=2 sparse combine"},
      {"(256, 64), sparse, fp8 cache, H16",
       dense(4, 16, 1).dims(256, 64).sparse(2048).dtypes(kBf16, kFp8),
       "few_rows splits=16 rows=16 fp8_direct sparse combine"},
      {"other head dims: the SIMT kernel, one split", dense(4, 128, 1).dims(128, 64),
       "simt splits=1"},
      // Everything else: the SIMT kernel.
      {"fp8_ds_mla cache, dense: gathered by position, unpaired", dense(4, 128, 1).fp8_ds_mla(),
       "seesaw schedule parts=66 tiles=2 combine"},
      {"fp8_ds_mla cache, dense, H x q_len <= 32, pages of 1",
       dense(8, 16, 2).fp8_ds_mla().pages(1), "few_rows schedule parts=132 rows=32 combine"},
      {"pages of 8", dense(4, 128, 1).pages(8), "simt splits=9 combine"},
      {"kv rows not 16-byte aligned", dense(4, 128, 1).padded_kv_rows(4), "simt splits=9 combine"},
      // No query token: no decode kernel.
      {"q_len 0", dense(4, 128, 0), "none"},
      {"B 0", dense(0, 128, 1), "none"},
  });
}

// Sparse calls by head count and format: one few-rows CTA (16 or 32 padded rows) or
// ceil(H / 64) seesaw tiles per token, never paired or scheduled, the splits of a token's
// min(top_k, max_seq_len) keys filling one wave (two blocks per split at least on the few-rows
// kernel); the switches apply as to dense calls.
TEST(Sm90Route, SparseShapes) {
  expect_routes({
      {"B1 H16, top_k 2048: 16 splits of two blocks", dense(1, 16, 1).sparse(2048),
       "few_rows splits=16 rows=16 sparse combine"},
      {"H20 q2: 32 padded rows", dense(2, 20, 2).sparse(256),
       "few_rows splits=2 rows=32 sparse combine"},
      {"bf16 query, fp8 cache, pages of 1",
       dense(4, 16, 1).sparse(2048).dtypes(kBf16, kFp8).pages(1),
       "few_rows splits=16 rows=16 fp8_direct sparse combine"},
      {"max_seq_len below top_k: the keys a token can count",
       dense(1, 16, 1).sparse(2048).keys(100), "few_rows splits=1 rows=16 sparse"},
      {"256 tokens: a split each", dense(128, 16, 2).sparse(2048),
       "few_rows splits=1 rows=16 sparse"},
      {"... with sparse_topk_lens: longest first", dense(128, 16, 2).sparse(2048).topk_lens(),
       "few_rows splits=1 rows=16 sparse ordered"},
      {"132 tokens with lens: one wave, in token order", dense(66, 16, 2).sparse(2048).topk_lens(),
       "few_rows splits=1 rows=16 sparse"},
      {"H48: one tile with padding rows", dense(2, 48, 1).sparse(2048),
       "seesaw splits=32 tiles=1 sparse combine"},
      {"H96: a partial second tile", dense(2, 96, 2).sparse(128),
       "seesaw splits=2 tiles=2 sparse combine"},
      {"fp16, H128", dense(4, 128, 1).sparse(2048).dtypes(kFp16, kFp16),
       "seesaw splits=16 tiles=2 sparse combine"},
      {"fp8_ds_mla, H128: the two tiles gather as a pair",
       dense(4, 128, 1).sparse(2048).fp8_ds_mla(), "seesaw splits=16 tiles=2 pair sparse combine"},
      {"fp8 cache, H96: a pair with a partial second tile",
       dense(2, 96, 2).sparse(128).dtypes(kBf16, kFp8),
       "seesaw splits=2 tiles=2 pair sparse combine"},
      {"fp8 query and cache, B128 q2 H128: a pair, a split per token",
       dense(128, 128, 2).sparse(2048).dtypes(kFp8, kFp8), "seesaw splits=1 tiles=2 pair sparse"},
      {"fp8_ds_mla, H64: one tile, unpaired; splits of one block on the landing path",
       dense(4, 64, 1).sparse(2048).fp8_ds_mla(),
       "seesaw splits=32 tiles=1 sparse short_splits combine"},
      {"fp8_ds_mla, B128 H64: a split of 32 blocks, its rows loaded ahead",
       dense(128, 64, 1).sparse(2048).fp8_ds_mla(), "seesaw splits=1 tiles=1 sparse"},
      {"... contexts of at most 512 keys: top_k's blocks decide, loaded ahead",
       dense(128, 64, 1).sparse(2048).fp8_ds_mla().keys(512), "seesaw splits=1 tiles=1 sparse"},
      {"B33 H64: four splits of 8 blocks, loaded ahead", dense(33, 64, 1).sparse(2048).fp8_ds_mla(),
       "seesaw splits=4 tiles=1 sparse combine"},
      {"B8 H64: 16 splits of 2 blocks, the landing path", dense(8, 64, 1).sparse(2048).fp8_ds_mla(),
       "seesaw splits=16 tiles=1 sparse short_splits combine"},
      {"ragged, a request without tokens", ragged({2, 0, 3}, 64).sparse(128),
       "seesaw splits=2 tiles=1 sparse combine"},
  });
  Switches rows;
  rows.sparse_rows = 64;
  expect_routes({{"token rows over fp8_ds_mla, 512 keys: no landing-path instantiation of them",
                  dense(128, 64, 1).sparse(2048).fp8_ds_mla().keys(512),
                  "seesaw splits=1 tiles=1 sparse token_rows=64"}},
                rows);
  Switches sw;
  sw.kernel = Switches::Kernel::kSeesaw;
  expect_routes({{"H16 on the seesaw kernel", dense(1, 16, 1).sparse(2048),
                  "seesaw splits=32 tiles=1 sparse combine"}},
                sw);
  sw.kernel = Switches::Kernel::kSimt;
  expect_routes({{"the SIMT kernel: 256 keys per split at least", dense(1, 16, 1).sparse(2048),
                  "simt splits=8 combine"}},
                sw);
  sw = Switches();
  sw.max_splits = 4;
  expect_routes({{"at most 4 splits", dense(1, 16, 1).sparse(2048),
                  "few_rows splits=4 rows=16 sparse combine"}},
                sw);
}

// Pairs need the device to hold the whole grid (tiles x parts) in clusters of two at once.
TEST(Sm90Route, PairsOnlyWhereTheDeviceHoldsTheGrid) {
  expect_routes({{"128 CTAs, 10 clusters of two", dense(128, 128, 4),
                  "seesaw schedule parts=16 tiles=8 combine"}},
                Switches(), DeviceFacts{132, &clusters_10});
}

// The workspace: the checked mode's record, then the partial rows (on the balanced schedule at
// most 2 (parts - 1) segments of max_q_len x H rows) and the schedule.
TEST(Sm90Route, WorkspaceLayout) {
  Route r = route(dense(128, 128, 1));
  EXPECT_EQ(r.layout.rows, 2 * 65 * 128);
  EXPECT_EQ(r.layout.max_offset, 256);
  EXPECT_GT(r.layout.part_blocks_offset, r.layout.part_first_offset);
  r = route(dense(1, 128, 4));
  EXPECT_EQ(r.layout.rows, 16 * 4 * 128);  // splits x T x H
  EXPECT_EQ(route(dense(4, 128, 0)).layout.bytes, 256);
  EXPECT_EQ(route(dense(0, 128, 1)).layout.bytes, 0);
}

// FlashInfer's 128 MiB workspace holds the preferred split of the largest batches engines run
// (B 1024 and 2048, q_len 2 and 4, 128 heads; bf16 and fp8 caches): the route with the cap is the
// route without one, so the cap costs these calls nothing.
TEST(Sm90Route, TheWorkspaceCapDoesNotBindAtLargeBatches) {
  Switches unlimited;
  unlimited.workspace_cap = int64_t{1} << 62;
  for (int64_t B : {1024, 2048}) {
    for (int64_t q_len : {2, 4}) {
      for (DataType kv : {kBf16, kFp8}) {
        const Call c = dense(B, 128, q_len).dtypes(kBf16, kv);
        const Route capped = route(c), free = route(c, unlimited);
        EXPECT_EQ(describe(capped), describe(free)) << "B " << B << " q_len " << q_len;
        EXPECT_EQ(capped.layout.bytes, free.layout.bytes);
        EXPECT_LE(capped.layout.bytes, int64_t{128} << 20);
      }
    }
  }
}

// A call whose addresses turn out unfit for TMA at run time runs the SIMT kernel in the same
// workspace: one split where it was laid out for the balanced schedule or where the head dims are
// not (512, 64), the same splits otherwise.
TEST(Sm90Route, SimtFallbackKeepsTheWorkspace) {
  const Route scheduled = route(dense(128, 128, 4));
  Route r = mla::detail::sm90::simt_fallback(scheduled, problem_of(dense(128, 128, 4)));
  EXPECT_EQ(describe(r), "simt splits=1");
  EXPECT_EQ(r.layout.bytes, scheduled.layout.bytes);
  r = mla::detail::sm90::simt_fallback(route(dense(1, 128, 4)), problem_of(dense(1, 128, 4)));
  EXPECT_EQ(describe(r), "simt splits=16 combine");
  // The SIMT kernel writes no partial row of head dims other than (512, 64): one split.
  const Call other = dense(1, 128, 4).dims(256, 64);
  r = mla::detail::sm90::simt_fallback(route(other), problem_of(other));
  EXPECT_EQ(describe(r), "simt splits=1");
}

// ---- The environment switches ---------------------------------------------------------------

TEST(Sm90Route, KernelSwitch) {
  Switches sw;
  sw.kernel = Switches::Kernel::kSimt;
  expect_routes({{"DeepSeek-V3", dense(128, 128, 1), "simt splits=1"},
                 {"few rows", dense(1, 16, 1), "simt splits=32 combine"}},
                sw);
  sw.kernel = Switches::Kernel::kSeesaw;
  expect_routes({{"few rows", dense(1, 16, 1), "seesaw splits=128 direct tiles=1 combine"}}, sw);
}

TEST(Sm90Route, PairSwitch) {
  Switches sw;
  sw.pair = 1;  // every balanced-schedule call that allows it: also 2 tiles at max_q_len 1
  expect_routes({{"2 tiles", dense(128, 128, 1), "seesaw schedule parts=66 tiles=2 pair combine"},
                 {"the direct split", dense(1, 128, 4), "seesaw splits=16 direct tiles=8 combine"}},
                sw);
  sw.pair = 0;
  expect_routes({{"8 tiles", dense(128, 128, 4), "seesaw schedule parts=16 tiles=8 combine"},
                 {"sparse fp8_ds_mla, H128: splits of two blocks on the landing path",
                  dense(4, 128, 1).sparse(2048).fp8_ds_mla(),
                  "seesaw splits=16 tiles=2 sparse short_splits combine"}},
                sw);
}

// A sparse call of one split on the seesaw kernel runs a row of CTAs per token by default;
// MLA_SM90_SPARSE_ROWS=N caps the rows at N (tests run the sparse suite at 3), each CTA then
// walking several tokens; N at or above the tokens, or 0, is the default.
TEST(Sm90Route, SparseRowsSwitch) {
  Switches sw;
  expect_routes({{"B128 q1 H128: a row per token", dense(128, 128, 1).sparse(2048),
                  "seesaw splits=1 tiles=2 sparse"},
                 {"B256 q1 H64", dense(256, 64, 1).sparse(2048), "seesaw splits=1 tiles=1 sparse"}},
                sw);
  sw.sparse_rows = 3;
  expect_routes({{"at most 3 rows", dense(128, 128, 2).sparse(2048),
                  "seesaw splits=1 tiles=2 sparse token_rows=3"},
                 {"splits: no rows", dense(4, 128, 1).sparse(2048),
                  "seesaw splits=16 tiles=2 sparse combine"}},
                sw);
  sw.sparse_rows = 256;
  expect_routes({{"as many rows as tokens", dense(128, 128, 2).sparse(2048),
                  "seesaw splits=1 tiles=2 sparse"}},
                sw);
  sw.sparse_rows = 0;
  expect_routes(
      {{"a row per token", dense(128, 128, 2).sparse(2048), "seesaw splits=1 tiles=2 sparse"}}, sw);
}

// Sparse pairs need the device to run clusters of two at all (any number of waves).
TEST(Sm90Route, SparsePairsNeedClusters) {
  expect_routes({{"sparse fp8_ds_mla, H128", dense(4, 128, 1).sparse(2048).fp8_ds_mla(),
                  "seesaw splits=16 tiles=2 sparse short_splits combine"},
                 {"... B128: unpaired, a split of 32 blocks loaded ahead",
                  dense(128, 128, 1).sparse(2048).fp8_ds_mla(), "seesaw splits=1 tiles=2 sparse"}},
                Switches(), DeviceFacts{132, &clusters_0});
}

// The evict-first instantiation: the balanced schedule's unpaired, uncleaned 16-bit calls of two
// or more tiles a request whose parts hold at most 96 blocks each; the switch turns it off.
TEST(Sm90Route, EvictFirst) {
  expect_routes(
      {{"B32 q1 H128, 4096 keys: 31 blocks a part", dense(32, 128, 1).keys(4096),
        "seesaw schedule parts=66 tiles=2 evict_first combine"},
       {"fp16, B16 q2 H64, 16384 keys: 62 blocks a part",
        dense(16, 64, 2).dtypes(kFp16, kFp16).keys(16384),
        "seesaw schedule parts=66 tiles=2 evict_first combine"},
       {"B8 q3 H64, 16384 keys: 3 tiles, 47 blocks a part", dense(8, 64, 3).keys(16384),
        "seesaw schedule parts=44 tiles=3 evict_first combine"},
       {"B66 q1 H128, 6144 keys: 96 blocks a part", dense(66, 128, 1).keys(6144),
        "seesaw schedule parts=66 tiles=2 evict_first combine"},
       {"... one key more: 97", dense(66, 128, 1).keys(6145),
        "seesaw schedule parts=66 tiles=2 combine"},
       {"B128 q1 H128, 8192 keys: 248 blocks a part", dense(128, 128, 1),
        "seesaw schedule parts=66 tiles=2 combine"},
       {"one tile a request: bound by its bytes", dense(32, 64, 1).keys(4096),
        "seesaw schedule parts=132 tiles=1 combine"},
       {"a custom mask: cleaned", dense(32, 128, 1).keys(4096).masked(),
        "seesaw schedule parts=66 tiles=2 clean combine"},
       {"paired", dense(8, 128, 4).keys(4096), "seesaw schedule parts=16 tiles=8 pair combine"},
       {"the direct split", dense(1, 128, 1), "seesaw splits=64 direct tiles=2 combine"},
       {"bf16 query, fp8 cache", dense(32, 128, 1).keys(4096).dtypes(kBf16, kFp8),
        "seesaw schedule parts=66 tiles=2 combine"},
       {"fp8_ds_mla cache", dense(32, 128, 1).keys(4096).fp8_ds_mla(),
        "seesaw schedule parts=66 tiles=2 combine"}});
  Switches sw;
  sw.kv_evict_first = false;
  expect_routes({{"B32 q1 H128, 4096 keys", dense(32, 128, 1).keys(4096),
                  "seesaw schedule parts=66 tiles=2 combine"}},
                sw);
}

TEST(Sm90Route, DirectSplitSwitch) {
  Switches sw;
  sw.direct_split = false;
  expect_routes(
      {{"one request", dense(1, 128, 4), "seesaw schedule parts=16 tiles=8 pair combine"}}, sw);
}

TEST(Sm90Route, FewRowsScheduleSwitch) {
  Switches sw;
  sw.few_rows_schedule = false;  // several requests of few rows: uniform splits
  expect_routes({{"a split per request: out and lse directly", dense(128, 16, 2),
                  "few_rows splits=1 rows=32"},
                 {"ragged", ragged({2, 1, 0}, 16), "few_rows splits=43 rows=32 combine"},
                 {"B8 fp8 cache", dense(8, 16, 1).dtypes(kFp8, kFp8),
                  "few_rows splits=16 rows=16 fp8_direct combine"}},
                sw);
  expect_routes({{"B8 fp8 cache", dense(8, 16, 1).dtypes(kFp8, kFp8),
                  "few_rows schedule parts=132 rows=16 fp8_direct combine"},
                 {"one request: uniform splits either way", dense(1, 16, 1),
                  "few_rows splits=64 rows=16 combine"}});
}

TEST(Sm90Route, Fp8DirectSwitch) {
  Switches sw;
  sw.fp8_direct = false;  // an e4m3 cache on the few-rows kernel: widened in shared memory
  expect_routes({{"fp8 query and cache", dense(8, 16, 2).dtypes(kFp8, kFp8),
                  "few_rows schedule parts=132 rows=32 combine"},
                 {"bf16 query, fp8 cache", dense(8, 16, 1).dtypes(kBf16, kFp8),
                  "few_rows schedule parts=132 rows=16 combine"},
                 {"fp8 query and cache, H 128: the seesaw kernel, widened",
                  dense(8, 128, 1).dtypes(kFp8, kFp8), "seesaw schedule parts=66 tiles=2 combine"},
                 {"sparse: gathered and widened", dense(8, 16, 1).sparse(512).dtypes(kFp8, kFp8),
                  "few_rows splits=4 rows=16 sparse combine"}},
                sw);
  expect_routes(
      {{"fp8 query and cache", dense(8, 16, 2).dtypes(kFp8, kFp8),
        "few_rows schedule parts=132 rows=32 fp8_direct combine"},
       {"bf16 query, fp8 cache", dense(8, 16, 1).dtypes(kBf16, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct combine"},
       {"sparse: gathered as e4m3, read as it lands",
        dense(8, 16, 1).sparse(512).dtypes(kFp8, kFp8),
        "few_rows splits=4 rows=16 fp8_direct sparse combine"},
       {"fp8 query and cache, H 128: the FP8 seesaw kernel", dense(8, 128, 1).dtypes(kFp8, kFp8),
        "seesaw schedule parts=66 fp8_direct fp8_three tiles=2 combine"},
       {"sparse, H 128: gathered and widened by a pair",
        dense(8, 128, 1).sparse(512).dtypes(kFp8, kFp8),
        "seesaw splits=8 tiles=2 pair sparse combine"},
       {"fp8_ds_mla: gathered", dense(8, 16, 1).fp8_ds_mla(),
        "few_rows schedule parts=132 rows=16 combine"}});
}

TEST(Sm90Route, DsDirectSwitch) {
  Switches sw;
  sw.ds_direct = false;  // fp8_ds_mla rows at 16 rows: gathered ahead and widened by the producer
  expect_routes({{"sparse fp8_ds_mla, H16", dense(64, 16, 1).sparse(2048).fp8_ds_mla(),
                  "few_rows splits=2 rows=16 sparse pair_merge"},
                 {"dense fp8_ds_mla, H16: gathered either way", dense(8, 16, 1).fp8_ds_mla(),
                  "few_rows schedule parts=132 rows=16 combine"}},
                sw);
  expect_routes({{"sparse fp8_ds_mla, H16", dense(64, 16, 1).sparse(2048).fp8_ds_mla(),
                  "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
                 {"dense fp8_ds_mla, H16: gathered either way", dense(8, 16, 1).fp8_ds_mla(),
                  "few_rows schedule parts=132 rows=16 combine"}});
}

TEST(Sm90Route, Fp8SeesawMinBlocksSwitch) {
  Switches sw;
  sw.fp8_seesaw_min_blocks = 3;  // the direct split's FP8 seesaw from three blocks a split
  expect_routes({{"three blocks a split", dense(1, 128, 1).dtypes(kFp8, kFp8).keys(12288),
                  "seesaw splits=64 direct fp8_direct tiles=2 combine"},
                 {"two blocks a split", dense(1, 128, 1).dtypes(kFp8, kFp8),
                  "seesaw splits=64 direct tiles=2 combine"}},
                sw);
  sw.fp8_seesaw_min_blocks = 1 << 20;  // never on the direct split; the balanced schedule alike
  expect_routes({{"one request", dense(1, 128, 1).dtypes(kFp8, kFp8).keys(65536),
                  "seesaw splits=64 direct tiles=2 combine"},
                 {"several requests", dense(8, 128, 1).dtypes(kFp8, kFp8),
                  "seesaw schedule parts=66 fp8_direct fp8_three tiles=2 combine"}},
                sw);
}

TEST(Sm90Route, Fp8ThreeSwitch) {
  Switches sw;
  expect_routes(
      {{"B128: three consumers by default", dense(128, 128, 1).dtypes(kFp8, kFp8),
        "seesaw schedule parts=66 fp8_direct fp8_three tiles=2 combine"},
       {"8 blocks a part", dense(4, 128, 1).dtypes(kFp8, kFp8),
        "seesaw schedule parts=66 fp8_direct fp8_three tiles=2 combine"},
       {"the direct split keeps two consumers", dense(1, 128, 1).dtypes(kFp8, kFp8).keys(65536),
        "seesaw splits=64 direct fp8_direct tiles=2 combine"},
       {"a bf16 query: widened", dense(128, 128, 1).dtypes(kBf16, kFp8),
        "seesaw schedule parts=66 tiles=2 combine"}},
      sw);
  sw.fp8_three = false;  // MLA_SM90_FP8_THREE=0: the two-consumer kernel
  expect_routes({{"B128: two consumers", dense(128, 128, 1).dtypes(kFp8, kFp8),
                  "seesaw schedule parts=66 fp8_direct tiles=2 combine"}},
                sw);
}

// The few-rows kernel's e4m3 GEMMs on four stages where a CTA is expected to hold at least 24
// blocks (from max_seq_len, or top_k for a sparse call), on two below; MLA_SM90_FEW_ROWS_DEEP=0 or
// 1 takes either on every such call. A bf16 query over the e4m3 cache takes no part in this
// choice (four stages with two consumers, three with three: FewRowsThreeConsumers).
TEST(Sm90Route, FewRowsDeepRing) {
  Switches sw;
  expect_routes(
      {{"B128 H16: 125 blocks a part", dense(128, 16, 1).dtypes(kFp8, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct deep combine"},
       {"B8 H16: 8 blocks a part", dense(8, 16, 1).dtypes(kFp8, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct combine"},
       {"B32 s4096 H32: 16 blocks a part", dense(32, 32, 1).dtypes(kFp8, kFp8).keys(4096),
        "few_rows schedule parts=132 rows=32 fp8_direct combine"},
       {"B48 s4096 H32: 24 blocks a part", dense(48, 32, 1).dtypes(kFp8, kFp8).keys(4096),
        "few_rows schedule parts=132 rows=32 fp8_direct deep combine"},
       {"one request, s65536: 8 blocks a split", dense(1, 16, 1).dtypes(kFp8, kFp8).keys(65536),
        "few_rows splits=128 rows=16 fp8_direct combine"},
       {"one request, s262144: 32 blocks a split", dense(1, 16, 1).dtypes(kFp8, kFp8).keys(262144),
        "few_rows splits=128 rows=16 fp8_direct deep combine"},
       {"sparse B128 q2 H16, top_k 2048: 32 blocks a token",
        dense(128, 16, 2).sparse(2048).dtypes(kFp8, kFp8),
        "few_rows splits=1 rows=16 fp8_direct deep sparse"},
       {"sparse B64 H16: 16 blocks a split", dense(64, 16, 1).sparse(2048).dtypes(kFp8, kFp8),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"a bf16 query: three consumers", dense(128, 16, 1).dtypes(kBf16, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct three combine"}},
      sw);
  sw.few_rows_deep = 0;
  expect_routes({{"B128 H16: two stages", dense(128, 16, 1).dtypes(kFp8, kFp8),
                  "few_rows schedule parts=132 rows=16 fp8_direct combine"}},
                sw);
  sw.few_rows_deep = 1;
  expect_routes({{"B8 H16: four stages", dense(8, 16, 1).dtypes(kFp8, kFp8),
                  "few_rows schedule parts=132 rows=16 fp8_direct deep combine"},
                 {"sparse B64 H16", dense(64, 16, 1).sparse(2048).dtypes(kFp8, kFp8),
                  "few_rows splits=2 rows=16 fp8_direct deep sparse pair_merge"},
                 {"a bf16 query: no choice", dense(128, 16, 1).dtypes(kBf16, kFp8),
                  "few_rows schedule parts=132 rows=16 fp8_direct three combine"}},
                sw);
  sw.fp8_direct = false;  // widened in shared memory: no choice either
  expect_routes({{"widened", dense(128, 16, 1).dtypes(kFp8, kFp8),
                  "few_rows schedule parts=132 rows=16 combine"}},
                sw);
}

// A few-rows call of a bf16 query over a per-tensor e4m3 cache read as it lands (dense, or sparse
// in tiles of 16 heads) runs three consumer warpgroups at 16 rows where a CTA is expected to hold
// at least 12 blocks, two below and at 32 rows; a sparse call's fp8_ds_mla rows too, but only
// for one tile a token, below 24 blocks and without sparse_topk_lens; MLA_SM90_FEW_ROWS_THREE=0
// or 1 takes two or three on every such call at 16 rows. A sparse call of two splits a token
// merges them on two consumers instead (SparsePairMerge, below).
TEST(Sm90Route, FewRowsThreeConsumers) {
  Switches sw;
  expect_routes(
      {{"B128 H16: 125 blocks a part", dense(128, 16, 1).dtypes(kBf16, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct three combine"},
       {"B32 s4096 H16: 16 blocks a part", dense(32, 16, 1).keys(4096).dtypes(kBf16, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct three combine"},
       {"B8 H16: 8 blocks a part", dense(8, 16, 1).dtypes(kBf16, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct combine"},
       {"B1 s65536 H16: 8 blocks a split", dense(1, 16, 1).keys(65536).dtypes(kBf16, kFp8),
        "few_rows splits=128 rows=16 fp8_direct combine"},
       {"B1 s262144 H16: 32 blocks a split", dense(1, 16, 1).keys(262144).dtypes(kBf16, kFp8),
        "few_rows splits=128 rows=16 fp8_direct three combine"},
       {"B128 q2 H16: 32 rows", dense(128, 16, 2).dtypes(kBf16, kFp8),
        "few_rows schedule parts=132 rows=32 fp8_direct combine"},
       {"sparse B128 q2 H16, top_k 2048: 32 blocks a token",
        dense(128, 16, 2).sparse(2048).dtypes(kBf16, kFp8),
        "few_rows splits=1 rows=16 fp8_direct three sparse"},
       {"sparse B64 H16: 16 blocks a split", dense(64, 16, 1).sparse(2048).dtypes(kBf16, kFp8),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"sparse B64 H16, top_k 512: 4 blocks a split",
        dense(64, 16, 1).sparse(512).dtypes(kBf16, kFp8),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"sparse fp8_ds_mla B64 H16: 16 blocks a split", dense(64, 16, 1).sparse(2048).fp8_ds_mla(),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"sparse fp8_ds_mla B64 H16, top_k 512: 4 blocks a split",
        dense(64, 16, 1).sparse(512).fp8_ds_mla(),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"sparse fp8_ds_mla B128 H16: 32 blocks a split, two",
        dense(128, 16, 1).sparse(2048).fp8_ds_mla(), "few_rows splits=1 rows=16 fp8_direct sparse"},
       {"sparse fp8_ds_mla B32 H32: 16 blocks a split, two tiles a token: two",
        dense(32, 32, 1).sparse(2048).fp8_ds_mla(),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"sparse fp8_ds_mla B64 H16 with sparse_topk_lens: two",
        dense(64, 16, 1).sparse(2048).fp8_ds_mla().topk_lens(),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"an e4m3 query", dense(128, 16, 1).dtypes(kFp8, kFp8),
        "few_rows schedule parts=132 rows=16 fp8_direct deep combine"}},
      sw);
  sw.few_rows_three = 0;
  expect_routes({{"B128 H16: two", dense(128, 16, 1).dtypes(kBf16, kFp8),
                  "few_rows schedule parts=132 rows=16 fp8_direct combine"},
                 {"sparse fp8_ds_mla B64 H16: two", dense(64, 16, 1).sparse(2048).fp8_ds_mla(),
                  "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"}},
                sw);
  sw.few_rows_three = 1;
  expect_routes({{"B1 H16: three", dense(1, 16, 1).dtypes(kBf16, kFp8),
                  "few_rows splits=64 rows=16 fp8_direct three combine"},
                 {"sparse fp8_ds_mla B128 H16: three", dense(128, 16, 1).sparse(2048).fp8_ds_mla(),
                  "few_rows splits=1 rows=16 fp8_direct three sparse"},
                 {"B1 H16 q2: 32 rows, two", dense(1, 16, 2).dtypes(kBf16, kFp8),
                  "few_rows splits=64 rows=32 fp8_direct combine"}},
                sw);
}

// A sparse few-rows call (16 rows) of two splits a token merges them in their cluster of two
// (Route::pair_merge: no combine) on two consumers; not at other split counts or 32 rows, not where
// three consumers are forced or the switch is off, and not where the device runs no cluster of
// two. With the merge off, the three-consumer rule above applies to the same calls.
TEST(Sm90Route, SparsePairMerge) {
  Switches sw;
  expect_routes(
      {{"bf16 B64 H16: two splits", dense(64, 16, 1).sparse(2048),
        "few_rows splits=2 rows=16 sparse pair_merge"},
       {"fp8_ds_mla B64 H8", dense(64, 8, 1).sparse(2048).fp8_ds_mla(),
        "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
       {"fp8_ds_mla B128 H16: one split", dense(128, 16, 1).sparse(2048).fp8_ds_mla(),
        "few_rows splits=1 rows=16 fp8_direct sparse"},
       {"fp8_ds_mla B16 H16: eight splits", dense(16, 16, 1).sparse(2048).fp8_ds_mla(),
        "few_rows splits=8 rows=16 fp8_direct sparse combine"},
       {"fp8 B64 H32 q1: 32 rows a tile", dense(64, 32, 1).sparse(2048).dtypes(kFp8, kFp8),
        "few_rows splits=2 rows=32 fp8_direct sparse combine"}},
      sw);
  sw.few_rows_three = 1;
  expect_routes(
      {{"fp8_ds_mla B64 H16, three forced: unmerged", dense(64, 16, 1).sparse(2048).fp8_ds_mla(),
        "few_rows splits=2 rows=16 fp8_direct three sparse combine"}},
      sw);
  sw = Switches();
  sw.sparse_pair_merge = false;
  expect_routes(
      {{"bf16 B64 H16", dense(64, 16, 1).sparse(2048), "few_rows splits=2 rows=16 sparse combine"},
       {"bf16-fp8 B64 H16: three", dense(64, 16, 1).sparse(2048).dtypes(kBf16, kFp8),
        "few_rows splits=2 rows=16 fp8_direct three sparse combine"},
       {"fp8_ds_mla B64 H16: three", dense(64, 16, 1).sparse(2048).fp8_ds_mla(),
        "few_rows splits=2 rows=16 fp8_direct three sparse combine"},
       {"fp8_ds_mla B64 H16 with sparse_topk_lens: two",
        dense(64, 16, 1).sparse(2048).fp8_ds_mla().topk_lens(),
        "few_rows splits=2 rows=16 fp8_direct sparse combine"}},
      sw);
  // CTest's sm90_sparse_test.PairMerge (MLA_SM90_MAX_SPLITS=2) merges the suite's small calls:
  // the Formats cases at 16 heads (top_k 192, three blocks) and a Lens case at 8 heads.
  sw = Switches();
  sw.max_splits = 2;
  expect_routes({{"B2 q2 H16, top_k 192", dense(2, 16, 2).sparse(192),
                  "few_rows splits=2 rows=16 sparse pair_merge"},
                 {"fp8_ds_mla B2 q2 H16, top_k 192", dense(2, 16, 2).sparse(192).fp8_ds_mla(),
                  "few_rows splits=2 rows=16 fp8_direct sparse pair_merge"},
                 {"B2 H8, top_k 2048", dense(2, 8, 1).sparse(2048),
                  "few_rows splits=2 rows=16 sparse pair_merge"}},
                sw);
  const DeviceFacts no_clusters{132, &clusters_0};
  expect_routes({{"no cluster of two", dense(64, 16, 1).sparse(2048),
                  "few_rows splits=2 rows=16 sparse combine"}},
                Switches(), no_clusters);
}

TEST(Sm90Route, MaxSplitsSwitch) {
  Switches sw;
  sw.max_splits = 4;
  expect_routes({{"few rows", dense(1, 16, 1), "few_rows splits=4 rows=16 combine"},
                 {"SIMT (pages of 8)", dense(4, 128, 1).pages(8), "simt splits=4 combine"}},
                sw);
}

TEST(Sm90Route, ScheduleFixedSwitch) {
  Switches sw;
  sw.schedule_fixed_blocks = 3;
  EXPECT_EQ(route(dense(128, 128, 1), sw).schedule_fixed_blocks, 3);
  EXPECT_EQ(route(dense(128, 128, 1)).schedule_fixed_blocks, mla::sm90::schedule::kFixedBlocks);
}

// ---- The workspace cap ----------------------------------------------------------------------

// The workspace stays within 128 MiB (contract section 3): on this device for the shapes engines
// run at large batch, and on a (hypothetical) device of 8192 SMs, where the preferred split's
// partials would not fit and the splits halve until they do.
TEST(Sm90Route, WorkspaceWithin128MiB) {
  constexpr int64_t kCap = int64_t{128} << 20;
  for (const int64_t B : {1, 64, 768, 1024, 2048}) {
    for (const int64_t q_len : {1, 2, 4, 16}) {
      for (const int64_t H : {16, 64, 128}) {
        for (const DataType kv : {kBf16, kFp8}) {
          const Call c = dense(B, H, q_len).dtypes(kBf16, kv).keys(32768);
          EXPECT_LE(route(c).layout.bytes, kCap)
              << "B " << B << " q_len " << q_len << " H " << H << " kv bits " << int(kv.bits);
        }
      }
    }
  }
  // 128 splits would need 257 MiB of partials, 64 one byte over 128 MiB.
  const Route r = route(dense(1, 128, 16), Switches(), DeviceFacts{8192, &clusters_66});
  EXPECT_EQ(describe(r), "seesaw splits=32 direct tiles=32 combine");
  EXPECT_LE(r.layout.bytes, kCap);
}

}  // namespace
