// Sweeps of mla::decode on the cpu backend against the float64 oracle (docs/contract.md sections
// 1-3, 5).
//
// Hygiene: fresh random inputs per case; out and lse poisoned with NaN before each run; KV rows
// past seq_len, unused pages and the padding of strided tensors filled with NaN; unused
// block_tables slots hold invalid page ids; pages are handed out in a random permutation; the
// workspace holds garbage. Every out and lse element is compared, and out's padding must stay
// untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/decode_case.h"
#include "common/fp8_ds_mla.h"
#include "common/test_util.h"
#include "mla/mla.h"
#include "oracle/oracle.h"

namespace {

using namespace mla_test::decode_case;  // Case, Built, build, checks

class CpuDecode : public ::testing::TestWithParam<Case> {};

TEST_P(CpuDecode, MatchesOracle) {
  std::unique_ptr<Built> b = build(GetParam());
  ASSERT_TRUE(run_decode(b->params));
  check_against_oracle(*b);
}

std::string param_name(const ::testing::TestParamInfo<Case>& info) {
  return case_name(info.param) + "_" + std::to_string(info.index);
}

// ---- Case lists -------------------------------------------------------------------------------

const DataType kBf16 = dt::kBFloat16, kFp16 = dt::kFloat16, kFp8 = dt::kFloat8E4M3,
               kFp32 = dt::kFloat32;

// Heads x q_len x page size; seq_lens include a long one, 0, 1 (positions below 0 for q_len > 1)
// and exactly two full pages.
std::vector<Case> shape_cases() {
  std::vector<Case> cases;
  for (int H : {1, 3, 16, 128}) {
    for (int q_len = 1; q_len <= 5; ++q_len) {
      for (int ps : {1, 16, 64}) {
        Case c;
        c.B = 4;
        c.H = H;
        c.q_len = q_len;
        c.page_size = ps;
        c.seed = cases.size() + 1;
        mla_test::Rng rng(c.seed);
        c.seq_lens = {rng.randint(100, 300), 0, 1, 2 * ps};
        cases.push_back(c);
      }
    }
  }
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
    c.seed = 100 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  add({1, 3, 0, 5}, {200, 3, 50, 2}, 16, 16, false);
  add({1, 3, 0, 5}, {200, 3, 50, 2}, 16, 16, true);
  add({2, 2, 2}, {65, 1, 130}, 3, 64, true);
  add({0, 0, 4}, {0, 10, 70}, 16, 1, false);
  add({4}, {4}, 1, 16, false);
  add({40, 3}, {300, 50}, 3, 64, true);
  add({1, 2, 3, 4, 5}, {9, 0, 300, 4, 5}, 128, 16, false);
  Case* c = add({3, 1, 2}, {120, 77, 1}, 16, 16, false);
  c->q_dtype = c->kv_dtype = kFp8;
  c = add({2, 5, 1}, {100, 64, 33}, 16, 64, true);
  c->out_dtype = kFp16;
  c->sinks = true;
  return cases;
}

// Every dtype pair with both output dtypes, lse on and off.
std::vector<Case> dtype_cases() {
  std::vector<Case> cases;
  const std::pair<DataType, DataType> pairs[] = {
      {kBf16, kBf16}, {kFp16, kFp16}, {kFp8, kFp8}, {kBf16, kFp8}, {kFp32, kFp32}};
  for (auto [q, kv] : pairs) {
    for (DataType out : {kBf16, kFp16}) {
      for (bool lse : {true, false}) {
        Case c;
        c.B = 3;
        c.H = 16;
        c.q_len = 2;
        c.seq_lens = {150, 1, 33};
        c.q_dtype = q;
        c.kv_dtype = kv;
        c.out_dtype = out;
        c.lse = lse;
        c.seed = 200 + cases.size();
        cases.push_back(c);
      }
    }
  }
  return cases;
}

std::vector<Case> mask_cases() {
  std::vector<Case> cases;
  for (Mask m : {Mask::kU32, Mask::kU16}) {
    for (int q_len : {1, 3, 5}) {
      for (int ps : {1, 16}) {
        Case c;
        c.B = 4;
        c.H = 16;
        c.q_len = q_len;
        c.page_size = ps;
        c.mask = m;
        c.seq_lens = {180, 0, 2, q_len + 3};
        c.seed = 300 + cases.size();
        cases.push_back(c);
      }
    }
    Case c;  // ragged, one request with 40 query tokens: two mask words per row
    c.B = 3;
    c.H = 3;
    c.ragged_q_lens = {40, 3, 0};
    c.seq_lens = {300, 2, 9};
    c.page_size = 64;
    c.mask = m;
    c.seed = 300 + cases.size();
    cases.push_back(c);
    c.max_q_len_hint = true;
    c.sinks = true;
    c.seed = 300 + cases.size();
    cases.push_back(c);
    c = Case();  // dense, 33 query tokens: two words as well
    c.B = 2;
    c.H = 1;
    c.q_len = 33;
    c.seq_lens = {100, 40};
    c.mask = m;
    c.out_dtype = kFp16;
    c.seed = 300 + cases.size();
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> sink_cases() {
  std::vector<Case> cases;
  const std::pair<double, double> ranges[] = {{-2.0, 3.0}, {8.0, 12.0}, {-30.0, -20.0}};
  for (auto [lo, hi] : ranges) {
    for (int q_len : {1, 3}) {
      for (DataType out : {kBf16, kFp16}) {
        Case c;
        c.B = 3;
        c.H = 16;
        c.q_len = q_len;
        c.seq_lens = {0, 90, 2};
        c.sinks = true;
        c.sink_lo = lo;
        c.sink_hi = hi;
        c.out_dtype = out;
        c.seed = 400 + cases.size();
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// Scales as host floats and as device tensors, from flat to very peaky softmax.
std::vector<Case> scale_cases() {
  std::vector<Case> cases;
  const std::pair<double, double> scales[] = {{0.05, 1.0}, {0.3, 0.37}, {2.0, 3.0}, {20.0, 1.0}};
  for (bool tensors : {false, true}) {
    for (auto [bmm1, bmm2] : scales) {
      Case c;
      c.B = 3;
      c.H = 16;
      c.q_len = 2;
      c.seq_lens = {300, 17, 0};
      c.bmm1 = bmm1;
      c.bmm2 = bmm2;
      c.scale_tensors = tensors;
      c.sinks = bmm1 == 2.0;
      c.seed = 500 + cases.size();
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<Case> sparse_cases() {
  std::vector<Case> cases;
  using oracle::TopkLens;
  auto add = [&](int q_len, std::vector<int> ragged, int top_k, int ps, TopkLens lens) {
    Case c;
    c.B = ragged.empty() ? 3 : static_cast<int>(ragged.size());
    c.H = 16;
    c.q_len = q_len;
    c.ragged_q_lens = ragged;
    c.top_k = top_k;
    c.page_size = ps;
    c.topk_lens = lens;
    c.seq_lens.assign(c.B, 0);
    for (int r = 0; r < c.B; ++r) c.seq_lens[r] = 1 + 37 * r;
    c.seed = 600 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  for (TopkLens lens : {TopkLens::kNone, TopkLens::kPerRequest, TopkLens::kPerToken}) {
    add(1, {}, 64, 64, lens);
    add(2, {}, 8, 1, lens);
    add(4, {}, 100, 16, lens);
  }
  for (TopkLens lens : {TopkLens::kNone, TopkLens::kPerToken}) {
    add(0, {2, 0, 3}, 64, 16, lens);
    add(0, {1, 4}, 33, 1, lens);
  }
  // seq_len close to top_k with several query tokens: the causal bound seq_len - n + i + 1 cuts
  // some tokens' lists below top_k (and below topk_len), others not; a request shorter than its
  // query has tokens that count nothing.
  for (TopkLens lens : {TopkLens::kNone, TopkLens::kPerRequest, TopkLens::kPerToken}) {
    Case* c = add(4, {}, 64, 16, lens);
    c->B = 4;
    c->seq_lens = {62, 64, 66, 2};
  }
  for (TopkLens lens : {TopkLens::kNone, TopkLens::kPerToken}) {
    Case* c = add(0, {3, 1, 4, 2}, 33, 1, lens);
    c->seq_lens = {34, 33, 35, 1};
  }
  Case* c = add(5, {}, 8, 64, TopkLens::kNone);
  c->B = 2;
  c->seq_lens = {9, 6};
  c = add(2, {}, 128, 64, TopkLens::kPerToken);
  c->H = 128;
  c->sinks = true;
  c = add(3, {}, 64, 16, TopkLens::kNone);
  c->q_dtype = kBf16;
  c->kv_dtype = kFp8;
  c->kv4d = true;
  c->out_dtype = kFp16;
  c = add(1, {}, 64, 64, TopkLens::kPerRequest);
  c->q_dtype = c->kv_dtype = kFp8;
  c->scale_tensors = true;
  return cases;
}

// f = 1e-30 must give the dense result; long sequences span several 64-token blocks, and a very
// peaky softmax lets whole blocks fall below the threshold.
std::vector<Case> skip_cases() {
  std::vector<Case> cases;
  auto add = [&](int q_len, std::vector<int> seq_lens, int ps, double bmm1) {
    Case c;
    c.B = static_cast<int>(seq_lens.size());
    c.H = 16;
    c.q_len = q_len;
    c.seq_lens = seq_lens;
    c.page_size = ps;
    c.bmm1 = bmm1;
    c.skip = 1e-30f;
    c.seed = 700 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  add(1, {1000, 65, 64, 63, 0, 1}, 16, 0.0);
  add(3, {1000, 65, 64, 63, 0, 1}, 64, 0.0);
  add(1, {700, 129}, 64, 20.0);
  add(2, {700, 129}, 1, 20.0)->sinks = true;
  add(3, {300, 70}, 16, 0.0)->mask = Mask::kU32;
  Case* c = add(2, {400, 250}, 16, 0.0);
  c->top_k = 100;
  // Sparse mode bounds each token's list by seq_len - n + i + 1 (docs/contract.md section 2):
  // seq_len 0 counts nothing, seq_len 1 one entry of the last token; f = 1e-30 must give those rows
  // too.
  c = add(2, {0, 1}, 16, 0.0);
  c->top_k = 100;
  c = add(4, {500}, 64, 0.0);
  c->ragged_q_lens = {4};
  c->q_dtype = c->kv_dtype = kFp8;
  return cases;
}

// Padded strides on query, kv pages and rows, block_tables rows and out; the 4-D kv layout.
std::vector<Case> stride_cases() {
  std::vector<Case> cases;
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
        c.seed = 800 + cases.size();
        cases.push_back(c);
      }
    }
  }
  Case c;
  c.B = 2;
  c.H = 3;
  c.q_len = 2;
  c.seq_lens = {40, 40};
  c.top_k = 48;
  c.strided = true;
  c.kv4d = true;
  c.topk_lens = oracle::TopkLens::kPerToken;
  c.seed = 800 + cases.size();
  cases.push_back(c);
  return cases;
}

// The real DeepSeek shape, L = 512 and R = 64, a few small batches.
std::vector<Case> deepseek_cases() {
  std::vector<Case> cases;
  auto add = [&](int H, int q_len, std::vector<int> seq_lens, DataType q, DataType kv) {
    Case c;
    c.B = static_cast<int>(seq_lens.size());
    c.H = H;
    c.L = 512;
    c.R = 64;
    c.q_len = q_len;
    c.seq_lens = seq_lens;
    c.page_size = 64;
    c.q_dtype = q;
    c.kv_dtype = kv;
    c.seed = 900 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  add(16, 1, {300, 77}, kBf16, kBf16);
  add(128, 2, {257, 5}, kFp8, kFp8)->bmm1 = 1.0 / std::sqrt(192.0);
  Case* c = add(128, 1, {200, 1}, kBf16, kFp8);
  c->out_dtype = kFp16;
  c->sinks = true;
  c = add(16, 2, {150, 0}, kBf16, kBf16);
  c->top_k = 128;
  c->topk_lens = oracle::TopkLens::kPerToken;
  c = add(128, 0, {180, 3}, kFp16, kFp16);
  c->ragged_q_lens = {3, 1};
  c->mask = Mask::kU32;
  c->page_size = 16;
  return cases;
}

// Head widths that are not multiples of a vector width (the cpu backend takes any L > 0, R >= 0),
// and FlashInfer's other two head-dim pairs, (256, 64) and (512, 0).
std::vector<Case> odd_dim_cases() {
  std::vector<Case> cases;
  auto add = [&](int L, int R, int H, int q_len, DataType q, DataType kv) {
    Case c;
    c.B = 3;
    c.L = L;
    c.R = R;
    c.H = H;
    c.q_len = q_len;
    c.seq_lens = {90, 1, 17};
    c.q_dtype = q;
    c.kv_dtype = kv;
    c.seed = 1100 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  add(1, 1, 3, 2, kBf16, kBf16);
  add(7, 5, 16, 1, kFp8, kFp8)->out_dtype = kFp16;
  Case* c = add(30, 3, 1, 0, kBf16, kFp8);
  c->ragged_q_lens = {2, 0, 3};
  c->mask = Mask::kU32;
  c->sinks = true;
  add(33, 31, 128, 3, kFp16, kFp16)->strided = true;
  add(100, 9, 16, 2, kFp32, kFp32)->top_k = 33;
  add(256, 64, 16, 2, kBf16, kBf16)->sinks = true;
  add(256, 64, 128, 1, kBf16, kFp8)->top_k = 64;
  add(512, 0, 16, 3, kBf16, kBf16)->mask = Mask::kU32;
  add(512, 0, 128, 1, kFp16, kFp16)->scale_tensors = true;
  c = add(512, 0, 16, 0, kFp8, kFp8);
  c->ragged_q_lens = {2, 1, 0};
  c->top_k = 16;
  c->topk_lens = oracle::TopkLens::kPerToken;
  add(32, 0, 3, 2, kFp32, kFp32)->strided = true;
  return cases;
}

// Random combinations of every feature at once (fixed seeds), to catch interactions.
std::vector<Case> mixed_cases() {
  const MixedSpace space{{1, 3, 16, 128},
                         {1, 16, 64},
                         {kBf16, kFp16, kFp8, kBf16, kFp32},
                         {kBf16, kFp16, kFp8, kFp8, kFp32},
                         400,
                         0.05,
                         2.0};
  std::vector<Case> cases;
  for (int n = 0; n < 48; ++n) cases.push_back(mixed_case(1000 + n, space));
  return cases;
}

// ---- The fp8_ds_mla cache (docs/contract.md section 1): bfloat16 query, 656-byte rows, D = 576
// ----------

class CpuDecodeFp8DsMla : public ::testing::TestWithParam<Case> {};

TEST_P(CpuDecodeFp8DsMla, MatchesOracle) {
  std::unique_ptr<Built> b = build(GetParam());
  std::vector<uint8_t> cache;
  mla_test::fp8_ds_mla::use_fp8_ds_mla(*b, cache);
  ASSERT_TRUE(run_decode(b->params));
  check_against_oracle(*b);
}

// Dense and sparse, q_len 1 and MTP, ragged with a mask, sinks, scale tensors, padded and 4-D
// caches, pages of 1 to 64.
std::vector<Case> fp8_ds_mla_cases() {
  std::vector<Case> cases;
  auto add = [&](int H, int q_len, std::vector<int> seq_lens, int ps) {
    Case c;
    c.B = static_cast<int>(seq_lens.size());
    c.H = H;
    c.L = 512;
    c.R = 64;
    c.q_len = q_len;
    c.seq_lens = seq_lens;
    c.page_size = ps;
    c.q_dtype = c.kv_dtype = kBf16;  // kv: the values the cache is quantized from
    c.seed = 1300 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  add(16, 1, {300, 1, 0}, 64)->bmm1 = 1.0 / std::sqrt(192.0);  // DeepSeek-V3's softmax scale
  add(128, 2, {130, 65}, 16)->out_dtype = kFp16;
  Case* c = add(16, 0, {90, 3, 40}, 1);
  c->ragged_q_lens = {3, 0, 2};
  c->mask = Mask::kU32;
  c->sinks = true;
  c = add(16, 3, {70, 20}, 16);
  c->strided = true;
  c->kv4d = true;
  c->scale_tensors = true;
  c = add(16, 2, {150, 70}, 64);
  c->top_k = 64;
  c->topk_lens = oracle::TopkLens::kPerToken;
  c = add(128, 1, {200, 5}, 16);
  c->top_k = 128;
  c->sinks = true;
  c->skip = 1e-30f;
  c = add(3, 0, {40, 2}, 64);
  c->ragged_q_lens = {4, 1};
  c->top_k = 33;
  c->kv4d = true;
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Formats, CpuDecodeFp8DsMla, ::testing::ValuesIn(fp8_ds_mla_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "fp8dsmla_" + param_name(info);
                         });

INSTANTIATE_TEST_SUITE_P(Shapes, CpuDecode, ::testing::ValuesIn(shape_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Ragged, CpuDecode, ::testing::ValuesIn(ragged_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(DTypes, CpuDecode, ::testing::ValuesIn(dtype_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Masks, CpuDecode, ::testing::ValuesIn(mask_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Sinks, CpuDecode, ::testing::ValuesIn(sink_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Scales, CpuDecode, ::testing::ValuesIn(scale_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Sparse, CpuDecode, ::testing::ValuesIn(sparse_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(SkipSoftmax, CpuDecode, ::testing::ValuesIn(skip_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Strides, CpuDecode, ::testing::ValuesIn(stride_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(OddDims, CpuDecode, ::testing::ValuesIn(odd_dim_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Mixed, CpuDecode, ::testing::ValuesIn(mixed_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(DeepSeekShape, CpuDecode, ::testing::ValuesIn(deepseek_cases()),
                         param_name);

// ---- Skip-softmax drops a block only when it is negligible for every row
// --------------------------

// Scores by construction (bmm1 = 1, query one-hot in dims 0 and 1): head 0 scores +50 on block 0
// and -50 on blocks 1 and 2; head 1 scores 0 on blocks 0 and 1 and -80 on block 2. Block 1 is
// negligible for head 0 (e^-100) but carries half of head 1's weight; block 2 is negligible for
// both (e^-80 < 1e-30 / 192) and may be dropped.
TEST(CpuDecodeSkipSoftmax, KeepsABlockThatOneRowNeeds) {
  Case c;
  c.B = 1;
  c.H = 2;
  c.q_len = 2;
  c.seq_lens = {192};
  c.page_size = 64;
  c.q_dtype = c.kv_dtype = kFp32;
  c.bmm1 = 1.0;
  c.skip = 1e-30f;
  std::unique_ptr<Built> b = build(c);
  for (int t = 0; t < b->T; ++t) {
    for (int d = 0; d < b->D; ++d) {
      b->set_query(t, 0, d, d == 0 ? 50.0 : 0.0);
      b->set_query(t, 1, d, d == 1 ? 1.0 : 0.0);
    }
  }
  for (int j = 0; j < 192; ++j) {
    b->set_key(0, j, 0, j < 64 ? 1.0 : -1.0);
    b->set_key(0, j, 1, j < 128 ? 0.0 : -80.0);
  }
  ASSERT_TRUE(run_decode(b->params));
  check_against_oracle(*b);
}

// ---- Non-finite inputs propagate to exactly the rows they touch (docs/contract.md section 1)
// ------------

// Two requests of two query tokens and a third without keys; token 0 of a request sees keys
// 0 .. seq_len - 2, token 1 every key.
Case nan_case() {
  Case c;
  c.B = 3;
  c.H = 4;
  c.q_len = 2;
  c.seq_lens = {150, 7, 0};
  c.page_size = 16;
  return c;
}

// Runs `b` (outputs filled with a finite value first) and checks the NaN rows and the others
// against the oracle; returns the number of NaN rows.
int64_t run_with_nan_rows(Built& b) {
  fill_outputs(b, 12345.0);
  EXPECT_TRUE(run_decode(b.params));
  return check_nan_rows_against_oracle(b);
}

TEST(CpuDecodeNonFinite, NanInOneQueryRowMakesOnlyThatRowNaN) {
  for (DataType q : {kBf16, kFp16, kFp8, kFp32}) {
    Case c = nan_case();
    c.q_dtype = c.kv_dtype = q;
    std::unique_ptr<Built> b = build(c);
    poison_query(*b, 1, 2, 5);  // request 0, token 1, head 2
    EXPECT_EQ(run_with_nan_rows(*b), 1) << mla_test::dtype_name(q);
    poison_query(*b, 4, 0, 0);  // request 2 has no keys: its row stays empty
    EXPECT_EQ(run_with_nan_rows(*b), 1) << mla_test::dtype_name(q);
  }
}

TEST(CpuDecodeNonFinite, InfInAQueryRow) {
  std::unique_ptr<Built> b = build(nan_case());
  poison_query(*b, 2, 3, 40, /*inf=*/true);  // request 1, token 0, head 3, in the rope part
  EXPECT_EQ(run_with_nan_rows(*b), 1);
}

TEST(CpuDecodeNonFinite, NanInAnAttendedKeyMakesTheRowsAttendingItNaN) {
  Case c = nan_case();
  c.skip = 1e-30f;  // a block holding a NaN key is never skipped
  std::unique_ptr<Built> b = build(c);
  poison_key(*b, 0, 149, 7);  // request 0's last key: only its token 1 sees it
  EXPECT_EQ(run_with_nan_rows(*b), 4);
  b = build(c);
  poison_key(*b, 0, 3, 40);  // an early key, in the rope part: both tokens of request 0
  EXPECT_EQ(run_with_nan_rows(*b), 8);
  b = build(c);
  poison_key(*b, 1, 6, 0, /*inf=*/true);  // +inf in a value of request 1's last key
  EXPECT_EQ(run_with_nan_rows(*b), 4);
}

TEST(CpuDecodeNonFinite, KeysThatAreNotAttendedHaveNoEffect) {
  // A custom mask that hides draft key 1 (the last key) from both tokens of request 0.
  Case c = nan_case();
  c.mask = Mask::kU32;
  std::unique_ptr<Built> b = build(c);
  b->mask[0] = b->in.mask[0] = 0b01u;
  b->mask[1] = b->in.mask[1] = 0b01u;
  poison_key(*b, 0, 149, 0);
  poison_key(*b, 0, 149, 33, /*inf=*/true);
  EXPECT_EQ(run_with_nan_rows(*b), 0);
  // Sparse: entries past the counted ones (topk_len, the causal bound) and pool rows that no
  // counted entry names hold NaN (decode_case.h): no row may turn NaN.
  c = nan_case();
  c.top_k = 16;
  c.topk_lens = oracle::TopkLens::kPerToken;
  b = build(c);
  EXPECT_EQ(run_with_nan_rows(*b), 0);
}

TEST(CpuDecodeNonFinite, NonFiniteScalesMakeEveryRowWithKeysNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (bool tensors : {false, true}) {
    for (int which : {1, 2}) {
      for (float v : {nan, inf, -inf}) {
        Case c = nan_case();
        c.scale_tensors = tensors;
        std::unique_ptr<Built> b = build(c);
        float& scale = which == 1 ? (tensors ? b->bmm1_value : b->params.bmm1_scale)
                                  : (tensors ? b->bmm2_value : b->params.bmm2_scale);
        scale = v;
        (which == 1 ? b->in.bmm1_scale : b->in.bmm2_scale) = v;
        SCOPED_TRACE(std::string(tensors ? "tensor " : "float ") + "bmm" + std::to_string(which) +
                     " " + std::to_string(v));
        // Requests 0 and 1: 2 tokens x 4 heads each; request 2 has no keys and stays empty.
        EXPECT_EQ(run_with_nan_rows(*b), 16);
        for (int h = 0; h < c.H; ++h) {
          EXPECT_EQ(b->lse.get(4 * c.H + h), -std::numeric_limits<double>::infinity());
        }
      }
    }
  }
}

TEST(CpuDecodeNonFinite, NanInAKeyOfTheFp8DsMlaCache) {
  Case c = nan_case();
  c.L = 512;
  c.R = 64;
  std::unique_ptr<Built> b = build(c);
  std::vector<uint8_t> cache;
  mla_test::fp8_ds_mla::use_fp8_ds_mla(*b, cache);
  // Key 3 of request 1 (both tokens): its first scale becomes NaN.
  const int64_t page = b->block_tables[b->block_table_stride + 0];
  const int64_t slot = page * c.page_size + 3;
  const int64_t row = page * b->params.kv_cache.strides[0] + 3 * b->params.kv_cache.strides[1];
  std::memset(&cache[static_cast<size_t>(row) + 512], 0xff, 4);
  for (int k = 0; k < 128; ++k) b->in.kv[slot * b->D + k] = std::nan("");
  EXPECT_EQ(run_with_nan_rows(*b), 8);
}

// ---- Sinks in bf16 and fp16 --------------------------------------------------------------------

TEST(CpuDecodeSinks, SixteenBitSinksAreConverted) {
  for (DataType sinks_dtype : {kBf16, kFp16}) {
    Case c;
    c.B = 2;
    c.H = 16;
    c.q_len = 2;
    c.seq_lens = {90, 0};
    c.sinks = true;
    std::unique_ptr<Built> b = build(c);
    mla_test::Buffer sinks(sinks_dtype, c.H);
    for (int h = 0; h < c.H; ++h) b->in.sinks[h] = sinks.set(h, b->sinks[h]);
    b->params.sinks = TensorView::contiguous(sinks.data(), sinks_dtype, {c.H});
    ASSERT_TRUE(run_decode(b->params)) << mla_test::dtype_name(sinks_dtype);
    check_against_oracle(*b);
  }
}

// ---- Empty batches ----------------------------------------------------------------------------

TEST(CpuDecodeEmpty, ZeroRequestsIsANoOp) {
  Case c;
  c.B = 0;
  c.q_len = 2;
  std::unique_ptr<Built> b = build(c);
  ASSERT_TRUE(run_decode(b->params));
  EXPECT_TRUE(b->outputs_untouched());
}

TEST(CpuDecodeEmpty, ZeroTokensIsANoOp) {
  Case c;
  c.B = 2;
  c.ragged_q_lens = {0, 0};
  c.seq_lens = {5, 0};
  std::unique_ptr<Built> b = build(c);
  ASSERT_TRUE(run_decode(b->params));
  EXPECT_TRUE(b->outputs_untouched());
}

// ---- Index contents are always checked on the cpu backend --------------------------------------

// Expects kBadIndex naming `name` (or `alt_name`), with out and lse left untouched.
void expect_bad_index(const Built& b, const std::string& name, const std::string& alt_name = "") {
  try {
    mla::decode(b.params);
    ADD_FAILURE() << "no error for a bad " << name;
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), mla::ErrorCode::kBadIndex) << e.what();
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find(name) != std::string::npos ||
                (!alt_name.empty() && msg.find(alt_name) != std::string::npos))
        << "message does not name " << name << ": " << msg;
  }
  EXPECT_TRUE(b.outputs_untouched()) << "out or lse written before the error";
}

TEST(CpuDecodeIndices, BlockTableEntryOutOfRange) {
  std::unique_ptr<Built> b = build(small_index_case());
  b->block_tables[1] = b->num_pages;  // request 0, logical page 1 of 3 needed
  expect_bad_index(*b, "block_tables");
  b = build(small_index_case());
  b->block_tables[2 * b->block_table_stride + 1] = -1;  // request 2, its last needed page
  expect_bad_index(*b, "block_tables");
}

TEST(CpuDecodeIndices, NegativeSeqLen) {
  std::unique_ptr<Built> b = build(small_index_case());
  b->seq_lens[1] = -1;
  expect_bad_index(*b, "seq_lens");
}

TEST(CpuDecodeIndices, SeqLenBeyondBlockTableCapacity) {
  std::unique_ptr<Built> b = build(small_index_case());
  b->seq_lens[2] = static_cast<int32_t>(b->max_pages * 16 + 1);
  expect_bad_index(*b, "seq_lens", "max_seq_len");
}

TEST(CpuDecodeIndices, BadCumSeqLensQ) {
  Case c = small_index_case();
  c.ragged_q_lens = {2, 1, 2};
  std::unique_ptr<Built> b = build(c);
  b->cum_seq_lens_q = {0, 3, 2, 5};  // decreasing
  expect_bad_index(*b, "cum_seq_lens_q");
  b = build(c);
  b->cum_seq_lens_q = {1, 2, 3, 5};  // does not start at 0
  expect_bad_index(*b, "cum_seq_lens_q");
  b = build(c);
  b->cum_seq_lens_q = {0, 2, 3, 4};  // does not end at T = 5
  expect_bad_index(*b, "cum_seq_lens_q");
}

TEST(CpuDecodeIndices, QueryLongerThanMaxQLenHint) {
  Case c = small_index_case();
  c.ragged_q_lens = {2, 1, 2};
  c.max_q_len_hint = true;
  std::unique_ptr<Built> b = build(c);
  b->params.max_q_len = 1;
  expect_bad_index(*b, "max_q_len", "cum_seq_lens_q");
}

TEST(CpuDecodeIndices, SparseIndexOutOfRange) {
  Case c = small_index_case();
  c.top_k = 16;
  std::unique_ptr<Built> b = build(c);
  b->sparse_indices[5 * 16 + 3] = b->num_pages * c.page_size;  // one past the pool
  expect_bad_index(*b, "sparse_indices");
  b = build(c);
  b->sparse_indices[7] = -2;
  expect_bad_index(*b, "sparse_indices");
}

TEST(CpuDecodeIndices, NegativeTopkLen) {
  Case c = small_index_case();
  c.top_k = 16;
  c.topk_lens = oracle::TopkLens::kPerToken;
  std::unique_ptr<Built> b = build(c);
  b->topk_lens[3] = -1;
  expect_bad_index(*b, "sparse_topk_lens");
}

// ---- Separate K/V page tables: [B, 2, max_pages], row 1 equal to row 0 (docs/contract.md section
// 3) -----

TEST(CpuDecodeKvPageTables, SameResultAsOneTable) {
  for (int pad : {0, 3}) {
    for (bool sinks_and_mask : {false, true}) {
      Case c;
      c.B = 3;
      c.H = 16;
      c.q_len = 3;
      c.seq_lens = {200, 1, 40};
      c.strided = pad > 0;
      c.sinks = sinks_and_mask;
      c.mask = sinks_and_mask ? Mask::kU32 : Mask::kNone;
      std::unique_ptr<Built> b = build(c);
      ASSERT_TRUE(run_decode(b->params));
      check_against_oracle(*b);
      const std::vector<uint8_t> out = b->out.bytes(), lse = b->lse.bytes();

      std::vector<int32_t> tables = kv_page_tables(*b, pad);
      const int64_t row = b->max_pages + pad;
      b->params.block_tables = TensorView::strided(
          tables.data(), dt::kInt32, {c.B, 2, b->max_pages}, {2 * row + 2 * pad, row, 1});
      b->reset_outputs(77);
      ASSERT_TRUE(run_decode(b->params));
      EXPECT_TRUE(out == b->out.bytes()) << "pad " << pad;
      EXPECT_TRUE(lse == b->lse.bytes()) << "pad " << pad;
    }
  }
}

TEST(CpuDecodeKvPageTables, RowsThatDifferOnANeededPageAreABadIndex) {
  std::unique_ptr<Built> b = build(small_index_case());
  std::vector<int32_t> tables = kv_page_tables(*b, 0);
  const int64_t mp = b->max_pages;
  b->params.block_tables = TensorView::contiguous(tables.data(), dt::kInt32, {b->c.B, 2, mp});
  // Request 2 (seq_len 20, pages of 16) needs logical pages 0 and 1.
  int32_t& v = tables[2 * 2 * mp + mp + 1];
  const int32_t k = tables[2 * 2 * mp + 1];
  v = k == 0 ? 1 : 0;
  try {
    mla::decode(b->params);
    ADD_FAILURE() << "no error for differing K/V page tables";
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), mla::ErrorCode::kBadIndex) << e.what();
    EXPECT_EQ(std::string(e.what()),
              "block_tables[2][1][1]: page id " + std::to_string(v) +
                  " differs from block_tables[2][0][1] = " + std::to_string(k) +
                  " (separate K/V page tables must name the same pages for MLA)");
  }
  EXPECT_TRUE(b->outputs_untouched());
  // An out-of-range page in row 0 is named with its row.
  v = k;
  tables[1] = -1;
  expect_bad_index(*b, "block_tables[0][0][1]: page id -1 out of range");
}

// ---- Determinism ------------------------------------------------------------------------------

TEST(CpuDecodeDeterminism, TwoRunsAreBitwiseIdentical) {
  Case c;
  c.B = 3;
  c.H = 16;
  c.q_len = 3;
  c.seq_lens = {1000, 500, 7};
  c.page_size = 64;
  c.sinks = true;
  std::unique_ptr<Built> b = build(c);
  ASSERT_TRUE(run_decode(b->params));
  const std::vector<uint8_t> out1 = b->out.bytes(), lse1 = b->lse.bytes();
  b->reset_outputs(12345);
  ASSERT_TRUE(run_decode(b->params));
  EXPECT_TRUE(out1 == b->out.bytes());
  EXPECT_TRUE(lse1 == b->lse.bytes());
  check_against_oracle(*b);
}

}  // namespace

// ---- Scratch size ----------------------------------------------------------------------------

// Validation bounds T x H and D by int32, not H x D: a stride-0 view with H and D near 2^31 would
// wrap the scratch size the cpu backend asks for. workspace_size refuses it instead (only shapes
// are read: the data pointers are never dereferenced).
TEST(CpuDecodeWorkspace, HugeHeadsTimesHeadDimIsRefused) {
  static uint8_t byte;
  void* fake = &byte;
  const int64_t H = int64_t{1} << 30, L = int64_t{1} << 20;
  mla::DecodeParams p;
  p.query = TensorView::strided(fake, kBf16, {1, 1, H, L}, {0, 0, 0, 1});
  p.kv_cache = TensorView::strided(fake, kBf16, {1, 16, L}, {0, 0, 1});
  p.block_tables = TensorView::strided(fake, dt::kInt32, {1, 1}, {1, 1});
  p.seq_lens = TensorView::strided(fake, dt::kInt32, {1}, {1});
  p.out = TensorView::strided(fake, kBf16, {1, 1, H, L}, {H * L, H * L, L, 1});
  p.kv_lora_rank = static_cast<int32_t>(L);
  p.qk_rope_head_dim = 0;
  p.backend = mla::Backend::kCpu;
  try {
    (void)mla::workspace_size(p);
    ADD_FAILURE() << "no error for a scratch of 2^30 heads of D 2^20";
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), mla::ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("exceeds 2^40 floats"), std::string::npos) << e.what();
  }
}
