// One test (or more) per validation rule of mla::merge_states (include/mla/merge.h): each bad
// argument is refused with an error naming it, before anything is written.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/merge_case.h"
#include "mla/mla.h"

namespace {

using namespace mla_test::merge_case;
namespace dt = mla::dtype;

// Runs merge_states and expects an mla::Error of `code` whose message contains `needle`, with out
// and lse untouched (still NaN poison).
void expect_refused(Built& b, mla::ErrorCode code, const std::string& needle) {
  try {
    mla::merge_states(b.params);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (int64_t i = 0; i < b.out.count(); ++i) ASSERT_TRUE(b.out.is_poison(i)) << "out written";
  for (int64_t i = 0; i < b.lse.count(); ++i) ASSERT_TRUE(b.lse.is_poison(i)) << "lse written";
}

std::unique_ptr<Built> valid() {
  Case c;
  c.N = 2;
  c.T = 3;
  c.H = 4;
  c.L = 16;
  return build(c);
}

TEST(MergeValidate, MissingTensors) {
  auto b = valid();
  b->params.out_parts = {};
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out_parts: expected a tensor");
  b = valid();
  b->params.lse_parts = {};
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse_parts: expected a tensor");
  b = valid();
  b->params.out = {};
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out: expected a tensor");
}

TEST(MergeValidate, Ranks) {
  auto b = valid();
  b->params.out_parts.ndim = 3;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out_parts: expected rank 4");
  b = valid();
  b->params.lse_parts.ndim = 2;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse_parts: expected rank 3");
  b = valid();
  b->params.out.ndim = 4;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out: expected rank 3");
  b = valid();
  b->params.lse.ndim = 3;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse: expected rank 2");
}

TEST(MergeValidate, Dtypes) {
  auto b = valid();
  b->params.out_parts.dtype = dt::kFloat32;
  expect_refused(*b, mla::ErrorCode::kTypeError, "out_parts: expected dtype bfloat16 or float16");
  b = valid();
  b->params.out.dtype = dt::kFloat16;
  expect_refused(*b, mla::ErrorCode::kTypeError, "out: expected dtype bfloat16");
  b = valid();
  b->params.lse_parts.dtype = dt::kBFloat16;
  expect_refused(*b, mla::ErrorCode::kTypeError, "lse_parts: expected dtype float32");
  b = valid();
  b->params.lse.dtype = dt::kInt32;
  expect_refused(*b, mla::ErrorCode::kTypeError, "lse: expected dtype float32");
  b = valid();
  b->sinks = mla_test::Buffer(dt::kFloat32, 4);
  b->params.sinks = mla::TensorView::contiguous(b->sinks.data(), dt::kInt32, {4});
  expect_refused(*b, mla::ErrorCode::kTypeError, "sinks: expected dtype float32");
}

TEST(MergeValidate, Shapes) {
  auto b = valid();
  b->params.out_parts.shape[0] = 0;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "at least one part");
  b = valid();
  b->params.lse_parts.shape[0] = 3;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse_parts: expected parts N 2");
  b = valid();
  b->params.lse_parts.shape[2] = 5;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse_parts: expected heads H 4");
  b = valid();
  b->params.out.shape[2] = 8;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out: expected value width L 16");
  b = valid();
  b->params.out.shape[0] = 2;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out: expected tokens T 3");
  b = valid();
  b->params.lse.shape[1] = 2;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse: expected heads H 4");
  b = valid();
  b->sinks = mla_test::Buffer(dt::kFloat32, 5);
  b->params.sinks = mla::TensorView::contiguous(b->sinks.data(), dt::kFloat32, {5});
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "sinks: expected heads H 4");
}

TEST(MergeValidate, Strides) {
  auto b = valid();
  b->params.out_parts.strides[3] = 2;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out_parts: expected a contiguous last dim");
  b = valid();
  b->params.out.strides[2] = 2;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out: expected a contiguous last dim");
  b = valid();
  b->params.out.strides[0] = 0;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "out: expected a non-zero stride");
  b = valid();
  b->params.lse.strides[1] = 0;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse: expected a non-zero stride");
}

TEST(MergeValidate, Devices) {
  auto b = valid();
  b->params.lse_parts.device = mla::cuda_device(0);
  expect_refused(*b, mla::ErrorCode::kDeviceError, "lse_parts: expected device cpu (out_parts')");
  b = valid();
  b->params.backend = mla::Backend::kSm90;
  expect_refused(*b, mla::ErrorCode::kDeviceError, "out_parts: backend sm90 expects CUDA tensors");
}

TEST(MergeValidate, OutputsApartFromInputs) {
  auto b = valid();
  b->params.out.data = b->params.out_parts.data;  // out over part 0
  try {
    mla::merge_states(b->params);
    FAIL() << "expected an overlap error";
  } catch (const mla::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out: overlaps out_parts"), std::string::npos) << e.what();
  }
  b = valid();
  b->params.lse.data = b->params.lse_parts.data;
  expect_refused(*b, mla::ErrorCode::kInvalidArgument, "lse: overlaps lse_parts");
}

}  // namespace
