// Sparse mode (docs/contract.md section 2.2) on the sm90 backend against the float64 oracle, on
// the GPU: the fast paths, the few-rows kernel (tokens of up to 32 heads) and the seesaw kernel
// (tiles of 64 heads of one token), with each 64-key block's cache rows gathered by index
// (src/sm90/decode/tma/gather.cuh), for every (query, kv_cache) pair they take; a call they do not
// take runs on the SIMT kernel.
//
// Cases are built as the dense sweeps' (common/decode_case.h: -1 holes, repeated slots, entries
// from the whole pool, entries past each token's count naming other rows), and then every pool row
// that no counted entry names is NaN: a gather that reads past a token's count, for a -1 entry or
// at a wrong slot turns its rows NaN. Each case first checks the route it takes on this device.
// Captured in a CUDA graph, a run reads new indices, lens, cache rows and scales at every replay.
// Every test skips itself where no CUDA device of compute capability 9.0 is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/decode_case.h"
#include "common/device_call.h"
#include "common/fp8_ds_mla.h"
#include "common/graph_replay.h"
#include "common/hopper.h"
#include "common/test_util.h"
#include "mla/mla.h"
#include "oracle/oracle.h"
#include "sm90/decode/seesaw/launch.h"
#include "sm90/host/route.h"

namespace {

using namespace mla_test::decode_case;  // Case, Built, build, checks
using namespace mla_test::gpu;          // DeviceCall, run_on_gpu, deepseek, check_sm90
using mla::detail::sm90::Kernel;
using mla::detail::sm90::Route;
using oracle::TopkLens;
namespace ds_mla = mla_test::fp8_ds_mla;

const DataType kBf16 = dt::kBFloat16, kFp16 = dt::kFloat16, kFp8 = dt::kFloat8E4M3;

// The (query, kv_cache) pairs of the fast path.
enum class Format { kBf16, kFp16, kBf16Fp8, kFp8, kDsMla };

// One sparse call and the kernel its route must take.
struct SparseCase {
  Case c;
  bool ds_mla = false;  // the fp8_ds_mla cache (c holds a bf16 query and a bf16 kv_dtype)
  Kernel kernel = Kernel::kFewRows;
  int min_splits = 1;  // the route splits each token's entries at least this often
  // Each split runs at least this many blocks of top_k (the seesaw kernel's unpaired fp8_ds_mla
  // rows then load a block ahead: seesaw::kAheadMinBlocks).
  int min_split_blocks = 0;
  bool ordered = false;  // the route starts the tokens longest first (params.h, sparse_order)
  // fp8_ds_mla: how the rows' group scales are chosen (amax / 448 as vLLM writes them, powers of
  // two as DeepSeek's and FlashMLA's quantizers write them, or rows of both).
  ds_mla::Scales scales = ds_mla::Scales::kAmax;
};

std::string name_of(const SparseCase& s) {
  const char* scales = s.scales == ds_mla::Scales::kUe8m0   ? "_ue8m0"
                       : s.scales == ds_mla::Scales::kMixed ? "_mixedscales"
                                                            : "";
  return case_name(s.c) + (s.ds_mla ? std::string("_dsmla") + scales : "");
}

std::ostream& operator<<(std::ostream& os, const SparseCase& s) { return os << name_of(s); }

std::string param_name(const ::testing::TestParamInfo<SparseCase>& info) {
  return name_of(info.param) + "_" + std::to_string(info.index);
}

// A sparse call of DeepSeek's head dims in bf16, on the kernel its head count picks: few-rows up
// to 32 heads, seesaw above.
SparseCase sparse(int B, int H, int q_len, int top_k, std::vector<int> seq_lens, int page_size) {
  SparseCase s;
  s.c.B = B;
  s.c.H = H;
  s.c.q_len = q_len;
  s.c.top_k = top_k;
  s.c.seq_lens = std::move(seq_lens);
  s.c.page_size = page_size;
  s.c = deepseek(s.c);
  s.kernel = H <= 32 ? Kernel::kFewRows : Kernel::kSeesaw;
  return s;
}

SparseCase with_format(SparseCase s, Format f) {
  s.ds_mla = f == Format::kDsMla;
  s.c.q_dtype = f == Format::kFp16 ? kFp16 : f == Format::kFp8 ? kFp8 : kBf16;
  s.c.kv_dtype = f == Format::kFp16                           ? kFp16
                 : f == Format::kFp8 || f == Format::kBf16Fp8 ? kFp8
                                                              : kBf16;
  if (f == Format::kFp16) s.c.out_dtype = kFp16;
  return s;
}

// A built case ready to run: unnamed pool rows NaN, and its fp8_ds_mla cache where asked.
struct Prepared {
  std::unique_ptr<Built> b;
  bool ds_mla = false;
  std::vector<uint8_t> cache;  // the fp8_ds_mla cache's bytes

  const std::vector<uint8_t>* kv_bytes() const { return ds_mla ? &cache : nullptr; }
};

// `edit` (optional) changes the built call before the unnamed rows are poisoned: its indices (in
// the tensor and the oracle alike), or for an fp8_ds_mla cache the oracle's values, which
// use_fp8_ds_mla then encodes.
Prepared prepare(const SparseCase& s, const std::function<void(Built&)>& edit = nullptr) {
  Prepared p;
  p.b = build(s.c);
  if (edit) edit(*p.b);
  poison_unnamed_slots(*p.b);
  p.ds_mla = s.ds_mla;
  if (s.ds_mla) ds_mla::use_fp8_ds_mla(*p.b, p.cache, s.scales);
  return p;
}

// The route must be `s.kernel`'s, gathered (sparse) on the fast path, with the padded rows or
// tiles its head count needs and at least s.min_splits splits.
void expect_route(const Route& r, const SparseCase& s) {
  if (std::getenv("MLA_SM90_KERNEL") != nullptr || std::getenv("MLA_SM90_MAX_SPLITS") != nullptr) {
    return;  // routing forced
  }
  auto off = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::string(v) == "0";
  };
  // fp8_ds_mla rows at 17..32 heads: the few-rows kernel's tiles of 16 heads, read as they land;
  // with MLA_SM90_DS_DIRECT=0 one seesaw tile (route.cc, family_of).
  Kernel kernel = s.kernel;
  if (s.ds_mla && kernel == Kernel::kFewRows && s.c.H > 16 && off("MLA_SM90_DS_DIRECT")) {
    kernel = Kernel::kSeesaw;
  }
  EXPECT_EQ(static_cast<int>(r.kernel), static_cast<int>(kernel))
      << "kernel (1 simt, 2 few_rows, 3 seesaw)";
  EXPECT_EQ(r.sparse, kernel != Kernel::kSimt);
  if (kernel == Kernel::kFewRows) {
    EXPECT_EQ(r.few_rows, s.c.H <= 16 || s.ds_mla ? 16 : 32);
    // A per-tensor e4m3 cache lands as e4m3 (tma::gather_e4m3_direct) unless
    // MLA_SM90_FP8_DIRECT=0, an fp8_ds_mla cache whole (tma::gather_rows_bulk) unless
    // MLA_SM90_DS_DIRECT=0.
    const bool direct =
        s.ds_mla ? !off("MLA_SM90_DS_DIRECT") : s.c.kv_dtype == kFp8 && !off("MLA_SM90_FP8_DIRECT");
    EXPECT_EQ(r.fp8_direct, direct) << "fp8_direct";
  } else if (kernel == Kernel::kSeesaw) {
    EXPECT_EQ(r.tiles, (s.c.H + 63) / 64);
    // The two tiles of a token over e4m3 rows gather as a pair (docs/sm90-sparse.md, Pairs)
    // unless MLA_SM90_PAIR=0.
    const char* pair = std::getenv("MLA_SM90_PAIR");
    const bool unpaired = pair != nullptr && std::string(pair) == "0";
    const bool e4m3_rows = s.ds_mla || s.c.kv_dtype == kFp8;
    EXPECT_EQ(r.pair, r.tiles == 2 && e4m3_rows && !unpaired) << "pair";
  }
  EXPECT_GE(r.layout.splits, s.min_splits);
  const int64_t blocks = (s.c.top_k + 63) / 64;
  EXPECT_GE((blocks + r.layout.splits - 1) / r.layout.splits, s.min_split_blocks)
      << "blocks a split";
  if (s.ordered) {
    EXPECT_GT(r.layout.order_offset, 0) << "tokens ordered by counted blocks";
  }
}

// The comparison with the oracle: the sm90 rounding of P and partials, and for an fp8_ds_mla cache
// the gather kernels' rounding of its dequantized values (check_sm90_ds_mla).
void check(const Built& b, bool ds_mla, const Route& route, const std::vector<uint8_t>& cache) {
  if (ds_mla) {
    check_sm90_ds_mla(b, route, cache);
  } else {
    check_sm90(b);
  }
}
void check(const Prepared& p, const Route& route) { check(*p.b, p.ds_mla, route, p.cache); }

class Sm90Sparse : public ::testing::TestWithParam<SparseCase> {};

TEST_P(Sm90Sparse, MatchesOracle) {
  SKIP_WITHOUT_HOPPER();
  const SparseCase& s = GetParam();
  Prepared p = prepare(s);
  DeviceCall call(*p.b, p.kv_bytes());
  const Route route = route_on_device(call.params);
  expect_route(route, s);
  ASSERT_TRUE(run_on_gpu(call.params));
  call.download(*p.b);
  check(p, route);
}

// ---- Case lists -------------------------------------------------------------------------------

// Many blocks and splits: top_k 2048 over longer sequences (32 blocks per token, split across the
// SMs), and one and two blocks (top_k 64 and 128), with lengths on block edges.
std::vector<SparseCase> block_cases() {
  std::vector<SparseCase> cases;
  auto add = [&](SparseCase s) {
    s.c.seed = 5000 + cases.size();
    cases.push_back(s);
    return &cases.back();
  };
  add(sparse(1, 16, 1, 2048, {3000}, 64))->min_splits = 2;
  add(sparse(2, 128, 1, 2048, {2048, 5000}, 16))->min_splits = 2;
  add(sparse(3, 64, 1, 64, {100, 64, 63}, 64));
  add(sparse(3, 16, 1, 64, {100, 64, 63}, 1));
  add(sparse(4, 8, 2, 128, {300, 129, 128, 127}, 1));
  add(sparse(2, 128, 2, 128, {1000, 130}, 16))->min_splits = 2;
  // The pair's gather (e4m3 rows, two tiles): splits of many blocks, one block, partial blocks.
  add(with_format(sparse(2, 128, 1, 2048, {2048, 5000}, 64), Format::kDsMla))->min_splits = 2;
  // ... over power-of-two scales (DeepSeek's and FlashMLA's quantizers), and over rows of both
  // kinds.
  for (ds_mla::Scales scales : {ds_mla::Scales::kUe8m0, ds_mla::Scales::kMixed}) {
    SparseCase* s = add(with_format(sparse(2, 128, 1, 2048, {2048, 5000}, 64), Format::kDsMla));
    s->min_splits = 2;
    s->scales = scales;
  }
  add(with_format(sparse(3, 128, 1, 64, {100, 64, 63}, 16), Format::kFp8));
  add(with_format(sparse(3, 96, 2, 128, {1000, 129, 127}, 1), Format::kBf16Fp8));
  // The seesaw kernel's unpaired fp8_ds_mla rows loaded ahead (64 heads, one split of 16 blocks
  // and more): requests shorter than top_k, partial blocks, lens per token or request; with more
  // CTAs than SMs, started longest first.
  auto ahead = [&](int B, int q_len, int page_size, TopkLens lens) {
    std::vector<int> seq_lens;
    for (int b = 0; b < B; ++b)
      seq_lens.push_back(b % 7 == 0 ? 300 + 13 * b : 1024 + 29 * b % 1500);
    SparseCase* s = add(
        with_format(sparse(B, 64, q_len, 1024, std::move(seq_lens), page_size), Format::kDsMla));
    s->c.topk_lens = lens;
    s->min_split_blocks = 16;
    s->ordered = B * q_len > 132 && lens != TopkLens::kNone;
  };
  ahead(70, 1, 64, TopkLens::kNone);
  ahead(35, 2, 16, TopkLens::kPerToken);
  ahead(140, 1, 64, TopkLens::kPerRequest);
  for (ds_mla::Scales scales : {ds_mla::Scales::kUe8m0, ds_mla::Scales::kMixed}) {
    ahead(70, 1, 64, TopkLens::kNone);
    cases.back().scales = scales;
  }
  // ... over several splits (kAheadMinBlocks blocks a split and more): a split's first block at
  // a later entry, splits past a short request's extent, a shorter last split.
  auto ahead_splits = [&](int B, int top_k, int page_size, TopkLens lens, int min_splits) {
    std::vector<int> seq_lens;
    for (int b = 0; b < B; ++b) seq_lens.push_back(b % 5 == 0 ? 200 + 41 * b : top_k + 37 * b);
    SparseCase* s =
        add(with_format(sparse(B, 64, 1, top_k, std::move(seq_lens), page_size), Format::kDsMla));
    s->c.topk_lens = lens;
    s->min_splits = min_splits;
    s->min_split_blocks = ::mla::sm90::seesaw::kAheadMinBlocks;
  };
  ahead_splits(33, 1024, 64, TopkLens::kNone, 4);        // 4 splits of 4 blocks
  ahead_splits(44, 1024, 16, TopkLens::kPerToken, 3);    // 6, 6 and 4 blocks
  ahead_splits(16, 2048, 64, TopkLens::kPerRequest, 8);  // 8 splits of 4 blocks
  // The few-rows kernel's rows loaded ahead (e4m3 rows, 16 padded rows): splits, partial blocks.
  add(with_format(sparse(1, 16, 1, 2048, {3000}, 64), Format::kDsMla))->min_splits = 2;
  add(with_format(sparse(3, 8, 2, 64, {100, 64, 63}, 16), Format::kFp8));
  return cases;
}

// The causal bound min(top_k, seq_len - n + i + 1): q_len 2 and 4 with seq_len 1 and 2 (tokens
// that count no entry: out 0, lse -inf), top_k - 1 and top_k + 1.
std::vector<SparseCase> causal_cases() {
  std::vector<SparseCase> cases;
  auto add = [&](SparseCase s) {
    s.c.seed = 5100 + cases.size();
    cases.push_back(s);
    return &cases.back();
  };
  add(sparse(4, 16, 2, 2048, {1, 2, 2047, 2049}, 64));
  add(sparse(2, 64, 2, 2048, {2047, 2049}, 16));
  add(sparse(4, 128, 4, 128, {1, 2, 127, 129}, 16));
  add(sparse(4, 32, 4, 64, {1, 2, 63, 65}, 1))->c.topk_lens = TopkLens::kPerToken;
  return cases;
}

// sparse_topk_lens per request and per token (build(): random in [0, top_k], mostly not multiples
// of 64; request 1 or token 1 gets 0), with top_k not a multiple of 64 too.
std::vector<SparseCase> lens_cases() {
  std::vector<SparseCase> cases;
  auto add = [&](SparseCase s, TopkLens lens) {
    s.c.topk_lens = lens;
    s.c.seed = 5200 + cases.size();
    cases.push_back(s);
  };
  add(sparse(3, 20, 2, 256, {500, 300, 256}, 16), TopkLens::kPerRequest);
  add(sparse(3, 96, 2, 256, {500, 300, 200}, 64), TopkLens::kPerToken);
  add(sparse(4, 48, 1, 1000, {1500, 1200, 999, 40}, 16), TopkLens::kPerRequest);
  add(sparse(2, 8, 1, 2048, {4000, 3000}, 64), TopkLens::kPerToken);
  return cases;
}

// More (token, tile) CTAs than SMs in one split, with sparse_topk_lens: the tokens start longest
// first (schedule/sparse_order_kernel.cu), with lens per token or request, every format.
std::vector<SparseCase> ordered_cases() {
  std::vector<SparseCase> cases;
  auto add = [&](int B, int H, int q_len, int top_k, TopkLens lens, Format f) {
    std::vector<int> seq_lens;
    for (int b = 0; b < B; ++b) seq_lens.push_back(b % 9 == 0 ? 1 + b % 5 : 60 + 97 * b % 700);
    SparseCase s = with_format(sparse(B, H, q_len, top_k, seq_lens, 16 << (cases.size() % 3)), f);
    s.c.topk_lens = lens;
    s.c.seed = 5700 + cases.size();
    s.ordered = true;
    cases.push_back(s);
  };
  add(70, 16, 2, 256, TopkLens::kPerToken, Format::kBf16);
  add(70, 64, 2, 256, TopkLens::kPerToken, Format::kBf16Fp8);
  add(40, 128, 2, 192, TopkLens::kPerRequest, Format::kFp8);
  add(67, 128, 1, 256, TopkLens::kPerToken, Format::kDsMla);
  add(140, 32, 1, 128, TopkLens::kPerRequest, Format::kFp16);
  return cases;
}

// Ragged queries (cum_seq_lens_q; lens per token), requests of 0 query tokens among them, and one
// of seq_len 0 (its token counts nothing).
std::vector<SparseCase> ragged_cases() {
  std::vector<SparseCase> cases;
  auto add = [&](std::vector<int> q_lens, std::vector<int> seq_lens, int H, int top_k, int ps,
                 TopkLens lens, bool hint) {
    SparseCase s = sparse(static_cast<int>(q_lens.size()), H, 1, top_k, std::move(seq_lens), ps);
    s.c.ragged_q_lens = std::move(q_lens);
    s.c.topk_lens = lens;
    s.c.max_q_len_hint = hint;
    s.c.seed = 5300 + cases.size();
    cases.push_back(s);
  };
  add({2, 0, 3, 1}, {200, 50, 129, 3}, 48, 128, 16, TopkLens::kPerToken, false);
  add({0, 1, 4}, {5, 0, 300}, 8, 200, 1, TopkLens::kNone, true);
  add({3, 1, 0}, {299, 1000, 7}, 128, 300, 64, TopkLens::kPerToken, false);
  return cases;
}

// Every head count class: few-rows 16 padded rows (1, 8, 16) and 32 (20, 32); seesaw one tile
// (48 with padding, 64) and two (96 with a partial tile, 128); page sizes 1, 16 and 64.
std::vector<SparseCase> head_cases() {
  std::vector<SparseCase> cases;
  const int page_sizes[] = {1, 16, 64};
  for (int H : {1, 8, 16, 20, 32, 48, 64, 96, 128}) {
    SparseCase s = sparse(2, H, 2, 160, {400, 100}, page_sizes[cases.size() % 3]);
    s.c.seed = 5400 + cases.size();
    cases.push_back(s);
  }
  return cases;
}

// Every (query, kv_cache) pair of the fast path on both kernels (H 16: few-rows, H 128: seesaw,
// paired over e4m3 rows; H 64: seesaw, one tile a token, unpaired).
std::vector<SparseCase> format_cases() {
  std::vector<SparseCase> cases;
  const int page_sizes[] = {16, 64, 1};
  const Format formats[] = {Format::kBf16, Format::kFp16, Format::kBf16Fp8, Format::kFp8,
                            Format::kDsMla};
  for (Format f : formats) {
    for (int H : {16, 128}) {
      SparseCase s = with_format(sparse(2, H, 2, 192, {700, 150}, page_sizes[cases.size() % 3]), f);
      if (f != Format::kFp16 && cases.size() % 4 == 1) s.c.out_dtype = kFp16;
      s.c.topk_lens = H == 16 ? TopkLens::kPerToken : TopkLens::kNone;
      s.c.seed = 5500 + cases.size();
      cases.push_back(s);
    }
  }
  for (Format f : formats) {
    const int i = static_cast<int>(cases.size());
    SparseCase s = with_format(sparse(2, 64, 2, 256, {900, 200}, page_sizes[i % 3]), f);
    s.c.topk_lens = i % 2 == 0 ? TopkLens::kPerToken : TopkLens::kNone;
    s.c.seed = 5500 + i;
    cases.push_back(s);
  }
  return cases;
}

// Per-tensor e4m3 and fp8_ds_mla caches on the few-rows kernel, read as they land
// (route.fp8_direct: the rows gathered as e4m3, tma::gather_e4m3_direct; both query types, the
// error models of tests/common/fp8_mma.h and fp8_ds_mla.h): 16 and 32 padded rows, one to three
// query tokens, partial blocks, sequences shorter than q_len's causal bound leaves room for, pages
// 1 to 256, lens per token or per request, sinks and scale tensors.
std::vector<SparseCase> direct_cases() {
  std::vector<SparseCase> cases;
  const int page_sizes[] = {16, 64, 1, 256};
  // fp8_ds_mla: read as it lands in tiles of 16 heads (docs/sm90-sparse.md): 20 and 32 heads take
  // two.
  for (Format f : {Format::kFp8, Format::kBf16Fp8, Format::kDsMla}) {
    for (int H : {1, 3, 16, 20, 32}) {
      const int n = static_cast<int>(cases.size());
      const int q_len = 1 + n % 3;
      const int top_k = H == 16 ? 2048 : H == 32 ? 320 : 100;
      SparseCase s =
          with_format(sparse(3, H, q_len, top_k, {2500, 70, q_len + 1}, page_sizes[n % 4]), f);
      s.c.topk_lens = n % 3 == 0   ? TopkLens::kPerToken
                      : n % 3 == 1 ? TopkLens::kPerRequest
                                   : TopkLens::kNone;
      s.c.sinks = n % 2 == 0;
      s.c.scale_tensors = n % 4 == 1;
      if (n % 5 == 2) s.c.out_dtype = kFp16;
      s.c.seed = 5700 + n;
      cases.push_back(s);
    }
  }
  return cases;
}

// Sinks (small, dominant), lse off, scales as tensors, bmm scales from flat to peaky, fp16 out,
// padded strides and a 4-D cache, out strides without 16-byte stores; query rows that are not
// 16-byte aligned go to the SIMT kernel.
std::vector<SparseCase> feature_cases() {
  std::vector<SparseCase> cases;
  auto add = [&](SparseCase s) {
    s.c.seed = 5600 + cases.size();
    cases.push_back(s);
    return &cases.back();
  };
  {
    SparseCase s = sparse(3, 64, 1, 128, {300, 200, 100}, 16);
    s.c.sinks = true;
    s.c.scale_tensors = true;
    s.c.bmm1 = 0.3 / 4;
    s.c.bmm2 = 2.5;
    s.c.out_dtype = kFp16;
    add(s);
  }
  {
    SparseCase s = sparse(3, 16, 2, 128, {300, 200, 100}, 64);
    s.c.sinks = true;
    s.c.sink_lo = 8.0;
    s.c.sink_hi = 12.0;
    s.c.lse = false;
    add(s);
  }
  {
    SparseCase s = with_format(sparse(2, 8, 1, 256, {400, 300}, 16), Format::kFp16);
    s.c.sinks = true;
    s.c.sink_lo = -30.0;
    s.c.sink_hi = -20.0;
    s.c.scale_tensors = true;
    add(s);
  }
  // Peaky scores: the running max jumps between blocks, and within one.
  {
    SparseCase s = sparse(1, 128, 1, 512, {600}, 64);
    s.c.bmm1 = 20.0 / 4;
    add(s);
    s = sparse(2, 32, 1, 512, {600, 513}, 16);
    s.c.bmm1 = 2.0 / 4;
    s.c.sinks = true;
    add(s);
  }
  {
    SparseCase s = sparse(2, 128, 1, 256, {500, 300}, 16);
    s.c.strided = true;
    s.c.kv4d = true;
    add(s);
    s = with_format(sparse(2, 16, 2, 128, {300, 100}, 64), Format::kDsMla);
    s.c.strided = true;
    s.c.kv4d = true;
    s.c.sinks = true;
    add(s);
    s = with_format(sparse(2, 128, 1, 128, {300, 100}, 1), Format::kBf16Fp8);
    s.c.strided = true;
    add(s);
  }
  {
    SparseCase s = sparse(2, 96, 1, 128, {300, 100}, 16);
    s.c.out_odd = true;
    s.c.scale_tensors = true;
    add(s);
  }
  {
    // fp8 query rows of 584 bytes (padded strides): not 16-byte aligned, the SIMT kernel.
    SparseCase s = with_format(sparse(2, 16, 2, 128, {300, 100}, 16), Format::kFp8);
    s.c.strided = true;
    s.kernel = Kernel::kSimt;
    add(s);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Blocks, Sm90Sparse, ::testing::ValuesIn(block_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Causal, Sm90Sparse, ::testing::ValuesIn(causal_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Lens, Sm90Sparse, ::testing::ValuesIn(lens_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Ordered, Sm90Sparse, ::testing::ValuesIn(ordered_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Ragged, Sm90Sparse, ::testing::ValuesIn(ragged_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Heads, Sm90Sparse, ::testing::ValuesIn(head_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Formats, Sm90Sparse, ::testing::ValuesIn(format_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Features, Sm90Sparse, ::testing::ValuesIn(feature_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Fp8Direct, Sm90Sparse, ::testing::ValuesIn(direct_cases()), param_name);

// ---- fp8_ds_mla: the gather kernels' rounding, exactly ------------------------------------------

// The allowance of check_sm90_ds_mla is a worst case, far above what the rounding does to random
// data. Against the oracle over the values the gather kernels compute with, bf16(fp32(e4m3 *
// scale)) (fp8_ds_mla::gather_rounded_kv), the result must meet the 16-bit formats' tolerance
// (against the exact oracle the rounding alone exceeds it up to twice: this pins the documented
// rounding, tma/gather.cuh). The latent groups here differ in magnitude (x 1/4, 1, 4 and 1/2, and x
// 1/2, 1 or 2 by row), so that a scale taken from the wrong group or row shows too. Each scale
// choice: amax / 448, powers of two (there the rounded values are the exact ones), and rows of
// both kinds.
TEST(Sm90SparseDsMla, MatchesTheOracleOverBf16RoundedValues) {
  SKIP_WITHOUT_HOPPER();
  auto spread_groups = [](Built& b) {  // on the oracle's values, which use_fp8_ds_mla encodes
    const double group[] = {0.25, 1.0, 4.0, 0.5};
    const int64_t rows = static_cast<int64_t>(b.in.kv.size()) / b.D;
    for (int64_t slot = 0; slot < rows; ++slot) {
      const double row = std::ldexp(1.0, static_cast<int>(slot % 3) - 1);
      for (int d = 0; d < ds_mla::kLatent; ++d) {
        b.in.kv[slot * b.D + d] *= group[d / ds_mla::kGroup] * row;
      }
    }
  };
  for (ds_mla::Scales scales :
       {ds_mla::Scales::kAmax, ds_mla::Scales::kUe8m0, ds_mla::Scales::kMixed}) {
    for (int H : {16, 128}) {
      SparseCase s = with_format(sparse(3, H, 2, 256, {900, 300, 100}, 16), Format::kDsMla);
      s.c.sinks = H == 16;
      s.c.seed = 5700 + H + 10 * static_cast<int>(scales);
      s.scales = scales;
      SCOPED_TRACE(name_of(s));
      Prepared p = prepare(s, spread_groups);
      DeviceCall call(*p.b, p.kv_bytes());
      const Route route = route_on_device(call.params);
      expect_route(route, s);
      ASSERT_TRUE(run_on_gpu(call.params));
      call.download(*p.b);
      if (sm90_ds_direct(route)) {
        // The direct route computes with the exact values (check_sm90_ds_mla: its allowance for the
        // fp16 query's and P's rounding below their normal ranges).
        check_sm90_ds_mla(*p.b, route, p.cache);
      } else {
        p.b->in.kv = ds_mla::gather_rounded_kv(p.b->in);
        check_sm90(*p.b);
      }
    }
  }
}

// ---- Skip-softmax -----------------------------------------------------------------------------

// f = 1e-30 must give the result without skipping (contract section 2.3): the same bits as the
// call without it (which also repeats bitwise), and the oracle's values.
TEST(Sm90SparseSkipSoftmax, TinyFactorGivesTheResultWithoutSkipping) {
  SKIP_WITHOUT_HOPPER();
  for (int H : {16, 128}) {
    SparseCase s = sparse(2, H, H == 16 ? 2 : 1, 512, {700, 400}, 64);
    s.c.sinks = true;
    s.c.seed = 5800 + H;
    SCOPED_TRACE(name_of(s));
    Prepared p = prepare(s);
    DeviceCall call(*p.b, p.kv_bytes());
    const Route route = route_on_device(call.params);
    expect_route(route, s);
    std::vector<uint8_t> out0, lse0;
    for (float f : {0.0f, 0.0f, 1e-30f}) {
      p.b->reset_outputs(11);
      call.upload(*p.b);
      call.params.skip_softmax_threshold_scale_factor = f;
      ASSERT_TRUE(run_on_gpu(call.params));
      call.download(*p.b);
      check(p, route);
      if (out0.empty()) {
        out0 = p.b->out.bytes();
        lse0 = p.b->lse.bytes();
        continue;
      }
      EXPECT_TRUE(out0 == p.b->out.bytes()) << "out differs (f " << f << ")";
      EXPECT_TRUE(lse0 == p.b->lse.bytes()) << "lse differs (f " << f << ")";
    }
  }
}

// ---- CUDA graphs (contract section 6) ----------------------------------------------------------

// One run captured in a graph, replayed with new inputs in the same buffers: new indices (with -1
// entries and lists of -1 only), new per-token lens, a new query, new cache rows (the rows no
// entry names NaN anew), and for per-tensor e4m3 caches new scale tensor values
// (common/graph_replay.h). Every replay matches the oracle with its format's tolerance, and every
// row that attends keys differs from the previous replay's: a kernel that read indices, lens,
// scales or cache rows as they were at the capture (or at an earlier replay) fails.
class Sm90SparseGraph : public ::testing::TestWithParam<SparseCase> {};

TEST_P(Sm90SparseGraph, ReplaysReadNewIndicesLensAndCacheRows) {
  SKIP_WITHOUT_HOPPER();
  const SparseCase& s = GetParam();
  Prepared p = prepare(s);
  DeviceCall call(*p.b, p.kv_bytes());
  const Route route = route_on_device(call.params);
  expect_route(route, s);
  CapturedRun graph;
  ASSERT_TRUE(graph.capture(call.params));
  std::vector<uint8_t> cache = p.cache;  // the replay's fp8_ds_mla bytes (make, then check)
  auto make = [&](int k, std::vector<uint8_t>& kv_bytes) {
    SparseCase next = s;
    next.c = replay_case(s.c, k);
    Prepared q = prepare(next);
    cache = q.cache;
    kv_bytes = std::move(q.cache);
    return std::move(q.b);
  };
  replay_with_new_inputs(call, graph, *p.b, 3, make,
                         [&](const Built& b) { check(b, s.ds_mla, route, cache); });
}

// Work split across the SMs (at least two splits per token) on both kernels: top_k 2048 (32 blocks
// per token) with per-token lens over a bf16 cache, and the caches whose values the gather
// dequantizes: fp8_ds_mla (its rows' own scales) and per-tensor e4m3 (bf16 or e4m3 query) with
// bmm1 and bmm2 as device tensors.
std::vector<SparseCase> graph_cases() {
  std::vector<SparseCase> cases;
  auto add = [&](SparseCase s, TopkLens lens, bool scale_tensors) {
    s.c.topk_lens = lens;
    s.c.scale_tensors = scale_tensors;
    s.c.seed = 6000 + cases.size();
    s.min_splits = 2;
    cases.push_back(s);
  };
  add(sparse(2, 128, 2, 2048, {3000, 2500}, 64), TopkLens::kPerToken, false);
  add(sparse(2, 16, 2, 2048, {4000, 3000}, 16), TopkLens::kPerToken, false);
  add(with_format(sparse(2, 64, 2, 2048, {3000, 2049}, 64), Format::kDsMla), TopkLens::kPerToken,
      false);
  add(with_format(sparse(2, 128, 1, 1024, {1500, 1100}, 1), Format::kDsMla), TopkLens::kNone,
      false);
  add(with_format(sparse(2, 128, 2, 512, {900, 600}, 16), Format::kFp8), TopkLens::kPerToken, true);
  add(with_format(sparse(2, 16, 2, 2048, {3000, 2100}, 64), Format::kBf16Fp8), TopkLens::kPerToken,
      true);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Replays, Sm90SparseGraph, ::testing::ValuesIn(graph_cases()), param_name);

// ---- Non-finite inputs (contract section 1.2) -------------------------------------------------

// A NaN or inf in an attended row, a query row or a scale turns exactly the rows that attend it
// NaN (out and lse); rows no entry names hold NaN in every case above. One shape per kernel and
// format class: B 3, q_len 2, top_k 128 (request 0's tokens count 128 entries; token 2, request
// 1's first, holds only -1: build()).
struct NanRoute {
  const char* name;
  SparseCase s;
};

std::vector<NanRoute> nan_routes() {
  std::vector<NanRoute> routes;
  auto add = [&](const char* name, int H, Format f) {
    SparseCase s = with_format(sparse(3, H, 2, 128, {300, 200, 150}, 16), f);
    s.c.seed = 5900 + routes.size();
    routes.push_back({name, s});
  };
  add("few_rows", 16, Format::kBf16);
  add("seesaw", 128, Format::kBf16);
  add("few_rows_fp16", 32, Format::kFp16);
  add("few_rows_fp8", 16, Format::kFp8);
  add("seesaw_bf16_fp8", 64, Format::kBf16Fp8);
  add("few_rows_ds_mla", 16, Format::kDsMla);
  add("seesaw_ds_mla", 96, Format::kDsMla);
  return routes;
}

// Value d of pool row `slot` becomes NaN, or +inf where the cache stores it in a 16-bit type.
void poison_cache_value(Prepared& p, int64_t slot, int d, bool inf) {
  if (p.ds_mla) {
    ds_mla::poison_value(*p.b, p.cache, slot, d, inf);
  } else {
    poison_slot(*p.b, slot, d, inf);
  }
}

// The slot of token t's first entry at or after entry e that the token attends (counted, not -1).
int64_t attended_entry(const Built& b, int t, int e) {
  const std::vector<int64_t> set = attended_by_token(b)[t];
  for (; e < b.c.top_k; ++e) {
    const int32_t slot = b.sparse_indices[t * b.c.top_k + e];
    if (std::find(set.begin(), set.end(), slot) != set.end()) return slot;
  }
  ADD_FAILURE() << "token " << t << " attends no entry from " << e;
  return 0;
}

// Runs the call with out and lse prefilled with a finite value (a row left unwritten cannot pass
// for NaN); returns the reference's NaN rows, each of which must be NaN in out and lse.
int64_t run_with_nan_rows(Prepared& p, const SparseCase& s) {
  fill_outputs(*p.b, 12345.0);
  DeviceCall call(*p.b, p.kv_bytes());
  const Route route = route_on_device(call.params);
  expect_route(route, s);
  EXPECT_TRUE(run_on_gpu(call.params));
  call.download(*p.b);
  if (p.ds_mla && route.kernel != Kernel::kSimt) {
    const mla_test::RowAllowance rounding = sm90_ds_direct(route)
                                                ? ds_direct_allowance(*p.b, p.cache)
                                                : ds_mla::dequant_rounding_allowance(p.b->in);
    return check_nan_rows_against_oracle(*p.b, sm90_p_rel(*p.b), &rounding);
  }
  if (p.ds_mla) return check_nan_rows_against_oracle(*p.b, mla_test::p_rounding_rel(s.c.out_dtype));
  const mla_test::RowAllowance extra = sm90_allowance(*p.b);
  return check_nan_rows_against_oracle(*p.b, sm90_p_rel(*p.b), &extra, sm90_fp16_p(*p.b));
}

TEST(Sm90SparseNaN, KeysValuesQueriesAndScales) {
  SKIP_WITHOUT_HOPPER();
  for (const NanRoute& route : nan_routes()) {
    SCOPED_TRACE(route.name);
    const SparseCase& s = route.s;
    const int H = s.c.H;
    const bool fp8_query = s.c.q_dtype == kFp8;
    {
      Prepared p = prepare(s);
      const int64_t slot = attended_entry(*p.b, 0, 0);
      poison_cache_value(p, slot, 7, false);  // a latent value: K and V
      EXPECT_EQ(run_with_nan_rows(p, s), H * tokens_attending(*p.b, slot)) << "NaN in a key";
    }
    {
      Prepared p = prepare(s);
      const int64_t slot = attended_entry(*p.b, 3, 40);  // request 1's token 1
      poison_cache_value(p, slot, 0, true);              // inf (NaN in e4m3) in a value
      EXPECT_EQ(run_with_nan_rows(p, s), H * tokens_attending(*p.b, slot)) << "inf in a value";
    }
    if (s.ds_mla) {
      Prepared p = prepare(s);
      const int64_t slot = attended_entry(*p.b, 1, 10);
      ds_mla::poison_scale(*p.b, p.cache, slot, 2);
      EXPECT_EQ(run_with_nan_rows(p, s), H * tokens_attending(*p.b, slot)) << "inf scale";
    }
    {
      Prepared p = prepare(s);
      poison_query(*p.b, 1, 2, 5);  // request 0, token 1, head 2
      EXPECT_EQ(run_with_nan_rows(p, s), 1) << "NaN in a query row";
    }
    {
      Prepared p = prepare(s);
      poison_query(*p.b, 4, H - 1, 530, /*inf=*/!fp8_query);  // request 2, token 0, rope part
      EXPECT_EQ(run_with_nan_rows(p, s), 1) << "inf in a query row";
    }
    for (int which : {1, 2}) {
      SparseCase t = s;
      t.c.scale_tensors = true;
      Prepared p = prepare(t);
      (which == 1 ? p.b->bmm1_value : p.b->bmm2_value) = std::numeric_limits<float>::quiet_NaN();
      (which == 1 ? p.b->in.bmm1_scale : p.b->in.bmm2_scale) = std::nan("");
      int64_t rows_with_keys = 0;
      for (const std::vector<int64_t>& set : attended_by_token(*p.b)) {
        rows_with_keys += set.empty() ? 0 : H;
      }
      EXPECT_EQ(run_with_nan_rows(p, t), rows_with_keys) << "NaN bmm" << which << "_scale";
    }
  }
}

// An inf in the rope part of an attended key makes its score +inf or -inf, by the sign of the
// query's value: either way the row turns NaN (contract section 1.2), also where the score is
// -inf and P would be 0. The key sits in a block without -1 entries (token 0's first 64 entries
// hold none here), where no score needs a mask, and in no other block of token 0. 16-bit ropes
// only (e4m3 has no inf).
TEST(Sm90SparseNaN, InfInTheRopeOfAnAttendedKey) {
  SKIP_WITHOUT_HOPPER();
  for (const NanRoute& route : nan_routes()) {
    const SparseCase& s = route.s;
    if (s.c.kv_dtype == kFp8) continue;
    SCOPED_TRACE(route.name);
    auto fill_first_block = [](Built& b) {
      const int32_t live = static_cast<int32_t>(attended_entry(b, 0, 0));
      for (int e = 0; e < 64; ++e) {
        int32_t& slot = b.sparse_indices[e];
        if (slot < 0) slot = live;  // a repeat of a live slot
        b.in.sparse_indices[e] = slot;
      }
    };
    Prepared p = prepare(s, fill_first_block);
    // A slot of that block that token 0 names nowhere else (its later blocks hold -1 entries).
    const std::vector<int32_t>& entries = p.b->sparse_indices;
    const int K = s.c.top_k;
    int64_t slot = -1;
    for (int e = 0; e < 64 && slot < 0; ++e) {
      if (std::count(entries.begin() + 64, entries.begin() + K, entries[e]) == 0) slot = entries[e];
    }
    ASSERT_GE(slot, 0);
    poison_cache_value(p, slot, 540, true);
    EXPECT_EQ(run_with_nan_rows(p, s), s.c.H * tokens_attending(*p.b, slot));
  }
}

}  // namespace
