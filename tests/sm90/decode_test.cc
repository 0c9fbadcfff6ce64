// Sweeps of mla::decode on the sm90 backend against the float64 oracle, on the GPU.
//
// Inputs are built on the host with the cpu tests' hygiene (common/decode_case.h: NaN-poisoned out
// and lse, NaN KV past seq_len and in unused pages, invalid ids in unused block_tables slots,
// garbage workspace), copied to the device, decoded there, copied back and compared element by
// element. Every test skips itself where no CUDA device of compute capability 9.0 is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/decode_case.h"
#include "common/device_call.h"
#include "common/fp8_ds_mla.h"
#include "common/graph_replay.h"
#include "common/hopper.h"
#include "common/test_util.h"
#include "host/backends.h"
#include "mla/mla.h"
#include "oracle/oracle.h"
#include "sm90/host/route.h"

namespace {

using namespace mla_test::decode_case;  // Case, Built, build, checks
using namespace mla_test::gpu;          // DeviceCall, run_on_gpu, deepseek, check_sm90
using mla::detail::sm90::Kernel;
using mla::detail::sm90::Route;

const DataType kBf16 = dt::kBFloat16, kFp16 = dt::kFloat16, kFp8 = dt::kFloat8E4M3;

using mla_test::has_hopper;

class Sm90Decode : public ::testing::TestWithParam<Case> {};

TEST_P(Sm90Decode, MatchesOracle) {
  SKIP_WITHOUT_HOPPER();
  std::unique_ptr<Built> b = build(GetParam());
  DeviceCall call(*b);
  ASSERT_TRUE(run_on_gpu(call.params));
  call.download(*b);
  check_sm90(*b);
}

std::string param_name(const ::testing::TestParamInfo<Case>& info) {
  return case_name(info.param) + "_" + std::to_string(info.index);
}

// ---- Case lists -------------------------------------------------------------------------------

// Heads x q_len, each with a page size in rotation; seq_lens include 0, 1 (below q_len) and a
// long one.
std::vector<Case> shape_cases() {
  std::vector<Case> cases;
  const int page_sizes[] = {1, 16, 64, 256};
  int n = 0;
  for (int H : {1, 3, 16, 64, 128}) {
    for (int q_len = 1; q_len <= 4; ++q_len) {
      Case c;
      c.B = 4;
      c.H = H;
      c.q_len = q_len;
      c.page_size = page_sizes[n++ % 4];
      c.seed = 2000 + cases.size();
      mla_test::Rng rng(c.seed);
      c.seq_lens = {rng.randint(100, 700), 0, 1, 2 * c.page_size + 3};
      cases.push_back(deepseek(c));
    }
  }
  for (int ps : {1, 16, 64, 256}) {  // every page size with 16 heads and two query tokens
    Case c;
    c.B = 3;
    c.H = 16;
    c.q_len = 2;
    c.page_size = ps;
    c.seq_lens = {300, 2 * ps, 65};
    c.seed = 2100 + cases.size();
    cases.push_back(deepseek(c));
  }
  Case c;  // q_len 16, some sequences shorter than it
  c.B = 3;
  c.H = 16;
  c.q_len = 16;
  c.page_size = 64;
  c.seq_lens = {500, 5, 16};
  c.seed = 2200;
  cases.push_back(deepseek(c));
  // Long sequences: many splits; mixed batch.
  c = Case();
  c.B = 3;
  c.H = 16;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = {4000, 2500, 33};
  c.seed = 2201;
  cases.push_back(deepseek(c));
  c.H = 128;
  c.B = 1;
  c.seq_lens = {3000};
  c.q_len = 2;
  c.page_size = 16;
  c.seed = 2202;
  cases.push_back(deepseek(c));
  return cases;
}

std::vector<Case> ragged_cases() {
  std::vector<Case> cases;
  auto add = [&](std::vector<int> q_lens, std::vector<int> seq_lens, int H, int ps, bool hint) {
    Case c;
    c.B = static_cast<int>(q_lens.size());
    c.ragged_q_lens = q_lens;
    c.seq_lens = seq_lens;
    c.H = H;
    c.page_size = ps;
    c.max_q_len_hint = hint;
    c.seed = 2300 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  add({1, 3, 0, 5}, {200, 3, 50, 2}, 16, 16, false);
  add({1, 3, 0, 5}, {200, 3, 50, 2}, 16, 16, true);
  add({2, 2, 2}, {65, 1, 130}, 3, 64, true);
  add({0, 0, 4}, {0, 10, 70}, 16, 1, false);
  add({40, 3}, {300, 50}, 3, 256, true);
  add({1, 2, 3, 4, 5}, {9, 0, 1500, 4, 5}, 128, 16, false);
  Case* c = add({3, 1, 2}, {120, 77, 1}, 16, 16, false);
  c->q_dtype = c->kv_dtype = kFp8;
  c = add({2, 5, 1}, {100, 64, 33}, 64, 64, true);
  c->out_dtype = kFp16;
  c->sinks = true;
  return cases;
}

std::vector<Case> dtype_cases() {
  std::vector<Case> cases;
  const std::pair<DataType, DataType> pairs[] = {
      {kBf16, kBf16}, {kFp16, kFp16}, {kFp8, kFp8}, {kBf16, kFp8}};
  for (auto [q, kv] : pairs) {
    for (DataType out : {kBf16, kFp16}) {
      for (bool lse : {true, false}) {
        Case c;
        c.B = 3;
        c.H = 16;
        c.q_len = 2;
        c.seq_lens = {650, 1, 33};
        c.q_dtype = q;
        c.kv_dtype = kv;
        c.out_dtype = out;
        c.lse = lse;
        c.seed = 2400 + cases.size();
        cases.push_back(deepseek(c));
      }
    }
  }
  return cases;
}

// Calls of enough query rows that the SIMT kernel runs one split and writes out and lse itself (no
// partials, no combine): fp8 caches, sparse mode, pages below 16; with sinks, lse and ragged
// queries.
// The other head dims FlashInfer's API takes, (256, 64) and (512, 0): every dtype pair, dense
// (causal, masks, sinks), ragged and sparse (the TMA and gather kernels; Sm90DecodeHeadDims asserts
// the routes).
std::vector<Case> head_dim_cases() {
  std::vector<Case> cases;
  const std::pair<DataType, DataType> pairs[] = {
      {kBf16, kBf16}, {kFp16, kFp16}, {kFp8, kFp8}, {kBf16, kFp8}};
  for (auto [L, R] : {std::pair{256, 64}, std::pair{512, 0}}) {
    for (auto [q, kv] : pairs) {
      Case c;
      c.L = L;
      c.R = R;
      c.B = 3;
      c.H = q == kBf16 ? 128 : 16;
      c.q_len = 2;
      c.seq_lens = {700, 1, 0};
      c.q_dtype = q;
      c.kv_dtype = kv;
      c.sinks = kv == kBf16;
      c.mask = q == kFp16 ? Mask::kU32 : Mask::kNone;
      c.seed = 4600 + cases.size();
      cases.push_back(c);
    }
    Case c;  // ragged, sparse with per-token lens
    c.L = L;
    c.R = R;
    c.B = 3;
    c.H = 64;
    c.ragged_q_lens = {2, 1, 3};
    c.seq_lens = {90, 40, 5};
    c.top_k = 64;
    c.topk_lens = oracle::TopkLens::kPerToken;
    c.seed = 4600 + cases.size();
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> one_split_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 4100 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  for (auto [q, kv] : {std::pair{kFp8, kFp8}, std::pair{kBf16, kFp8}}) {
    Case c;
    c.B = 40;
    c.H = 64;
    c.q_len = 2;
    c.seq_lens.clear();
    for (int r = 0; r < c.B; ++r) c.seq_lens.push_back(r % 7 == 0 ? r % 3 : 30 + 37 * r % 250);
    c.q_dtype = q;
    c.kv_dtype = kv;
    c.sinks = true;
    add(c);
  }
  {
    Case c;  // pages of 8: the SIMT kernel for every dtype
    c.B = 36;
    c.H = 128;
    c.q_len = 1;
    c.page_size = 8;
    c.seq_lens.clear();
    for (int r = 0; r < c.B; ++r) c.seq_lens.push_back(1 + 29 * r % 200);
    c.out_dtype = kFp16;
    add(c);
  }
  {
    Case c;  // sparse, ragged, draft tokens near the start (the causal bound)
    c.B = 30;
    c.H = 64;
    c.ragged_q_lens.clear();
    c.seq_lens.clear();
    for (int r = 0; r < c.B; ++r) {
      c.ragged_q_lens.push_back(1 + r % 4);
      c.seq_lens.push_back(1 + r % 4 + r % 5);
    }
    c.top_k = 8;
    c.topk_lens = oracle::TopkLens::kPerToken;
    c.q_dtype = kBf16;
    c.kv_dtype = kFp8;
    add(c);
  }
  return cases;
}

std::vector<Case> feature_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 2500 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  // Masks, both layouts, dense and ragged (40 tokens: two words per row).
  for (Mask m : {Mask::kU32, Mask::kU16}) {
    for (int q_len : {1, 3, 5}) {
      Case c;
      c.B = 4;
      c.H = 16;
      c.q_len = q_len;
      c.page_size = q_len == 3 ? 1 : 16;
      c.mask = m;
      c.seq_lens = {180, 0, 2, q_len + 3};
      add(c);
    }
    Case c;
    c.B = 3;
    c.H = 3;
    c.ragged_q_lens = {40, 3, 0};
    c.seq_lens = {300, 2, 9};
    c.page_size = 64;
    c.mask = m;
    c.sinks = m == Mask::kU16;
    add(c);
  }
  // Sinks from small to dominant.
  const std::pair<double, double> sink_ranges[] = {{-2.0, 3.0}, {8.0, 12.0}, {-30.0, -20.0}};
  for (auto [lo, hi] : sink_ranges) {
    Case c;
    c.B = 3;
    c.H = 16;
    c.q_len = 3;
    c.seq_lens = {0, 90, 2};
    c.sinks = true;
    c.sink_lo = lo;
    c.sink_hi = hi;
    c.out_dtype = lo > 0 ? kFp16 : kBf16;
    add(c);
  }
  // Scales as host floats and device tensors, flat to peaky.
  const std::pair<double, double> scales[] = {{0.05, 1.0}, {0.3, 0.37}, {2.0, 3.0}, {20.0, 1.0}};
  for (bool tensors : {false, true}) {
    for (auto [bmm1, bmm2] : scales) {
      Case c;
      c.B = 3;
      c.H = 16;
      c.q_len = 2;
      c.seq_lens = {700, 17, 0};
      c.bmm1 = bmm1 / 4;  // D 576: scores grow with D
      c.bmm2 = bmm2;
      c.scale_tensors = tensors;
      c.sinks = bmm1 == 2.0;
      add(c);
    }
  }
  // Peaky scores on the seesaw kernel (balanced schedule and direct split): the running max jumps
  // past its slack mid-request and moves within it too.
  for (double bmm1 : {2.0, 20.0}) {
    Case c;
    c.B = bmm1 == 2.0 ? 2 : 1;
    c.H = bmm1 == 2.0 ? 128 : 64;
    c.q_len = bmm1 == 2.0 ? 1 : 2;
    c.seq_lens = bmm1 == 2.0 ? std::vector<int>{3000, 650} : std::vector<int>{5000};
    c.bmm1 = bmm1 / 4;
    add(c);
  }
  // Sparse: lens none / per request / per token, dense and ragged queries.
  using oracle::TopkLens;
  for (TopkLens lens : {TopkLens::kNone, TopkLens::kPerRequest, TopkLens::kPerToken}) {
    for (int q_len : {1, 4}) {
      Case c;
      c.B = 3;
      c.H = q_len == 1 ? 128 : 16;
      c.q_len = q_len;
      c.top_k = q_len == 1 ? 256 : 100;
      c.page_size = q_len == 1 ? 64 : 1;
      c.topk_lens = lens;
      c.seq_lens = {1, 38, 75};
      add(c);
    }
  }
  for (TopkLens lens : {TopkLens::kNone, TopkLens::kPerToken}) {
    Case c;
    c.B = 3;
    c.H = 16;
    c.ragged_q_lens = {2, 0, 3};
    c.top_k = 64;
    c.page_size = 16;
    c.topk_lens = lens;
    c.seq_lens = {1, 38, 75};
    c.q_dtype = kBf16;
    c.kv_dtype = kFp8;
    add(c);
  }
  // Skip-softmax with f = 1e-30 must give the dense result.
  {
    Case c;
    c.B = 6;
    c.H = 16;
    c.q_len = 1;
    c.seq_lens = {3000, 65, 64, 63, 0, 1};
    c.skip = 1e-30f;
    add(c);
    c.q_len = 3;
    c.page_size = 64;
    c.bmm1 = 0.3;
    c.sinks = true;
    add(c);
    c = Case();
    c.B = 2;
    c.H = 16;
    c.q_len = 2;
    c.seq_lens = {400, 250};
    c.top_k = 200;
    c.skip = 1e-30f;
    add(c);
  }
  // Padded strides on query, kv pages and rows, block_tables and out; 4-D kv.
  for (bool strided : {false, true}) {
    for (bool kv4d : {false, true}) {
      for (bool ragged : {false, true}) {
        if (!strided && !kv4d) continue;
        Case c;
        c.B = 3;
        c.H = 16;
        c.q_len = 3;
        if (ragged) c.ragged_q_lens = {3, 0, 2};
        c.seq_lens = {200, 5, 1};
        c.strided = strided;
        c.kv4d = kv4d;
        c.q_dtype = c.kv_dtype = (cases.size() % 2) ? kFp8 : kBf16;
        c.sinks = ragged;
        c.mask = ragged ? Mask::kU16 : Mask::kNone;
        add(c);
      }
    }
  }
  return cases;
}

// Random combinations of every feature at once (fixed seeds).
std::vector<Case> mixed_cases() {
  const MixedSpace space{{1, 3, 16, 64, 128},
                         {1, 16, 64, 256},
                         {kBf16, kFp16, kFp8, kBf16},
                         {kBf16, kFp16, kFp8, kFp8},
                         1200,
                         0.02,
                         0.5};
  std::vector<Case> cases;
  for (int n = 0; n < 24; ++n) cases.push_back(deepseek(mixed_case(2700 + n, space)));
  return cases;
}

// The TMA kernels' configurations (16-bit query and kv_cache, page_size >= 16, aligned strides):
// every head count through one or several 64-row tiles, page sizes 16 to 256, partial last blocks,
// many splits, masks, ragged queries, sinks, skip-softmax and padded strides.
std::vector<Case> tma_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 2800 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  const int page_sizes[] = {16, 32, 64, 256};
  int n = 0;
  for (int H : {1, 16, 64, 128}) {
    for (int q_len : {1, 2, 4, 16}) {
      Case c;
      c.B = 3;
      c.H = H;
      c.q_len = q_len;
      c.page_size = page_sizes[n++ % 4];
      c.seq_lens = {q_len == 16 ? 700 : 1500, 0, q_len > 1 ? q_len - 1 : 1};
      if (n % 3 == 0) c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
      add(c);
    }
  }
  for (const int H : {32, 16, 8}) {
    Case c;  // 64 / H tokens a tile, a request's last tile past its q_len tokens (read as zeros)
    c.B = 3;
    c.H = H;
    c.q_len = H == 8 ? 5 : 3;
    c.page_size = 64;
    c.seq_lens = {1500, 70, c.q_len};
    if (H == 16) c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
    add(c);
  }
  {
    Case c;  // long sequences, many splits; lengths around block and page edges
    c.B = 5;
    c.H = 128;
    c.q_len = 1;
    c.page_size = 64;
    c.seq_lens = {6000, 64, 65, 127, 129};
    add(c);
    c.page_size = 32;
    c.q_len = 2;
    c.seq_lens = {5001, 63, 2, 1, 96};
    c.sinks = true;
    add(c);
    c.B = 1;
    c.H = 16;
    c.q_len = 1;
    c.page_size = 256;
    c.seq_lens = {9000};
    c.sinks = false;
    add(c);
  }
  for (Mask m : {Mask::kU32, Mask::kU16}) {
    Case c;
    c.B = 3;
    c.H = m == Mask::kU32 ? 128 : 16;
    c.q_len = 5;
    c.page_size = 32;
    c.mask = m;
    c.seq_lens = {400, 3, 70};
    add(c);
  }
  {
    Case c;  // ragged, with and without the max_q_len hint
    c.B = 4;
    c.H = 64;
    c.ragged_q_lens = {1, 7, 0, 16};
    c.seq_lens = {300, 7, 5, 200};
    c.page_size = 16;
    c.max_q_len_hint = true;
    add(c);
    c.H = 128;
    c.ragged_q_lens = {2, 1, 3, 1};
    c.seq_lens = {1000, 1, 2, 0};
    c.max_q_len_hint = false;
    c.mask = Mask::kU32;
    c.sinks = true;
    add(c);
  }
  {
    Case c;  // scales as tensors, lse off, fp16 out, skip-softmax with the dense result
    c.B = 3;
    c.H = 128;
    c.q_len = 2;
    c.page_size = 64;
    c.seq_lens = {2000, 33, 700};
    c.scale_tensors = true;
    c.bmm1 = 0.3;
    c.bmm2 = 2.5;
    c.lse = false;
    c.out_dtype = kFp16;
    add(c);
    c.skip = 1e-30f;
    c.lse = true;
    c.scale_tensors = false;
    add(c);
  }
  for (bool kv4d : {false, true}) {  // padded strides (16-byte multiples), 3-D and 4-D kv
    Case c;
    c.B = 3;
    c.H = 128;
    c.q_len = 2;
    c.page_size = kv4d ? 16 : 64;
    c.seq_lens = {900, 2, 129};
    c.strided = true;
    c.kv4d = kv4d;
    c.sinks = kv4d;
    add(c);
  }
  for (const int H : {100, 40}) {
    Case c;  // padding rows in the last 64-row tile, some sharing a thread with a real row
    c.B = 3;
    c.H = H;
    c.q_len = H == 40 ? 3 : 1;
    c.page_size = H == 40 ? 16 : 64;
    c.seq_lens = {1500, 777, 65};
    if (H == 40) c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
    add(c);
  }
  return cases;
}

// The combine at its limits: one request with the most splits the policy gives (64 splits of two
// tiles at H = 128, 128 two-block splits at H = 16), long and short requests in one batch (the
// short ones' splits mostly empty), ragged queries over long sequences, an fp8 cache with many
// splits, and the SIMT kernel (pages of 8) with many splits.
std::vector<Case> split_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 3000 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  Case c;
  c.B = 1;
  c.H = 128;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = {8192};
  add(c);
  c.H = 16;
  c.sinks = true;
  c.seq_lens = {16384};  // the few-rows kernel's splits take two blocks each: 128 splits
  add(c);
  c.H = 128;
  c.sinks = false;
  c.seq_lens = {8191};
  c.out_dtype = kFp16;
  c.q_dtype = c.kv_dtype = kFp16;
  add(c);
  c = Case();  // varlen: one long request, the others far shorter (empty splits)
  c.B = 4;
  c.H = 64;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = {7000, 65, 0, 1};
  add(c);
  c = Case();  // ragged queries over long sequences, with and without the max_q_len hint
  c.B = 3;
  c.H = 16;
  c.ragged_q_lens = {1, 3, 2};
  c.seq_lens = {6000, 4100, 2};
  c.page_size = 32;
  c.max_q_len_hint = true;
  add(c);
  c.H = 128;
  c.ragged_q_lens = {2, 0, 1};
  c.seq_lens = {5000, 0, 3000};
  c.max_q_len_hint = false;
  add(c);
  c = Case();  // an fp8 cache (the few-rows kernel, widened): 128 splits
  c.B = 1;
  c.H = 16;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = {9000};
  c.q_dtype = c.kv_dtype = kFp8;
  add(c);
  c.q_dtype = kBf16;  // bf16 query over an fp8 cache
  c.H = 128;
  c.seq_lens = {9001};
  add(c);
  c = Case();  // the SIMT kernel (pages of 8): its own policy, many splits
  c.B = 1;
  c.H = 16;
  c.q_len = 1;
  c.page_size = 8;
  c.seq_lens = {9000};
  add(c);
  return cases;
}

// The few-rows kernel (H x max_q_len <= 32 rows per request, N = 16 or 32): every head count it
// takes with one and two query tokens, page sizes, seq_lens 0, 1 and long (many splits, odd block
// counts), masks, ragged queries, sinks, lse off, scale tensors, skip-softmax and padded strides.
std::vector<Case> few_rows_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 3100 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  const int page_sizes[] = {16, 64, 256, 32};
  int n = 0;
  for (int H : {1, 3, 8, 16, 32}) {
    for (int q_len : {1, 2}) {
      if (H * q_len > 32) continue;
      Case c;
      c.B = 4;
      c.H = H;
      c.q_len = q_len;
      c.page_size = page_sizes[n % 4];
      c.seq_lens = {n % 2 ? 3000 : 700, 0, 1, 64 * (n % 3) + 65};
      if (n % 3 == 1) c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
      if (n % 4 == 2) c.sinks = true;
      if (n % 4 == 3) c.lse = false;
      ++n;
      add(c);
    }
  }
  for (Mask m : {Mask::kU32, Mask::kU16}) {
    Case c;
    c.B = 3;
    c.H = m == Mask::kU32 ? 16 : 8;
    c.q_len = 2;
    c.page_size = 64;
    c.mask = m;
    c.seq_lens = {900, 2, 70};
    add(c);
  }
  {
    Case c;  // ragged, rows per request up to 32 (H 8 x 4 tokens), with the max_q_len hint
    c.B = 4;
    c.H = 8;
    c.ragged_q_lens = {1, 4, 0, 3};
    c.seq_lens = {2000, 4, 50, 129};
    c.page_size = 16;
    c.max_q_len_hint = true;
    c.sinks = true;
    add(c);
    c.mask = Mask::kU32;
    c.H = 16;
    c.ragged_q_lens = {2, 1, 2, 0};
    c.seq_lens = {700, 1, 3, 0};
    add(c);
  }
  {
    Case c;  // one long request: the most splits; scale tensors; skip-softmax (dense result)
    c.B = 1;
    c.H = 32;
    c.q_len = 1;
    c.page_size = 64;
    c.seq_lens = {16001};
    c.scale_tensors = true;
    c.skip = 1e-30f;
    add(c);
    c.H = 16;
    c.bmm1 = 0.3;
    c.bmm2 = 2.5;
    c.scale_tensors = false;
    c.seq_lens = {8192};
    add(c);
  }
  {
    // The balanced schedule at mixed lengths (0 to 7000 keys): parts of several segments,
    // requests over several parts (merged by the combine), one-segment requests (out and lse from
    // the kernel), segments of one block (consumer 1 without a block); then fp8 caches, both query
    // types, at 16 and 32 padded rows.
    Case c;
    c.B = 48;
    c.H = 16;
    c.q_len = 2;
    c.page_size = 64;
    mla_test::Rng rng(8);
    for (int b = 0; b < c.B; ++b) c.seq_lens.push_back(rng.randint(0, 7000));
    c.seq_lens[1] = 0;
    c.seq_lens[2] = 1;
    c.seq_lens[5] = 64;
    c.seq_lens[6] = 65;
    add(c);
    c.kv_dtype = kFp8;
    c.sinks = true;
    add(c);
    c.q_dtype = kFp8;
    c.H = 8;
    c.q_len = 1;
    c.page_size = 16;
    c.sinks = false;
    c.scale_tensors = true;
    add(c);
  }
  {
    // Many short requests (B >= 67 on 132 SMs): mostly whole requests in each part, out and lse
    // from the kernel. Mixed lengths with seq_len 0 and 1 (token 0 of q_len 2 attends no key),
    // fp16 with sinks, then bf16 with out strides that rule out 16-byte stores.
    Case c;
    c.B = 100;
    c.H = 16;
    c.q_len = 2;
    c.page_size = 32;
    mla_test::Rng rng(6);
    for (int b = 0; b < c.B; ++b) c.seq_lens.push_back(rng.randint(1, 900));
    c.seq_lens[3] = 0;
    c.seq_lens[50] = 1;
    c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
    c.sinks = true;
    add(c);
    c.q_dtype = c.kv_dtype = c.out_dtype = kBf16;
    c.sinks = false;
    c.H = 8;
    c.q_len = 1;
    c.out_odd = true;
    c.scale_tensors = true;
    add(c);
    // out strides of 4 values but not 8 (the combine's 8-byte stores, on its row kernel: 800
    // rows of about 3 splits), fp16.
    c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
    c.out_odd = false;
    c.out_quad = true;
    add(c);
  }
  for (bool kv4d : {false, true}) {
    Case c;  // padded strides
    c.B = 3;
    c.H = 16;
    c.q_len = kv4d ? 2 : 1;
    c.page_size = kv4d ? 16 : 256;
    c.seq_lens = {1300, 2, 129};
    c.strided = true;
    c.kv4d = kv4d;
    c.sinks = kv4d;
    add(c);
  }
  return cases;
}

// The seesaw kernel's balanced schedule (the plan kernel's segments): many requests of mixed
// lengths (zeros, single keys, a few long ones) so that part boundaries cut requests anywhere; a
// request that spans every part (the most splits the combine merges); several query-row tiles per
// request with causal limits that leave a tile's segment without a key; ragged queries where a
// request has no rows in a later tile.
std::vector<Case> schedule_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 3200 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  auto mixed_lens = [](int B, int mean, uint64_t seed) {
    mla_test::Rng rng(seed);
    std::vector<int> lens(B);
    for (int b = 0; b < B; ++b) {
      const int kind = rng.randint(0, 9);
      lens[b] = kind == 0 ? 0 : kind == 1 ? rng.randint(1, 3) : rng.randint(1, 2 * mean);
    }
    lens[B / 3] = 24 * mean;  // one long request among them
    return lens;
  };
  Case c;
  c.B = 150;
  c.H = 64;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = mixed_lens(c.B, 300, 1);
  add(c);
  c.B = 40;
  c.H = 128;
  c.q_len = 3;
  c.page_size = 32;
  c.seq_lens = mixed_lens(c.B, 200, 2);
  c.sinks = true;
  add(c);
  c = Case();  // ragged: 1 to 4 tokens of 32 heads (one or two tiles), zero-token requests
  c.B = 60;
  c.H = 32;
  c.seq_lens = mixed_lens(c.B, 250, 3);
  {
    mla_test::Rng rng(4);
    for (int b = 0; b < c.B; ++b) c.ragged_q_lens.push_back(rng.randint(0, 4));
  }
  c.max_q_len_hint = true;
  c.page_size = 16;
  add(c);
  c = Case();  // one request across every part (132 parts at H 64: the combine's lanes 0..4)
  c.B = 2;
  c.H = 64;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = {40000, 1};
  c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
  add(c);
  c.H = 128;  // 66 parts, a mask over two tokens
  c.q_len = 2;
  c.seq_lens = {1, 30001};
  c.q_dtype = c.kv_dtype = c.out_dtype = kBf16;
  c.mask = Mask::kU32;
  add(c);
  // Every request one segment (300 one-block requests, 10 per part on 132 SMs): out and lse from
  // The seesaw kernel itself with every output option; seq_len 1 leaves token 0's rows (tiles 0 and
  // 1) without a key, seq_len 0 leaves a request without any (the combine's only token).
  c = Case();
  c.B = 300;
  c.H = 128;
  c.q_len = 2;
  c.page_size = 64;
  {
    mla_test::Rng rng(5);
    for (int b = 0; b < c.B; ++b) c.seq_lens.push_back(rng.randint(1, 64));
    c.seq_lens[7] = c.seq_lens[150] = 1;
    c.seq_lens[299] = 0;
  }
  c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
  c.sinks = true;
  c.scale_tensors = true;
  c.bmm2 = 0.75;
  c.strided = true;
  add(c);
  // Equal lengths (every request one segment, written by the seesaw kernel itself) with out strides
  // that rule out 16-byte stores, and a request without keys.
  c = Case();
  c.B = 140;
  c.H = 64;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens.assign(c.B, 700);
  c.seq_lens[9] = 0;
  c.out_odd = true;
  add(c);
  // Few splits per token over many tokens: the combine merges several consecutive heads per item;
  // head counts that leave a token's last item short (37 = 9 x 4 + 1, 102 = 25 x 4 + 2).
  c = Case();
  c.B = 64;
  c.H = 37;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = mixed_lens(c.B, 400, 6);
  c.sinks = true;
  add(c);
  c.H = 102;
  c.q_len = 2;
  c.seq_lens = mixed_lens(c.B, 300, 7);
  c.sinks = false;
  c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
  add(c);
  // Equal lengths with two or more parts per request: the plan's uniform split (k = parts / B
  // equal runs, each request starting a part; schedule_kernel.cu), with requests without keys
  // beside them (not counted); runs of 3 blocks (B5 H128: 66 / 5 = 13 runs of 32 blocks), and
  // the few-rows kernel's 132 parts over 6 requests of 63 blocks (22 runs of 3, the last 0).
  c = Case();
  c.B = 7;
  c.H = 128;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = {2000, 2000, 0, 2000, 2000, 0, 2000};
  c.sinks = true;
  add(c);
  c.B = 6;
  c.H = 16;
  c.q_len = 2;
  c.page_size = 16;
  c.seq_lens.assign(c.B, 4000);
  c.sinks = false;
  c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
  add(c);
  c.kv_dtype = kFp8;
  c.q_dtype = kFp8;
  c.out_dtype = kBf16;
  c.H = 8;
  c.q_len = 3;  // 24 rows: N = 32
  add(c);
  // Equal lengths whose uniform split leaves parts idle by more than kUniformSlackPercent: the
  // even share instead (schedule_kernel.cu). On a GPU of 132 SMs, 132 parts (one tile a request)
  // over 34 requests of 48 blocks: k = 3, runs of 16 blocks on 102 parts, against an even share
  // of 15 positions; most parts then hold one segment, those with a request's start two. The
  // few-rows kernel (H 8) and the seesaw kernel (H 40, padding rows).
  c = Case();
  c.B = 34;
  c.H = 8;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens.assign(c.B, 3072);
  add(c);
  c.H = 40;
  c.sinks = true;
  add(c);
  return cases;
}

// The seesaw kernel's direct split (a call of one request): many runs per tile (partials for the
// combine) and one (out and lse from the decode kernel); runs without a block (seq_len shorter than
// the block_tables capacity, and 0); causal and custom masks, ragged queries, sinks, lse off, scale
// tensors, skip-softmax, fp16, page sizes and out strides without 16-byte stores.
std::vector<Case> direct_split_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.B = 1;
    c.seed = 3200 + cases.size();
    cases.push_back(deepseek(c));
  };
  Case c;
  c.H = 128;
  c.page_size = 64;
  c.seq_lens = {100};  // 4 blocks of capacity: 4 runs, two of them without a block
  add(c);
  c.seq_lens = {0};  // 2 runs, neither with a key: out 0, lse -inf
  add(c);
  c.seq_lens = {20};  // one block of capacity: one run, out and lse from the decode kernel
  c.page_size = 16;
  c.sinks = true;
  add(c);
  c.seq_lens = {5000};  // one tile, one run per block of capacity (80)
  c.H = 64;
  c.page_size = 32;
  add(c);
  c = Case();  // 32 tiles of 4 runs, causal rows
  c.H = 128;
  c.q_len = 16;
  c.page_size = 64;
  c.seq_lens = {3000};
  add(c);
  c = Case();  // 6 tiles, a custom mask, fp16
  c.H = 128;
  c.q_len = 3;
  c.page_size = 16;
  c.seq_lens = {2000};
  c.mask = Mask::kU32;
  c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
  add(c);
  c = Case();  // ragged (160 rows: 3 tiles), no lse
  c.H = 32;
  c.ragged_q_lens = {5};
  c.seq_lens = {4000};
  c.page_size = 128;
  c.lse = false;
  add(c);
  c = Case();  // a long request: scale tensors, skip-softmax, page 256, out without 16-byte stores
  c.H = 128;
  c.q_len = 2;
  c.page_size = 256;
  c.seq_lens = {20000};
  c.scale_tensors = true;
  c.skip = 1e-30f;
  c.out_odd = true;
  add(c);
  return cases;
}

// The seesaw kernel's pairs (tiles 2k and 2k + 1 of a request in a cluster of two that loads each
// block once for both; on the balanced schedule from 6 tiles up: H = 128 and at least 3 query
// tokens): pages of 16 and 32 keys (several issuers per block), ragged queries with tile pairs past
// a request's rows, a custom mask, sinks, fp16, a long request among short ones. CTest runs this
// suite a second time with MLA_SM90_PAIR=1, which pairs every balanced-schedule call that allows
// it: also 2 tiles at max_q_len 1 (H 65 .. 128, the second tile part padding).
std::vector<Case> pair_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 3500 + cases.size();
    cases.push_back(deepseek(c));
    return &cases.back();
  };
  Case c;
  c.B = 5;
  c.H = 128;
  c.q_len = 6;
  c.page_size = 16;
  c.seq_lens = {700, 6, 9, 2000, 129};
  add(c);
  c = Case();
  c.B = 2;
  c.H = 128;
  c.q_len = 4;
  c.page_size = 32;
  c.seq_lens = {30001, 17};
  c.sinks = true;
  add(c);
  c = Case();
  c.B = 4;
  c.H = 128;
  c.ragged_q_lens = {3, 0, 2, 1};
  c.seq_lens = {900, 40, 2, 1300};
  c.page_size = 16;
  c.max_q_len_hint = true;
  add(c);
  c.max_q_len_hint = false;  // max_q_len = T = 6: 12 tiles, most of them past a request's rows
  c.page_size = 64;
  add(c);
  c = Case();
  c.B = 3;
  c.H = 128;
  c.q_len = 4;
  c.page_size = 128;
  c.seq_lens = {1000, 4, 333};
  c.mask = Mask::kU32;
  c.q_dtype = c.kv_dtype = c.out_dtype = kFp16;
  add(c);
  c = Case();  // 2 tiles at max_q_len 1: paired only with MLA_SM90_PAIR=1
  c.B = 5;
  c.H = 96;
  c.q_len = 1;
  c.page_size = 32;
  c.seq_lens = {700, 0, 1, 2000, 129};
  add(c);
  c = Case();
  c.B = 2;
  c.H = 72;
  c.q_len = 1;
  c.page_size = 16;
  c.seq_lens = {3001, 0};
  c.sinks = true;
  add(c);
  c = Case();
  c.B = 3;
  c.H = 128;
  c.q_len = 1;
  c.page_size = 64;
  c.seq_lens = {100 * 1024 + 1, 5, 700};
  add(c);
  return cases;
}

// An e4m3 cache read as it lands (route.fp8_direct; allowances: tests/common/fp8_mma.h), pages 16
// to 256, lengths 0, 1, a block and one past, short and 16001; ragged queries, masks, sinks, scale
// tensors, skip-softmax, fp16 out without lse, 4-D layouts, scores spread widely enough that e4m3
// P reaches its subnormal range and 0, and a mixed batch on the balanced schedule:
// - the few-rows kernel (`seesaw` false): with an e4m3 query on the FP8 tensor cores, with a bf16
//   query in fp16 GEMMs widened into registers; heads 1, 3, 16 at q_len 1..4 and 16 (H x q_len <=
//   32), strided query rows;
// - the FP8 seesaw kernel on the balanced schedule (`seesaw`, an e4m3 query, more than 32 rows a
//   request): heads 128, 64, 40, 20, 16 and 3 at q_len 1..4 and 16, tiles that span two tokens,
//   requests of one segment.
std::vector<Case> fp8_direct_cases(DataType q_dtype, bool seesaw = false) {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.q_dtype = q_dtype;
    c.kv_dtype = kFp8;
    c.seed = (seesaw ? 4500 : q_dtype == kFp8 ? 4100 : 4200) + cases.size();
    cases.push_back(deepseek(c));
  };
  using Shape = std::pair<int, int>;  // H, q_len
  const std::vector<Shape> shapes =
      seesaw
          ? std::vector<Shape>{{128, 1}, {128, 2}, {64, 1}, {40, 2},
                               {20, 4},  {16, 4},  {3, 16}, {128, 4}}
          : std::vector<Shape>{{1, 1}, {1, 2}, {1, 16}, {3, 1}, {3, 4}, {16, 1}, {16, 2}, {8, 4}};
  const int page_sizes[2][4] = {{16, 64, 256, 32}, {64, 16, 256, 32}};
  int n = 0;
  for (auto [H, q_len] : shapes) {
    Case c;
    c.B = 4;
    c.H = H;
    c.q_len = q_len;
    c.page_size = page_sizes[seesaw ? 1 : 0][n % 4];
    c.seq_lens = {n % 2 ? 16001 : 700, 0, q_len, 65};
    if (n % 3 == 2 && q_dtype == kFp8) c.out_dtype = kFp16;
    c.lse = n % 4 != 3;
    ++n;
    add(c);
  }
  Case c;
  c.B = 3;
  c.H = seesaw ? 64 : 16;
  c.ragged_q_lens = seesaw ? std::vector<int>{2, 1, 3} : std::vector<int>{2, 1, 2};
  c.max_q_len_hint = true;  // without it the route assumes 5 tokens a request: the seesaw kernel
  c.seq_lens = {900, 2, 64};
  c.page_size = 64;
  c.sinks = true;
  add(c);
  if (seesaw) c.H = 40;  // tiles that span tokens
  c.ragged_q_lens = {1, 2, 0};
  c.sinks = false;
  c.scale_tensors = true;
  add(c);
  c = Case();
  c.B = 3;
  c.H = seesaw ? 20 : 8;
  c.q_len = 4;
  c.mask = Mask::kU32;
  c.seq_lens = {1000, 4, 130};
  c.page_size = 16;
  add(c);
  c.H = seesaw ? 128 : 16;
  c.q_len = 2;
  c.mask = Mask::kU16;
  c.strided = !seesaw && q_dtype != kFp8;  // padded e4m3 query rows are not 16-byte multiples: SIMT
  add(c);
  c = Case();
  c.B = 2;
  c.H = seesaw ? 128 : 16;
  c.seq_lens = {3000, 129};
  c.page_size = 64;
  c.kv4d = true;
  c.skip = 0.5f;
  add(c);
  c.kv4d = false;
  c.skip = 0.0f;
  c.bmm1 = 40.0 / std::sqrt(576.0);  // scores spread ~13: P below e4m3's normal range
  c.sinks = true;
  add(c);
  c = Case();
  c.B = 40;
  c.H = seesaw ? 64 : 16;
  c.q_len = 2;
  c.page_size = 64;
  {
    mla_test::Rng rng(seesaw ? 45 : 41);
    for (int b = 0; b < c.B; ++b) c.seq_lens.push_back(rng.randint(0, 5000));
  }
  c.seq_lens[1] = 1;
  c.seq_lens[2] = 64;
  add(c);
  if (!seesaw) {
    // 16 rows over segments of up to ~20 blocks, several a CTA (the other cases' CTAs hold a few
    // blocks): the route takes the bf16 query's three consumers and the e4m3 query's four stages,
    // whose stage phases carry from segment to segment.
    c.q_len = 1;
    c.seq_lens[3] = 9000;
    add(c);
  }
  if (seesaw) {
    c = Case();
    c.B = 2;  // requests of one segment each: out and lse without the combine's partials
    c.H = 128;
    c.q_len = 2;
    c.page_size = 64;
    c.seq_lens = {50, 3};
    c.sinks = true;
    add(c);
  }
  return cases;
}

// An e4m3 query over an e4m3 cache on the seesaw kernel's direct split (a call of one request):
// - `fp8` false: one block a split, the blocks widened in shared memory: several runs and the
//   combine, and one run (out and lse without the combine);
// - `fp8` true: two blocks a split or more, the FP8 seesaw kernel: H 128 at q_len 1 and 2 (pages
//   64 and 16, sinks, scale tensors; two blocks a split, the last block one key), a mask over tiles
//   of two tokens, lse off, a length that leaves the last run short.
std::vector<Case> fp8_direct_split_cases(bool fp8) {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.B = 1;
    c.q_dtype = kFp8;
    c.kv_dtype = kFp8;
    c.seed = (fp8 ? 4610 : 4600) + cases.size();
    cases.push_back(deepseek(c));
  };
  Case c;
  c.H = 128;
  c.page_size = 64;
  if (!fp8) {
    c.seq_lens = {4000};
    add(c);
    c.q_len = 2;
    c.seq_lens = {50};
    c.sinks = true;
    add(c);
    return cases;
  }
  c.seq_lens = {20000};
  add(c);
  c.seq_lens = {8001};  // two blocks a split, the last block one key
  add(c);
  c.q_len = 2;
  c.page_size = 16;
  c.seq_lens = {30001};
  c.sinks = true;
  c.scale_tensors = true;
  add(c);
  c = Case();
  c.H = 32;
  c.q_len = 4;
  c.page_size = 64;
  c.mask = Mask::kU32;
  c.seq_lens = {20000};
  c.lse = false;
  add(c);
  return cases;
}

// The contract's extremes: a batch of 1024 with requests of 256K + 1 and 100K + 1 keys among
// short ones (zeros and single keys included) on the balanced schedule, and one request of
// 256K + 1 keys on the few-rows kernel's split and on the direct split.
std::vector<Case> extreme_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = 3900 + cases.size();
    cases.push_back(deepseek(c));
  };
  Case c;
  c.B = 1024;
  c.H = 64;
  c.q_len = 1;
  c.page_size = 64;
  {
    mla_test::Rng rng(39);
    for (int b = 0; b < c.B; ++b) {
      const int kind = rng.randint(0, 9);
      c.seq_lens.push_back(kind == 0 ? 0 : kind == 1 ? 1 : rng.randint(2, 256));
    }
  }
  c.seq_lens[0] = 256 * 1024 + 1;
  c.seq_lens[700] = 100 * 1024 + 1;
  add(c);
  c = Case();
  c.B = 1;
  c.H = 16;
  c.page_size = 128;
  c.seq_lens = {256 * 1024 + 1};
  add(c);
  c.H = 40;  // the direct split (H x q_len > 32), one tile with padding rows
  c.page_size = 256;
  add(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Decode, ::testing::ValuesIn(shape_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Extremes, Sm90Decode, ::testing::ValuesIn(extreme_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Schedule, Sm90Decode, ::testing::ValuesIn(schedule_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Splits, Sm90Decode, ::testing::ValuesIn(split_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Ragged, Sm90Decode, ::testing::ValuesIn(ragged_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(DTypes, Sm90Decode, ::testing::ValuesIn(dtype_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(HeadDims, Sm90Decode, ::testing::ValuesIn(head_dim_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(OneSplit, Sm90Decode, ::testing::ValuesIn(one_split_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Features, Sm90Decode, ::testing::ValuesIn(feature_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Mixed, Sm90Decode, ::testing::ValuesIn(mixed_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(TmaKernels, Sm90Decode, ::testing::ValuesIn(tma_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(FewRows, Sm90Decode, ::testing::ValuesIn(few_rows_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Fp8Mma, Sm90Decode, ::testing::ValuesIn(fp8_direct_cases(kFp8)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Fp8Regs, Sm90Decode, ::testing::ValuesIn(fp8_direct_cases(kBf16)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Fp8Seesaw, Sm90Decode, ::testing::ValuesIn(fp8_direct_cases(kFp8, true)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Fp8SeesawDirect, Sm90Decode,
                         ::testing::ValuesIn(fp8_direct_split_cases(true)), param_name);
INSTANTIATE_TEST_SUITE_P(Fp8Widened, Sm90Decode, ::testing::ValuesIn(fp8_direct_split_cases(false)),
                         param_name);

// A bf16 query over an e4m3 cache runs fp16 GEMMs over each query row scaled by a power of two
// into fp16's range (docs/sm90-fp8.md), on both kernels (H 16: the few-rows kernel, H 64 the
// seesaw kernel), against the oracle: every row 2^70 times unit size (far past fp16's 65504) or
// 2^-120 (near bf16's subnormals) with bmm1 scaled the other way, and rows of mixed sizes, 2^-100
// to 2^-2, one of bf16 subnormals. (Scores themselves stay moderate: beyond ~2^20 fp32's own
// rounding of them moves P by whole factors on every kernel.)
TEST(Sm90DecodeFp8Direct, Bf16QueryRowsOfAnyMagnitude) {
  SKIP_WITHOUT_HOPPER();
  for (int H : {16, 64}) {
    for (int config = 0; config < 3; ++config) {
      Case c;
      c.B = 3;
      c.H = H;
      c.q_len = 2;
      c.seq_lens = {900, 70, 2};
      c.page_size = 64;
      c.q_dtype = kBf16;
      c.kv_dtype = kFp8;
      const int whole = config == 0 ? 70 : config == 1 ? -120 : 0;  // every row's shift
      c.bmm1 = std::ldexp(4.0 / std::sqrt(576.0), -whole);
      c.seed = 4300 + config;
      std::unique_ptr<Built> b = build(deepseek(c));
      for (int t = 0; t < b->T; ++t) {
        for (int h = 0; h < c.H; ++h) {
          const int g = h % 16;
          const int shift = config < 2 ? whole : g == 15 ? -140 : 7 * g - 100;
          for (int d = 0; d < b->D; ++d) {
            const double x = b->in.query[(static_cast<size_t>(t) * c.H + h) * b->D + d];
            b->set_query(t, h, d, std::ldexp(x, shift));
          }
        }
      }
      DeviceCall call(*b);
      const Route route = route_on_device(call.params);
      ASSERT_EQ(route.kernel, H == 16 ? Kernel::kFewRows : Kernel::kSeesaw);
      ASSERT_EQ(route.fp8_direct, H == 16);
      ASSERT_TRUE(run_on_gpu(call.params));
      call.download(*b);
      SCOPED_TRACE("H " + std::to_string(H) + " config " + std::to_string(config));
      check_sm90(*b);
    }
  }
}

// The e4m3-cache cases run where they are meant to.
TEST(Sm90DecodeFp8Direct, RoutesReadTheCacheAsItLands) {
  SKIP_WITHOUT_HOPPER();
  std::vector<Case> cases = fp8_direct_cases(kFp8);
  for (const Case& c : fp8_direct_cases(kBf16)) cases.push_back(c);
  for (const Case& c : cases) {
    std::unique_ptr<Built> b = build(c);
    DeviceCall call(*b);
    const Route route = route_on_device(call.params);
    EXPECT_EQ(route.kernel, Kernel::kFewRows) << case_name(c);
    EXPECT_TRUE(route.fp8_direct) << case_name(c);
  }
  for (const Case& c : fp8_direct_cases(kFp8, true)) {
    std::unique_ptr<Built> b = build(c);
    DeviceCall call(*b);
    const Route route = route_on_device(call.params);
    EXPECT_EQ(route.kernel, Kernel::kSeesaw) << case_name(c);
    EXPECT_TRUE(route.fp8_direct) << case_name(c);
  }
  for (bool fp8 : {true, false}) {
    for (const Case& c : fp8_direct_split_cases(fp8)) {
      std::unique_ptr<Built> b = build(c);
      DeviceCall call(*b);
      const Route route = route_on_device(call.params);
      EXPECT_EQ(route.kernel, Kernel::kSeesaw) << case_name(c);
      EXPECT_TRUE(route.layout.direct) << case_name(c);
      EXPECT_EQ(route.fp8_direct, fp8) << case_name(c);
    }
  }
}
INSTANTIATE_TEST_SUITE_P(DirectSplit, Sm90Decode, ::testing::ValuesIn(direct_split_cases()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Pairs, Sm90Decode, ::testing::ValuesIn(pair_cases()), param_name);

// Which kernel the route of a call on this device runs (the results alone cannot tell: paired
// and unpaired agree): from 6 tiles per request on the balanced schedule paired, where the device
// holds the grid in clusters of two (an H200 holds 66 at once); 2 tiles unpaired; a call of one
// request (the direct split) never. MLA_SM90_PAIR=0 / =1 take every balanced-schedule call off
// pairs / onto them. Each call then runs and matches the oracle. (sm90_route_test checks the whole
// route table for given device facts.)
TEST(Sm90DecodePairs, RouteOfThisDevicePairsByPolicy) {
  SKIP_WITHOUT_HOPPER();
  if (std::getenv("MLA_SM90_KERNEL") != nullptr || std::getenv("MLA_SM90_DIRECT") != nullptr) {
    GTEST_SKIP() << "routing forced by MLA_SM90_KERNEL / MLA_SM90_DIRECT";
  }
  const char* env = std::getenv("MLA_SM90_PAIR");
  const std::string forced = env == nullptr ? "" : env;
  struct Expect {
    int B, q_len;
    bool direct, paired;
  };
  const Expect expects[] = {
      {3, 4, false, forced != "0"},  // 8 tiles per request
      {3, 1, false, forced == "1"},  // 2 tiles
      {1, 4, true, false},           // the direct split
  };
  for (const Expect& e : expects) {
    Case c;
    c.B = e.B;
    c.H = 128;
    c.q_len = e.q_len;
    c.page_size = 64;
    c.seq_lens = {1500, 70, 9};
    c.seq_lens.resize(c.B);
    c.seed = 3600 + e.B * 10 + e.q_len;
    std::unique_ptr<Built> b = build(deepseek(c));
    DeviceCall call(*b);
    const Route route = route_on_device(call.params);
    EXPECT_EQ(route.kernel, Kernel::kSeesaw) << "B " << e.B << " q_len " << e.q_len;
    EXPECT_EQ(route.layout.direct, e.direct) << "B " << e.B << " q_len " << e.q_len;
    EXPECT_EQ(route.pair, e.paired) << "B " << e.B << " q_len " << e.q_len;
    ASSERT_TRUE(run_on_gpu(call.params));
    call.download(*b);
    check_sm90(*b);
  }
}

// ---- Empty batches ----------------------------------------------------------------------------

// T = 0: ragged requests without tokens, and a dense query of q_len 0.
TEST(Sm90DecodeEmpty, ZeroTokensIsANoOp) {
  SKIP_WITHOUT_HOPPER();
  for (bool ragged : {true, false}) {
    Case c;
    c.B = 2;
    if (ragged) {
      c.ragged_q_lens = {0, 0};
    } else {
      c.q_len = 0;
    }
    c.seq_lens = {5, 0};
    std::unique_ptr<Built> b = build(deepseek(c));
    DeviceCall call(*b);
    ASSERT_TRUE(run_on_gpu(call.params)) << (ragged ? "ragged" : "dense");
    call.download(*b);
    EXPECT_TRUE(b->outputs_untouched()) << (ragged ? "ragged" : "dense");
  }
}

// ---- Checked mode -----------------------------------------------------------------------------

Case index_case() { return deepseek(small_index_case()); }

// Expects kBadIndex naming `fragment`, with out and lse left untouched.
void expect_bad_index(Built& b, DeviceCall& call, const std::string& fragment) {
  call.params.validate_indices = true;
  try {
    mla::decode(call.params);
    ADD_FAILURE() << "no error for a bad index (" << fragment << ")";
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), mla::ErrorCode::kBadIndex) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message does not name " << fragment << ": " << e.what();
  }
  call.download(b);
  EXPECT_TRUE(b.outputs_untouched()) << "out or lse written before the error";
}

TEST(Sm90DecodeIndices, CheckedModeReportsBadBlockTableEntry) {
  SKIP_WITHOUT_HOPPER();
  std::unique_ptr<Built> b = build(index_case());
  b->block_tables[2 * b->block_table_stride + 1] = -1;  // request 2, its last needed page
  DeviceCall call(*b);
  expect_bad_index(*b, call, "block_tables[2][1]: page id -1");
}

TEST(Sm90DecodeIndices, CheckedModeReportsBadSeqLen) {
  SKIP_WITHOUT_HOPPER();
  std::unique_ptr<Built> b = build(index_case());
  b->seq_lens[1] = -1;
  DeviceCall call(*b);
  expect_bad_index(*b, call, "seq_lens[1]: -1 is negative");
  b = build(index_case());
  b->seq_lens[2] = static_cast<int32_t>(b->max_pages * 16 + 1);
  DeviceCall call2(*b);
  expect_bad_index(*b, call2, "seq_lens[2]");
}

TEST(Sm90DecodeIndices, CheckedModeReportsBadSparseIndex) {
  SKIP_WITHOUT_HOPPER();
  Case c = index_case();
  c.top_k = 16;
  std::unique_ptr<Built> b = build(c);
  b->sparse_indices[5 * 16 + 3] = b->num_pages * c.page_size;  // one past the pool
  DeviceCall call(*b);
  expect_bad_index(*b, call, "sparse_indices[2][1][3]");
}

TEST(Sm90DecodeIndices, CheckedModePassesGoodInput) {
  SKIP_WITHOUT_HOPPER();
  Case c = index_case();
  c.ragged_q_lens = {2, 1, 2};
  c.mask = Mask::kU32;
  std::unique_ptr<Built> b = build(c);
  DeviceCall call(*b);
  call.params.validate_indices = true;
  ASSERT_TRUE(run_on_gpu(call.params));
  call.download(*b);
  check_sm90(*b);
}

// ---- Graphs, PDL, determinism -----------------------------------------------------------------

// plan + run captured once, replayed with new data and new seq_lens of the same shapes; (batch,
// heads): (3, 64) runs the 64-row kernel, (3, 8) the few-rows kernel, (1, 128) the direct split.
class Sm90DecodeGraph : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(Sm90DecodeGraph, CapturedPlanAndRunReplayWithNewInputs) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.B = GetParam().first;
  c.H = GetParam().second;
  c.q_len = 2;
  c.page_size = 16;
  c.seq_lens = {1000, 37, 3};  // 63 + 3 + 1 pages, the longest 63
  c.seq_lens.resize(c.B);
  c.sinks = true;
  c.scale_tensors = true;
  c = deepseek(c);
  std::unique_ptr<Built> b = build(c);
  DeviceCall call(*b);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  call.params.stream = stream;
  call.params.enable_pdl = true;

  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const mla::Plan plan = mla::plan(call.params);
  mla::run(plan, call.params);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  call.download(*b);
  check_sm90(*b);

  // Same page counts (63 + 3 + 1, longest 63), other lengths, data and scales.
  Case next = c;
  next.seq_lens = {995, 48, 1};
  next.seq_lens.resize(c.B);
  next.seed = c.seed + 1;
  next.bmm1 = 0.05;
  next.bmm2 = 2.0;
  std::unique_ptr<Built> b2 = build(next);
  call.upload(*b2, stream);
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  call.download(*b2);
  check_sm90(*b2);

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(BatchHeads, Sm90DecodeGraph,
                         ::testing::Values(std::pair{3, 64}, std::pair{3, 8}, std::pair{1, 128}));

// A per-tensor e4m3 cache under a bf16 or an e4m3 query, with bmm1 and bmm2 as device tensors
// (where the fp8 scales travel): one run of a plan captured, replayed with a new query, new cache
// contents and block tables and new scale values written into the same buffers, seq_lens kept
// (the plan's; common/graph_replay.h). Every replay matches the oracle with the fp8 formats'
// tolerance (sm90_p_rel), and every row differs from the previous replay's. (query dtype, H): H 16
// x q_len 2 runs the few-rows kernel (32 rows), H 128 the seesaw kernel on the balanced schedule,
// unpaired (fp8).
class Sm90DecodeFp8Graph : public ::testing::TestWithParam<std::pair<DataType, int>> {};

TEST_P(Sm90DecodeFp8Graph, ReplaysReadNewQueryCacheAndScaleTensors) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.B = 3;
  c.H = GetParam().second;
  c.q_len = 2;
  c.page_size = 64;
  c.seq_lens = {1500, 70, 3};
  c.q_dtype = GetParam().first;
  c.kv_dtype = kFp8;
  c.sinks = true;
  c.scale_tensors = true;
  c.seed = 4600 + c.H + (c.q_dtype == kFp8 ? 1 : 0);
  c = deepseek(c);
  std::unique_ptr<Built> b = build(c);
  DeviceCall call(*b);
  const Route route = route_on_device(call.params);
  if (std::getenv("MLA_SM90_KERNEL") == nullptr && std::getenv("MLA_SM90_MAX_SPLITS") == nullptr) {
    if (c.H == 16) {
      EXPECT_EQ(route.kernel, Kernel::kFewRows);
      EXPECT_EQ(route.few_rows, 32);
      EXPECT_TRUE(route.layout.scheduled);
    } else {
      EXPECT_EQ(route.kernel, Kernel::kSeesaw);
      EXPECT_TRUE(route.layout.scheduled);
      EXPECT_FALSE(route.pair);
    }
  }
  CapturedRun graph;
  ASSERT_TRUE(graph.capture(call.params));
  replay_with_new_inputs(
      call, graph, *b, 3, [&](int k, std::vector<uint8_t>&) { return build(replay_case(c, k)); },
      [](const Built& next) { check_sm90(next); });
}

INSTANTIATE_TEST_SUITE_P(QueryHeads, Sm90DecodeFp8Graph,
                         ::testing::Values(std::pair{kBf16, 16}, std::pair{kBf16, 128},
                                           std::pair{kFp8, 16}, std::pair{kFp8, 128}),
                         [](const ::testing::TestParamInfo<std::pair<DataType, int>>& info) {
                           return std::string(mla_test::dtype_name(info.param.first)) + "xfp8_H" +
                                  std::to_string(info.param.second);
                         });

// H 128 x 3 tokens: the 64-row kernel; H 16 x 2 tokens: the few-rows kernel.
class Sm90DecodeDeterminism : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(Sm90DecodeDeterminism, TwoRunsAndPdlAreBitwiseIdentical) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.B = 3;
  c.H = GetParam().first;
  c.q_len = GetParam().second;
  c.seq_lens = {3000, 500, 7};
  c.page_size = 64;
  c.sinks = true;
  std::unique_ptr<Built> b = build(deepseek(c));
  DeviceCall call(*b);
  ASSERT_TRUE(run_on_gpu(call.params));
  call.download(*b);
  check_sm90(*b);
  const std::vector<uint8_t> out1 = b->out.bytes(), lse1 = b->lse.bytes();
  for (bool pdl : {false, true}) {
    b->reset_outputs(777);
    call.upload(*b);
    call.params.enable_pdl = pdl;
    ASSERT_TRUE(run_on_gpu(call.params));
    call.download(*b);
    EXPECT_TRUE(out1 == b->out.bytes()) << "out differs (pdl " << pdl << ")";
    EXPECT_TRUE(lse1 == b->lse.bytes()) << "lse differs (pdl " << pdl << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, Sm90DecodeDeterminism,
                         ::testing::Values(std::make_pair(128, 3), std::make_pair(16, 2)));

// One plan, several runs (an engine's layers, PDL on): every run matches the oracle and the first
// run bitwise, with requests cut into two or three segments by the balanced schedule.
TEST(Sm90DecodePlanReuse, RunsOfOnePlanMatchAndAreBitwiseIdentical) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.B = 48;
  c.H = 128;
  c.q_len = 2;
  c.page_size = 64;
  // 64k + 1 keys: token 0's rows stop one key short of the last block. On 132 SMs (33 parts of 27
  // positions) 16 requests have two segments and request 24 three; in requests 20, 24 and 42 the
  // last segment holds only that block, so tiles 0 and 1 write an empty partial there.
  for (int b = 0; b < c.B; ++b) c.seq_lens.push_back(64 * (b % 17 + 1) + 1);
  c.seq_lens[24] = 64 * 54 + 1;
  c.sinks = true;
  std::unique_ptr<Built> b = build(deepseek(c));
  DeviceCall call(*b);
  call.params.enable_pdl = true;
  const mla::Plan plan = mla::plan(call.params);
  std::vector<uint8_t> out1, lse1;
  for (int run = 0; run < 3; ++run) {
    b->reset_outputs(900 + run);
    call.upload(*b);
    ASSERT_NO_THROW(mla::run(plan, call.params));
    call.download(*b);
    check_sm90(*b);
    if (run == 0) {
      out1 = b->out.bytes();
      lse1 = b->lse.bytes();
    } else {
      EXPECT_TRUE(out1 == b->out.bytes()) << "out differs (run " << run << ")";
      EXPECT_TRUE(lse1 == b->lse.bytes()) << "lse differs (run " << run << ")";
    }
  }
}

// Skip-softmax with a large factor is an approximation: it must run and stay finite and close.
TEST(Sm90DecodeSkipSoftmax, LargeFactorStaysFinite) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.B = 2;
  c.H = 16;
  c.q_len = 1;
  c.seq_lens = {2000, 300};
  c.skip = 1e-3f;
  c.bmm1 = 0.5;
  std::unique_ptr<Built> b = build(deepseek(c));
  DeviceCall call(*b);
  ASSERT_TRUE(run_on_gpu(call.params));
  call.download(*b);
  for (int64_t i = 0; i < b->out.count(); ++i) {
    if (!b->out_logical[i]) continue;
    ASSERT_TRUE(std::isfinite(b->out.get(i))) << "out element " << i;
  }
}

}  // namespace

// ---- Workspace cap ----------------------------------------------------------------------------

// workspace_size never exceeds 128 MiB (contract section 3, FlashInfer's documented buffer) for
// the shapes engines run at large batch: the plan fits its splits into that. Only shapes are read:
// the tensors are views of distinct, never-dereferenced device addresses.
TEST(Sm90Workspace, NeverAbove128MiB) {
  SKIP_WITHOUT_HOPPER();
  const auto fake = [](int k) {
    return reinterpret_cast<void*>(uintptr_t{1} << 40 | uintptr_t(k) << 36);
  };
  const mla::Device gpu = mla::cuda_device(0);
  for (const int64_t B : {1, 64, 768, 1024, 2048}) {
    for (const int64_t q_len : {1, 2, 4, 16}) {
      for (const int64_t H : {16, 64, 128}) {
        for (const DataType kv_dtype : {kBf16, kFp8}) {
          const int64_t page = 64, max_pages = 8192 / page * 4, P = B * max_pages;
          mla::DecodeParams p;
          const DataType q_dtype = kv_dtype == kFp8 ? kBf16 : kBf16;
          p.query = TensorView::contiguous(fake(1), q_dtype, {B, q_len, H, 576}, gpu);
          p.kv_cache = TensorView::contiguous(fake(2), kv_dtype, {P, page, 576}, gpu);
          p.block_tables = TensorView::contiguous(fake(3), dt::kInt32, {B, max_pages}, gpu);
          p.seq_lens = TensorView::contiguous(fake(4), dt::kInt32, {B}, gpu);
          p.out = TensorView::contiguous(fake(5), kBf16, {B, q_len, H, 512}, gpu);
          p.lse = TensorView::contiguous(fake(6), dt::kFloat32, {B, q_len, H}, gpu);
          p.backend = mla::Backend::kSm90;
          const size_t bytes = mla::workspace_size(p);
          EXPECT_LE(bytes, size_t{128} << 20) << "B " << B << " q_len " << q_len << " H " << H
                                              << " kv " << mla_test::dtype_name(kv_dtype);
        }
      }
    }
  }
}

// ---- Non-finite inputs propagate to exactly the rows they touch (contract section 1) -----------

// One shape per route: the few-rows kernel (H x q_len <= 32), the seesaw kernel on the balanced
// schedule with tiles that span two tokens (H 32, q_len 3) and with a split request (partials and
// the combine), its direct split (one request), fp8 caches on both wgmma kernels, and the SIMT
// kernel (pages of 8). Request 0 has
// two or more query tokens; its token 0 does not see the last key.
struct NanRoute {
  const char* name;
  Case c;
};
std::vector<NanRoute> nan_routes() {
  std::vector<NanRoute> routes;
  auto add = [&](const char* name, int B, int H, int q_len, std::vector<int> seq_lens,
                 DataType kv = kBf16, int page_size = 64) {
    Case c;
    c.B = B;
    c.H = H;
    c.q_len = q_len;
    c.seq_lens = std::move(seq_lens);
    c.page_size = page_size;
    c.q_dtype = kv == kFp8 ? kFp8 : kBf16;
    c.kv_dtype = kv;
    c.seed = 4300 + routes.size();
    routes.push_back({name, deepseek(c)});
  };
  add("few_rows", 3, 16, 2, {150, 7, 0});
  add("seesaw_tiles_span_tokens", 3, 32, 3, {150, 7, 0});
  add("seesaw_split", 3, 128, 2, {9000, 70, 0});
  add("seesaw_direct", 1, 64, 2, {3000});
  add("few_rows_fp8", 3, 16, 2, {150, 7, 0}, kFp8);
  add("seesaw_split_fp8", 3, 128, 2, {9000, 70, 0}, kFp8);
  add("simt", 3, 16, 2, {150, 7, 0}, kBf16, 8);
  return routes;
}

int64_t run_with_nan_rows_on_gpu(Built& b) {
  fill_outputs(b, 12345.0);
  DeviceCall call(b);
  EXPECT_TRUE(run_on_gpu(call.params));
  call.download(b);
  const mla_test::RowAllowance extra = sm90_allowance(b);
  return check_nan_rows_against_oracle(b, sm90_p_rel(b), &extra, sm90_fp16_p(b));
}

TEST(Sm90DecodeNaN, QueryRowKeyAndScale) {
  SKIP_WITHOUT_HOPPER();
  for (const NanRoute& route : nan_routes()) {
    SCOPED_TRACE(route.name);
    const Case& c = route.c;
    const int n0 = c.q_len, last = c.seq_lens[0] - 1;
    {
      std::unique_ptr<Built> b = build(c);
      poison_query(*b, 1, 2, 5);  // request 0, token 1, head 2
      EXPECT_EQ(run_with_nan_rows_on_gpu(*b), 1) << "NaN in one query row";
    }
    {
      std::unique_ptr<Built> b = build(c);
      // Head 3 of request 1's token 0 (of the last token with one request), in the rope part.
      poison_query(*b, c.B > 1 ? n0 : b->T - 1, 3, 530, /*inf=*/c.q_dtype != kFp8);
      EXPECT_EQ(run_with_nan_rows_on_gpu(*b), 1) << "inf in a query row";
    }
    {
      std::unique_ptr<Built> b = build(c);
      poison_key(*b, 0, last, 7);  // only request 0's last token sees its last key
      EXPECT_EQ(run_with_nan_rows_on_gpu(*b), c.H) << "NaN in the last key";
    }
    {
      std::unique_ptr<Built> b = build(c);
      poison_key(*b, 0, 3, 40);  // an early key: every token of request 0
      EXPECT_EQ(run_with_nan_rows_on_gpu(*b), n0 * c.H) << "NaN in an early key";
    }
    if (c.B > 1) {
      std::unique_ptr<Built> b = build(c);
      // inf (NaN for fp8, which has no inf) in a value of request 1's last key: every token of
      // request 1 that sees it, whatever the sign of its score (a -inf score has P = 0, and 0
      // times inf is NaN in that column only unless the kernel turns the row NaN).
      poison_key(*b, 1, c.seq_lens[1] - 1, 0, /*inf=*/c.kv_dtype != kFp8);
      EXPECT_EQ(run_with_nan_rows_on_gpu(*b), c.H) << "inf in request 1's last key";
    }
    for (int which : {1, 2}) {
      Case s = c;
      s.scale_tensors = true;
      std::unique_ptr<Built> b = build(s);
      (which == 1 ? b->bmm1_value : b->bmm2_value) = std::numeric_limits<float>::quiet_NaN();
      (which == 1 ? b->in.bmm1_scale : b->in.bmm2_scale) = std::nan("");
      int64_t rows_with_keys = 0;
      for (int r = 0; r < c.B; ++r) rows_with_keys += c.seq_lens[r] > 0 ? c.q_len * c.H : 0;
      EXPECT_EQ(run_with_nan_rows_on_gpu(*b), rows_with_keys) << "NaN bmm" << which << "_scale";
    }
  }
}

TEST(Sm90DecodeNaN, KeysThatAreNotAttendedHaveNoEffect) {
  SKIP_WITHOUT_HOPPER();
  for (const NanRoute& route : nan_routes()) {
    SCOPED_TRACE(route.name);
    // A custom mask that hides request 0's last key (its last draft token) from every token.
    Case c = route.c;
    c.mask = Mask::kU32;
    std::unique_ptr<Built> b = build(c);
    const int n0 = c.q_len;
    for (int i = 0; i < n0; ++i) {
      const uint32_t keep = ((1u << n0) - 1) >> 1;  // every draft key but the last
      b->mask[i * b->params.mask.strides[1]] = b->in.mask[i * b->in.mask_words] = keep;
    }
    poison_key(*b, 0, c.seq_lens[0] - 1, 0);
    poison_key(*b, 0, c.seq_lens[0] - 1, 300, /*inf=*/c.kv_dtype != kFp8);
    EXPECT_EQ(run_with_nan_rows_on_gpu(*b), 0) << "masked key";
    // Causal: request 0's token 0 does not see the last key, which holds NaN in its value part.
    c = route.c;
    b = build(c);
    poison_key(*b, 0, c.seq_lens[0] - 1, 100);
    EXPECT_EQ(run_with_nan_rows_on_gpu(*b), c.H) << "causal: only the last token";
  }
}

// ---- Sinks in bf16 and fp16 (contract section 3)
// -------------------------------------------------

TEST(Sm90DecodeSinks, SixteenBitSinksAreConverted) {
  SKIP_WITHOUT_HOPPER();
  for (const NanRoute& route : nan_routes()) {
    for (DataType sinks_dtype : {kBf16, kFp16}) {
      SCOPED_TRACE(std::string(route.name) + " " + mla_test::dtype_name(sinks_dtype));
      Case c = route.c;
      c.sinks = true;
      std::unique_ptr<Built> b = build(c);
      mla_test::Buffer sinks(sinks_dtype, c.H);
      for (int h = 0; h < c.H; ++h) b->in.sinks[h] = sinks.set(h, b->sinks[h]);
      std::vector<uint8_t> bytes = sinks.bytes();
      // The device copy is made from b->sinks' storage: hand it the 16-bit bytes.
      b->sinks.assign((bytes.size() + 3) / 4, 0.0f);
      std::memcpy(b->sinks.data(), bytes.data(), bytes.size());
      b->params.sinks = TensorView::contiguous(b->sinks.data(), sinks_dtype, {c.H});
      DeviceCall call(*b);
      ASSERT_TRUE(run_on_gpu(call.params));
      call.download(*b);
      check_sm90(*b);
    }
  }
}

// ---- Separate K/V page tables: [B, 2, max_pages] (contract section 3)
// ----------------------------

TEST(Sm90DecodeTables, SeparateKvPageTablesGiveTheSameResult) {
  SKIP_WITHOUT_HOPPER();
  for (const NanRoute& route : nan_routes()) {
    SCOPED_TRACE(route.name);
    const int pad = 3;
    std::unique_ptr<Built> b = build(route.c);
    std::vector<int32_t> tables = kv_page_tables(*b, pad);
    const int64_t row = b->max_pages + pad;
    // The device copy is made from b->block_tables' storage.
    b->block_tables = tables;
    b->params.block_tables =
        TensorView::strided(b->block_tables.data(), dt::kInt32, {route.c.B, 2, b->max_pages},
                            {2 * row + 2 * pad, row, 1});
    DeviceCall call(*b);
    call.params.validate_indices = true;  // row 1 agrees with row 0 on every needed page
    ASSERT_TRUE(run_on_gpu(call.params));
    call.download(*b);
    check_sm90(*b);
  }
}

TEST(Sm90DecodeTables, CheckedModeReportsRowsThatDiffer) {
  SKIP_WITHOUT_HOPPER();
  std::unique_ptr<Built> b = build(index_case());
  std::vector<int32_t> tables = kv_page_tables(*b, 0);
  const int64_t mp = b->max_pages;
  // Request 2 (seq_len 20, pages of 16) needs logical pages 0 and 1.
  tables[2 * 2 * mp + mp + 1] = tables[2 * 2 * mp + 1] == 0 ? 1 : 0;
  const int32_t v = tables[2 * 2 * mp + mp + 1], k = tables[2 * 2 * mp + 1];
  b->block_tables = tables;
  b->params.block_tables =
      TensorView::contiguous(b->block_tables.data(), dt::kInt32, {b->c.B, 2, mp});
  DeviceCall call(*b);
  expect_bad_index(*b, call,
                   "block_tables[2][1][1]: page id " + std::to_string(v) +
                       " differs from block_tables[2][0][1] = " + std::to_string(k) +
                       " (separate K/V page tables must name the same pages for MLA)");
}

// ---- The fp8_ds_mla cache (contract sections 1 and 3)
// --------------------------------------------

TEST(Sm90DecodeDsMla, DenseAndSparseMatchTheOracle) {
  SKIP_WITHOUT_HOPPER();
  std::vector<Case> cases;
  {
    Case c;  // dense, q_len 2, sinks and lse, 4-D cache
    c.B = 3;
    c.H = 16;
    c.q_len = 2;
    c.seq_lens = {700, 1, 0};
    c.page_size = 64;
    c.sinks = true;
    c.kv4d = true;
    cases.push_back(c);
  }
  {
    Case c;  // dense, 128 heads, padded strides, fp16 out
    c.B = 2;
    c.H = 128;
    c.q_len = 1;
    c.seq_lens = {333, 64};
    c.page_size = 32;
    c.strided = true;
    c.out_dtype = kFp16;
    cases.push_back(c);
  }
  {
    Case c;  // sparse, top_k 64, per-token lens, ragged
    c.B = 3;
    c.H = 64;
    c.ragged_q_lens = {2, 1, 3};
    c.seq_lens = {100, 40, 5};
    c.page_size = 64;
    c.top_k = 64;
    c.topk_lens = oracle::TopkLens::kPerToken;
    cases.push_back(c);
  }
  for (Case c : cases) {
    c.q_dtype = kBf16;
    c.kv_dtype = kBf16;
    c.seed = 4400 + c.H;
    c = deepseek(c);
    SCOPED_TRACE(case_name(c));
    std::unique_ptr<Built> b = build(c);
    std::vector<uint8_t> cache;
    mla_test::fp8_ds_mla::use_fp8_ds_mla(*b, cache);
    DeviceCall call(*b, &cache);
    // Dense and sparse calls run on the gather kernels (which round the dequantized values to
    // bf16: check_sm90_ds_mla): H 16 q_len 2 on the few-rows kernel, the others on the seesaw.
    const Route route = route_on_device(call.params);
    if (std::getenv("MLA_SM90_KERNEL") == nullptr) {
      EXPECT_EQ(route.kernel,
                c.H * c.q_len <= 32 && c.top_k == 0 ? Kernel::kFewRows : Kernel::kSeesaw);
    }
    ASSERT_TRUE(run_on_gpu(call.params));
    call.download(*b);
    check_sm90_ds_mla(*b, route, cache);
  }
}

// The other head dims FlashInfer's API takes, (256, 64) and (512, 0), on the TMA and gather kernels
// (their tiles hold zeros where the rows have no column, params.h): every kernel and split the
// route gives (few-rows one split and with the combine, the balanced schedule, the direct split,
// sparse on both kernels), each (query, kv_cache) pair, with sinks, masks, ragged queries and
// padded strides. Each call asserts that it did not run on the SIMT kernel.
TEST(Sm90DecodeHeadDims, FastPathsMatchTheOracle) {
  SKIP_WITHOUT_HOPPER();
  const std::pair<DataType, DataType> pairs[] = {
      {kBf16, kBf16}, {kFp16, kFp16}, {kFp8, kFp8}, {kBf16, kFp8}};
  std::vector<std::pair<Case, Kernel>> cases;
  for (auto [L, R] : {std::pair{256, 64}, std::pair{512, 0}}) {
    int n = 0;
    auto add = [&](Case c, Kernel k) {
      c.L = L;
      c.R = R;
      auto [q, kv] = pairs[n++ % 4];
      c.q_dtype = q;
      c.kv_dtype = kv;
      // NOTE: the test's padded strides leave e4m3 rows unaligned to 16 bytes (the SIMT kernel's).
      c.strided = c.strided && kv != kFp8;
      c.seed = 4700 + cases.size();
      cases.emplace_back(c, k);
    };
    Case c;  // few-rows, many splits and the combine
    c.B = 1;
    c.H = 16;
    c.seq_lens = {3000};
    c.page_size = 64;
    c.sinks = true;
    for (int i = 0; i < 4; ++i) add(c, Kernel::kFewRows);
    c = Case();  // few-rows, q_len 2, one split per request: out and lse directly
    c.B = 40;
    c.H = 16;
    c.q_len = 2;
    for (int r = 0; r < c.B; ++r) c.seq_lens.push_back(r % 5 == 0 ? 1 : 20 + 31 * r % 300);
    c.mask = Mask::kU32;
    for (int i = 0; i < 4; ++i) add(c, Kernel::kFewRows);
    c = Case();  // the balanced schedule, 128 heads, padded strides
    c.B = 6;
    c.H = 128;
    c.seq_lens = {900, 1, 0, 2000, 64, 333};
    c.page_size = 32;
    c.strided = true;
    for (int i = 0; i < 4; ++i) add(c, Kernel::kSeesaw);
    c = Case();  // one request: the direct split, q_len 2, fp16 out
    c.B = 1;
    c.H = 64;
    c.q_len = 2;
    c.seq_lens = {5000};
    c.out_dtype = kFp16;
    for (int i = 0; i < 4; ++i) add(c, Kernel::kSeesaw);
    c = Case();  // ragged tiles spanning tokens, sinks
    c.B = 3;
    c.H = 96;
    c.ragged_q_lens = {2, 1, 3};
    c.seq_lens = {700, 40, 5};
    c.sinks = true;
    for (int i = 0; i < 4; ++i) add(c, Kernel::kSeesaw);
    c = Case();  // sparse, 16 heads: few-rows, split over top_k, per-token lens
    c.B = 2;
    c.H = 16;
    c.seq_lens = {3000, 900};
    c.top_k = 2048;
    c.topk_lens = oracle::TopkLens::kPerToken;
    for (int i = 0; i < 4; ++i) add(c, Kernel::kFewRows);
    c = Case();  // sparse, 128 heads, q_len 2: the seesaw's tiles of 64 heads
    c.B = 2;
    c.H = 128;
    c.q_len = 2;
    c.seq_lens = {400, 150};
    c.top_k = 256;
    c.page_size = 1;
    for (int i = 0; i < 4; ++i) add(c, Kernel::kSeesaw);
  }
  for (const auto& [c, kernel] : cases) {
    SCOPED_TRACE(case_name(c) + " q " + std::to_string(c.q_dtype.bits) + " kv " +
                 std::to_string(c.kv_dtype.bits));
    std::unique_ptr<Built> b = build(c);
    DeviceCall call(*b);
    const Route route = route_on_device(call.params);
    if (std::getenv("MLA_SM90_KERNEL") == nullptr) {
      EXPECT_EQ(route.kernel, kernel);
    }
    ASSERT_TRUE(run_on_gpu(call.params));
    call.download(*b);
    check_sm90(*b);
  }
}
