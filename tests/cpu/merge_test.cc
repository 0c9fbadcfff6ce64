// Sweeps of mla::merge_states on the cpu backend against the float64 merge oracle
// (docs/contract.md section 7; tolerances: tests/common/merge_case.h).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/merge_case.h"
#include "mla/mla.h"

namespace {

using namespace mla_test::merge_case;
namespace dt = mla::dtype;

class CpuMerge : public ::testing::TestWithParam<Case> {};

TEST_P(CpuMerge, MatchesOracle) {
  std::unique_ptr<Built> b = build(GetParam());
  mla::merge_states(b->params);
  check_against_oracle(*b);
}

std::vector<Case> merge_cases() {
  std::vector<Case> cases;
  uint64_t seed = 1;
  for (int N : {1, 2, 3, 5, 8}) {
    for (int H : {1, 16, 128}) {
      for (mla::DataType d : {dt::kBFloat16, dt::kFloat16}) {
        Case c;
        c.N = N;
        c.H = H;
        c.T = H == 128 ? 2 : 5;
        c.dtype = d;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  // Odd widths, strided layouts, no lse, sinks of every dtype, the special rows.
  for (int L : {1, 7, 64, 512}) {
    for (bool strided : {false, true}) {
      Case c;
      c.N = 3;
      c.T = 4;
      c.H = 5;
      c.L = L;
      c.strided = strided;
      c.with_lse = L != 64;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  for (mla::DataType s : {dt::kFloat32, dt::kBFloat16, dt::kFloat16}) {
    for (int N : {1, 2, 4}) {
      Case c;
      c.N = N;
      c.sinks = s;
      c.dtype = N == 4 ? dt::kFloat16 : dt::kBFloat16;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  for (Special sp : {Special::kEmptyParts, Special::kNanLse, Special::kWideRange}) {
    for (int N : {1, 2, 3, 6}) {
      for (bool sinks : {false, true}) {
        Case c;
        c.N = N;
        c.T = 4;
        c.H = 16;
        c.special = sp;
        if (sinks) c.sinks = dt::kFloat32;
        c.strided = N == 3;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, CpuMerge, ::testing::ValuesIn(merge_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return case_name(info.param) + "_" + std::to_string(info.index);
                         });

// One part is the identity: out = out_0 (rounded from itself: exact), lse = lse_0.
TEST(CpuMergeExact, OnePartIsTheIdentity) {
  Case c;
  c.N = 1;
  std::unique_ptr<Built> b = build(c);
  mla::merge_states(b->params);
  for (int64_t i = 0; i < int64_t{c.T} * c.H * c.L; ++i) {
    ASSERT_EQ(b->out.get(i), b->in.out_parts[i]) << "element " << i;
  }
  for (int64_t i = 0; i < int64_t{c.T} * c.H; ++i) {
    ASSERT_EQ(b->lse.get(i), static_cast<double>(static_cast<float>(b->in.lse_parts[i])));
  }
}

// Results are bitwise identical run to run (rows are independent, sums in part order).
TEST(CpuMergeExact, Deterministic) {
  Case c;
  c.N = 5;
  c.T = 64;
  c.H = 16;
  std::unique_ptr<Built> b = build(c);
  mla::merge_states(b->params);
  const std::vector<uint8_t> first = b->out.bytes();
  b->out.poison();
  mla::merge_states(b->params);
  EXPECT_EQ(first, b->out.bytes());
}

// T = 0 is a valid call that writes nothing.
TEST(CpuMergeExact, NoTokens) {
  Case c;
  c.T = 0;
  std::unique_ptr<Built> b = build(c);
  EXPECT_NO_THROW(mla::merge_states(b->params));
}

}  // namespace
