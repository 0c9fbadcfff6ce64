// Sweeps of mla::decode on the cpu backend against the float64 oracle (SPEC.md sections 1-3, 5).
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
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/decode_case.h"
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
  Case* c = add(2, {}, 128, 64, TopkLens::kPerToken);
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
  // Sparse mode attends the listed slots whatever seq_len says (SPEC.md section 2), so seq_len 0
  // with listed keys is valid input, and f = 1e-30 must still give the exact result.
  c = add(2, {0, 0}, 16, 0.0);
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

// Head widths that are not multiples of a vector width (the cpu backend takes any positive L, R).
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

Case index_case() {
  Case c;
  c.B = 3;
  c.H = 3;
  c.q_len = 2;
  c.seq_lens = {40, 0, 20};
  c.page_size = 16;
  return c;
}

TEST(CpuDecodeIndices, BlockTableEntryOutOfRange) {
  std::unique_ptr<Built> b = build(index_case());
  b->block_tables[1] = b->num_pages;  // request 0, logical page 1 of 3 needed
  expect_bad_index(*b, "block_tables");
  b = build(index_case());
  b->block_tables[2 * b->block_table_stride + 1] = -1;  // request 2, its last needed page
  expect_bad_index(*b, "block_tables");
}

TEST(CpuDecodeIndices, NegativeSeqLen) {
  std::unique_ptr<Built> b = build(index_case());
  b->seq_lens[1] = -1;
  expect_bad_index(*b, "seq_lens");
}

TEST(CpuDecodeIndices, SeqLenBeyondBlockTableCapacity) {
  std::unique_ptr<Built> b = build(index_case());
  b->seq_lens[2] = static_cast<int32_t>(b->max_pages * 16 + 1);
  expect_bad_index(*b, "seq_lens", "max_seq_len");
}

TEST(CpuDecodeIndices, BadCumSeqLensQ) {
  Case c = index_case();
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
  Case c = index_case();
  c.ragged_q_lens = {2, 1, 2};
  c.max_q_len_hint = true;
  std::unique_ptr<Built> b = build(c);
  b->params.max_q_len = 1;
  expect_bad_index(*b, "max_q_len", "cum_seq_lens_q");
}

TEST(CpuDecodeIndices, SparseIndexOutOfRange) {
  Case c = index_case();
  c.top_k = 16;
  std::unique_ptr<Built> b = build(c);
  b->sparse_indices[5 * 16 + 3] = b->num_pages * c.page_size;  // one past the pool
  expect_bad_index(*b, "sparse_indices");
  b = build(c);
  b->sparse_indices[7] = -2;
  expect_bad_index(*b, "sparse_indices");
}

TEST(CpuDecodeIndices, NegativeTopkLen) {
  Case c = index_case();
  c.top_k = 16;
  c.topk_lens = oracle::TopkLens::kPerToken;
  std::unique_ptr<Built> b = build(c);
  b->topk_lens[3] = -1;
  expect_bad_index(*b, "sparse_topk_lens");
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
