// Validation tests (docs/contract.md section 5): every rule of src/host/validate.cc and
// src/host/api.cc, each checked against an otherwise valid call. A rejection must carry the right
// mla::ErrorCode, a message that starts with the argument's name and quotes the value given, and
// must leave out and lse untouched: bad input gets a clear error before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mla/mla.h"

#ifdef MLA_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using mla::Backend;
using mla::DecodeParams;
using mla::ErrorCode;
using mla::TensorView;
namespace dtype = mla::dtype;

// ---- Baseline shapes: tiny, so every decode takes microseconds ----

constexpr int64_t kB = 2;   // batch
constexpr int64_t kQ = 2;   // q_len (dense)
constexpr int64_t kT = 3;   // query tokens of the ragged baseline, cum_seq_lens_q = {0, 1, 3}
constexpr int64_t kH = 4;   // heads
constexpr int64_t kL = 32;  // kv_lora_rank
constexpr int64_t kR = 16;  // qk_rope_head_dim
constexpr int64_t kD = kL + kR;
constexpr int64_t kPageSize = 16;
constexpr int64_t kPages = 8;     // P
constexpr int64_t kMaxPages = 4;  // block_tables.shape[1]: capacity 64 tokens per request
constexpr int64_t kTopK = 8;      // sparse baseline

constexpr int64_t kPow2_27 = int64_t{1} << 27;  // * page_size 16 = 2^31, one past INT32_MAX
constexpr int64_t kPow2_29 = int64_t{1} << 29;  // * 4 query tokens = 2^31

constexpr uint16_t kOutSentinel = 0x7fc0;      // bf16 quiet NaN: never a valid output
constexpr uint32_t kLseSentinel = 0x7fc00000;  // fp32 quiet NaN

const mla::Device kCuda0 = mla::cuda_device(0);
const mla::DataType kInt64{static_cast<uint8_t>(mla::TypeCode::kInt), 64, 1};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// fp32 -> bf16 by truncation; exact for the short-mantissa values the tests use.
uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>(u >> 16);
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Runs `call`; returns the message of the mla::Error it throws, checking its code.
std::string error_of(const std::function<void()>& call, ErrorCode code) {
  try {
    call();
  } catch (const mla::Error& e) {
    EXPECT_STREQ(mla::error_code_name(e.code()), mla::error_code_name(code)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected mla::Error (" << mla::error_code_name(code)
                << "), but nothing was thrown";
  return "";
}

// A named TensorView member of DecodeParams, for rules every tensor argument shares.
struct TensorArg {
  const char* name;
  TensorView DecodeParams::*member;
};

class ValidateTest : public ::testing::Test {
 protected:
  void SetUp() override { make_dense(); }

  // ---- Baselines: every one passes mla::decode (checked by the *BaselineIsValid tests) ----

  // Dense: query [2, 2, 4, 48] bf16, kv_cache [8, 16, 48] bf16, seq_lens {20, 33}, with lse.
  void make_dense() {
    p_ = DecodeParams{};
    query_.resize(kB * kQ * kH * kD);
    for (size_t i = 0; i < query_.size(); ++i) {
      query_[i] = bf16(static_cast<float>(static_cast<int>(i * 37 % 17) - 8) * 0.0625f);
    }
    kv_.resize(kPages * kPageSize * kD);
    for (size_t i = 0; i < kv_.size(); ++i) {
      kv_[i] = bf16(static_cast<float>(static_cast<int>(i * 53 % 13) - 6) * 0.125f);
    }
    block_tables_ = {0, 1, 2, 3, 7, 6, 5, 4};
    seq_lens_ = {20, 33};
    out_.assign(kB * kQ * kH * kL, kOutSentinel);
    lse_.assign(kB * kQ * kH, 0.0f);
    p_.query = TensorView::contiguous(query_.data(), dtype::kBFloat16, {kB, kQ, kH, kD});
    p_.kv_cache = TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages, kPageSize, kD});
    p_.block_tables = TensorView::contiguous(block_tables_.data(), dtype::kInt32, {kB, kMaxPages});
    p_.seq_lens = TensorView::contiguous(seq_lens_.data(), dtype::kInt32, {kB});
    p_.out = TensorView::contiguous(out_.data(), dtype::kBFloat16, {kB, kQ, kH, kL});
    p_.lse = TensorView::contiguous(lse_.data(), dtype::kFloat32, {kB, kQ, kH});
    p_.kv_lora_rank = static_cast<int32_t>(kL);
    p_.qk_rope_head_dim = static_cast<int32_t>(kR);
    p_.qk_nope_head_dim = 16;
    p_.bmm1_scale = 1.0f / std::sqrt(static_cast<float>(kD));
    p_.backend = Backend::kCpu;
    refresh_workspace();
  }

  // Ragged: query [3, 4, 48] with cum_seq_lens_q {0, 1, 3}; out [3, 4, 32], lse [3, 4].
  void make_ragged() {
    make_dense();
    cum_ = {0, 1, 3};
    out_.assign(kT * kH * kL, kOutSentinel);
    lse_.assign(kT * kH, 0.0f);
    p_.cum_seq_lens_q = TensorView::contiguous(cum_.data(), dtype::kInt32, {kB + 1});
    p_.query = TensorView::contiguous(query_.data(), dtype::kBFloat16, {kT, kH, kD});
    p_.out = TensorView::contiguous(out_.data(), dtype::kBFloat16, {kT, kH, kL});
    p_.lse = TensorView::contiguous(lse_.data(), dtype::kFloat32, {kT, kH});
    refresh_workspace();
  }

  // Sparse: sparse_top_k 8, sparse_indices [2, 2, 8] of flat slots (some -1), no block_tables.
  void make_sparse() {
    make_dense();
    sparse_.resize(kB * kQ * kTopK);
    for (size_t i = 0; i < sparse_.size(); ++i) {
      sparse_[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(i * 7 % (kPages * kPageSize));
    }
    p_.sparse_top_k = static_cast<int32_t>(kTopK);
    p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kB, kQ, kTopK});
    p_.block_tables = TensorView{};
    refresh_workspace();
  }

  // Per-request sparse_topk_lens [B].
  void add_topk_lens() {
    topk_lens_ = {5, 8, 3, 0};
    p_.sparse_topk_lens = TensorView::contiguous(topk_lens_.data(), dtype::kInt32, {kB});
  }

  // Custom mask, one uint32 word per row: token i sees draft keys 0..i (causal-equivalent).
  void add_mask() {
    if (p_.cum_seq_lens_q.defined()) {
      mask_ = {1, 1, 3};
      p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt32, {kT, 1});
    } else {
      mask_ = {1, 3, 1, 3};
      p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt32, {kB, kQ, 1});
    }
  }

  void add_sinks() {
    sinks_ = {0.5f, -1.0f, 0.0f, 2.0f};
    p_.sinks = TensorView::contiguous(sinks_.data(), dtype::kFloat32, {kH});
  }

  void add_scale_tensors() {
    scale1_ = {p_.bmm1_scale};
    scale2_ = {p_.bmm2_scale};
    p_.bmm1_scale_tensor = TensorView::contiguous(scale1_.data(), dtype::kFloat32, {1});
    p_.bmm2_scale_tensor = TensorView::contiguous(scale2_.data(), dtype::kFloat32, {1});
  }

  // Dense with every optional tensor of dense mode: lse, mask, sinks, scale tensors.
  void make_full_dense() {
    make_dense();
    add_mask();
    add_sinks();
    add_scale_tensors();
    refresh_workspace();
  }

  // A workspace of exactly workspace_size(p_) bytes (0 bytes gives a defined, empty view).
  void refresh_workspace() {
    ws_.assign(mla::workspace_size(p_), 0);
    p_.workspace =
        TensorView::contiguous(ws_.data(), dtype::kUInt8, {static_cast<int64_t>(ws_.size())});
  }

  // Puts every defined tensor of p_ on `device`.
  void set_device(mla::Device device) {
    for (const TensorArg& arg : all_tensor_args()) {
      if ((p_.*arg.member).defined()) (p_.*arg.member).device = device;
    }
    if (p_.query.defined()) p_.query.device = device;
    if (p_.workspace.defined()) p_.workspace.device = device;
  }

  // ---- Sentinels: out and lse are poisoned before each call ----

  void poison() {
    std::fill(out_.begin(), out_.end(), kOutSentinel);
    std::fill(lse_.begin(), lse_.end(), kNaN);
  }

  // Nothing written to out or lse.
  void expect_untouched() {
    size_t out_written = 0, lse_written = 0;
    for (uint16_t v : out_) out_written += v != kOutSentinel;
    for (float v : lse_) lse_written += bits_of(v) != kLseSentinel;
    EXPECT_EQ(out_written, 0u) << "out elements written by a rejected call";
    EXPECT_EQ(lse_written, 0u) << "lse elements written by a rejected call";
  }

  // Every element of out and lse written (the buffers match the baseline's shapes).
  void expect_written() {
    size_t out_left = 0, lse_left = 0;
    for (uint16_t v : out_) out_left += v == kOutSentinel;
    for (float v : lse_) lse_left += bits_of(v) == kLseSentinel;
    EXPECT_EQ(out_left, 0u) << "out elements left unwritten";
    EXPECT_EQ(lse_left, 0u) << "lse elements left unwritten";
  }

  // Decodes p_ (which must be valid), checks out and lse were written, returns out.
  std::vector<uint16_t> decode_ok() {
    poison();
    EXPECT_NO_THROW(mla::decode(p_));
    expect_written();
    return out_;
  }

  // Checks one rejection message: starts with "<arg>:" and contains every fragment.
  static void expect_message(const std::string& msg, const std::string& arg,
                             const std::vector<std::string>& fragments) {
    EXPECT_EQ(msg.rfind(arg + ":", 0), 0u)
        << "message does not start with '" << arg << ":': " << msg;
    for (const std::string& f : fragments) {
      EXPECT_NE(msg.find(f), std::string::npos) << "message lacks '" << f << "': " << msg;
    }
  }

  // mla::decode(p_) is rejected with `code` and a message naming `arg` and containing every
  // fragment; plan() rejects it with the same message, and so does workspace_size() for every
  // argument it reads (all but the workspace); out and lse stay untouched.
  void expect_error(ErrorCode code, const std::string& arg,
                    const std::vector<std::string>& fragments = {}) {
    poison();
    const std::string msg = error_of([&] { mla::decode(p_); }, code);
    expect_message(msg, arg, fragments);
    EXPECT_EQ(error_of([&] { mla::plan(p_); }, code), msg);
    if (arg != "workspace") {
      EXPECT_EQ(error_of([&] { mla::workspace_size(p_); }, code), msg);
    }
    expect_untouched();
  }

  // mla::run(plan, p_) is rejected; out and lse stay untouched.
  void expect_run_error(const mla::Plan& plan, ErrorCode code, const std::string& arg,
                        const std::vector<std::string>& fragments = {}) {
    poison();
    const std::string msg = error_of([&] { mla::run(plan, p_); }, code);
    expect_message(msg, arg, fragments);
    expect_untouched();
  }

  // Every optional or required tensor argument except query and workspace.
  static std::vector<TensorArg> all_tensor_args() {
    return {{"kv_cache", &DecodeParams::kv_cache},
            {"block_tables", &DecodeParams::block_tables},
            {"seq_lens", &DecodeParams::seq_lens},
            {"cum_seq_lens_q", &DecodeParams::cum_seq_lens_q},
            {"sinks", &DecodeParams::sinks},
            {"mask", &DecodeParams::mask},
            {"sparse_indices", &DecodeParams::sparse_indices},
            {"sparse_topk_lens", &DecodeParams::sparse_topk_lens},
            {"bmm1_scale (tensor)", &DecodeParams::bmm1_scale_tensor},
            {"bmm2_scale (tensor)", &DecodeParams::bmm2_scale_tensor},
            {"out", &DecodeParams::out},
            {"lse", &DecodeParams::lse}};
  }

  // Baselines that together define every tensor argument, each with a name for traces.
  std::vector<std::pair<const char*, std::function<void()>>> baselines() {
    return {{"full dense", [this] { make_full_dense(); }},
            {"ragged",
             [this] {
               make_ragged();
               add_mask();
               refresh_workspace();
             }},
            {"sparse", [this] {
               make_sparse();
               add_topk_lens();
               refresh_workspace();
             }}};
  }

  // Runs `mutate_and_check(name, tensor)` once per defined tensor of each baseline, restoring the
  // baseline between calls.
  void for_each_tensor(const std::function<void(const char*, TensorView&)>& mutate_and_check) {
    for (auto& [baseline_name, make] : baselines()) {
      for (const TensorArg& arg : all_tensor_args()) {
        make();
        TensorView& t = p_.*arg.member;
        if (!t.defined()) continue;
        SCOPED_TRACE(std::string(baseline_name) + " baseline, " + arg.name);
        mutate_and_check(arg.name, t);
      }
    }
  }

  DecodeParams p_;
  std::vector<uint16_t> query_, kv_, out_;
  std::vector<float> lse_, sinks_, scale1_, scale2_;
  std::vector<int32_t> block_tables_, seq_lens_, cum_, sparse_, topk_lens_;
  std::vector<uint32_t> mask_;
  std::vector<uint8_t> ws_;
};

// ---- The baselines are valid ----

TEST_F(ValidateTest, DenseBaselineIsValid) { decode_ok(); }

TEST_F(ValidateTest, RaggedBaselineIsValid) {
  make_ragged();
  decode_ok();
}

TEST_F(ValidateTest, SparseBaselineIsValid) {
  make_sparse();
  decode_ok();
  add_topk_lens();
  decode_ok();
}

TEST_F(ValidateTest, EveryOptionalTensorBaselineIsValid) {
  for (auto& [name, make] : baselines()) {
    SCOPED_TRACE(name);
    make();
    decode_ok();
  }
}

// ---- Rules shared by every tensor argument ----

TEST_F(ValidateTest, EveryTensorMustBeOnTheQueryDevice) {
  for_each_tensor([&](const char* name, TensorView& t) {
    t.device = kCuda0;
    expect_error(ErrorCode::kDeviceError, name,
                 {"expected device cpu (the query's)", "got cuda:0"});
  });
}

TEST_F(ValidateTest, EveryTensorNeedsADataPointer) {
  for_each_tensor([&](const char* name, TensorView& t) {
    t.data = nullptr;
    expect_error(ErrorCode::kInvalidArgument, name, {"expected a data pointer", "got null"});
  });
}

TEST_F(ValidateTest, EveryTensorRejectsNegativeSizes) {
  for_each_tensor([&](const char* name, TensorView& t) {
    t.shape[0] = -1;
    expect_error(ErrorCode::kInvalidArgument, name, {"expected non-negative sizes", "[-1"});
  });
}

TEST_F(ValidateTest, EveryTensorRejectsNegativeStrides) {
  for_each_tensor([&](const char* name, TensorView& t) {
    t.strides[0] = -3;
    expect_error(ErrorCode::kInvalidArgument, name, {"expected non-negative strides", "[-3"});
  });
}

TEST_F(ValidateTest, EveryTensorRejectsRankAboveFour) {
  for_each_tensor([&](const char* name, TensorView& t) {
    t.ndim = TensorView::kMaxDims + 1;
    expect_error(ErrorCode::kInvalidArgument, name, {"expected rank at most 4", "got rank 5"});
  });
}

// ---- query ----

TEST_F(ValidateTest, QueryMissing) {
  p_.query = TensorView{};
  expect_error(ErrorCode::kInvalidArgument, "query", {"expected a tensor", "got none"});
}

TEST_F(ValidateTest, QueryDenseRankMustBe4) {
  p_.query = TensorView::contiguous(query_.data(), dtype::kBFloat16, {kB * kQ, kH, kD});
  expect_error(ErrorCode::kInvalidArgument, "query",
               {"expected rank 4 [B, q_len, H, D]", "got rank 3", "[4, 4, 48]"});
}

TEST_F(ValidateTest, QueryRaggedRankMustBe3) {
  make_ragged();
  p_.query = TensorView::contiguous(query_.data(), dtype::kBFloat16, {1, kT, kH, kD});
  expect_error(ErrorCode::kInvalidArgument, "query",
               {"expected rank 3 [T, H, D] (cum_seq_lens_q given)", "got rank 4"});
}

TEST_F(ValidateTest, QueryRankAbove4) {
  p_.query = TensorView::contiguous(query_.data(), dtype::kBFloat16, {1, kB, kQ, kH, kD});
  expect_error(ErrorCode::kInvalidArgument, "query", {"expected rank at most 4", "got rank 5"});
}

TEST_F(ValidateTest, QueryLastDimMustBeLPlusR) {
  p_.query = TensorView::contiguous(query_.data(), dtype::kBFloat16, {kB, kQ, kH, kL});
  expect_error(ErrorCode::kInvalidArgument, "query",
               {"expected last dim (kv_lora_rank 32 + qk_rope_head_dim 16) = 48", "got 32"});
}

TEST_F(ValidateTest, QueryLastDimMustBeContiguous) {
  p_.query = TensorView::strided(query_.data(), dtype::kBFloat16, {kB, kQ, kH, kD},
                                 {kQ * kH * kD, kH * kD, kD, 2});
  expect_error(ErrorCode::kInvalidArgument, "query",
               {"expected a contiguous last dim (stride 1)", "[384, 192, 48, 2]"});
}

TEST_F(ValidateTest, QueryNegativeStride) {
  p_.query.strides[1] = -kH * kD;
  expect_error(ErrorCode::kInvalidArgument, "query", {"expected non-negative strides", "-192"});
}

TEST_F(ValidateTest, QueryNegativeSize) {
  p_.query.shape[0] = -2;
  expect_error(ErrorCode::kInvalidArgument, "query", {"expected non-negative sizes", "[-2"});
}

TEST_F(ValidateTest, QueryNullData) {
  p_.query.data = nullptr;
  expect_error(ErrorCode::kInvalidArgument, "query", {"expected a data pointer", "got null"});
}

TEST_F(ValidateTest, QueryZeroHeads) {
  p_.query.shape[2] = 0;
  p_.out.shape[2] = 0;
  p_.lse.shape[2] = 0;
  expect_error(ErrorCode::kInvalidArgument, "query",
               {"expected at least 1 head (dim 2)", "[2, 2, 0, 48]"});
}

TEST_F(ValidateTest, QueryZeroHeadsRagged) {
  make_ragged();
  p_.query.shape[1] = 0;
  p_.out.shape[1] = 0;
  p_.lse.shape[1] = 0;
  expect_error(ErrorCode::kInvalidArgument, "query",
               {"expected at least 1 head (dim 1)", "[3, 0, 48]"});
}

// q_len 0: no query tokens (T = 0), a no-op (docs/contract.md section 3), with every dense option.
TEST_F(ValidateTest, DenseWithoutQueryTokensIsANoOp) {
  make_full_dense();
  for (TensorView* t : {&p_.query, &p_.out, &p_.lse, &p_.mask}) t->shape[1] = 0;
  for (int32_t max_q_len : {-1, 0}) {
    p_.max_q_len = max_q_len;
    refresh_workspace();
    poison();
    EXPECT_NO_THROW(mla::decode(p_));
    expect_untouched();
  }
  // The other arguments are still checked against q_len 0.
  p_.out.shape[1] = 1;
  expect_error(ErrorCode::kInvalidArgument, "out", {"[2, 1, 4, 32]"});
  p_.out.shape[1] = 0;
  p_.max_q_len = 1;
  expect_error(ErrorCode::kInvalidArgument, "max_q_len",
               {"expected -1 or q_len 0 for dense queries", "got 1"});
}

// ---- Head dims ----

TEST_F(ValidateTest, KvLoraRankMustBePositive) {
  for (int32_t v : {0, -32}) {
    p_.kv_lora_rank = v;
    expect_error(ErrorCode::kInvalidArgument, "kv_lora_rank",
                 {"expected a positive value", "got " + std::to_string(v)});
  }
}

TEST_F(ValidateTest, RopeHeadDimMustBeNonNegative) {
  for (int32_t v : {-1, -64}) {
    p_.qk_rope_head_dim = v;
    expect_error(ErrorCode::kInvalidArgument, "qk_rope_head_dim",
                 {"expected a non-negative value", "got " + std::to_string(v)});
  }
}

// R = 0 (FlashInfer's (512, 0)): the key is the value row; here L = 48 over the same tensors.
TEST_F(ValidateTest, RopeHeadDimZeroIsAccepted) {
  out_.assign(kB * kQ * kH * kD, kOutSentinel);
  p_.out = TensorView::contiguous(out_.data(), dtype::kBFloat16, {kB, kQ, kH, kD});
  p_.kv_lora_rank = static_cast<int32_t>(kD);
  p_.qk_rope_head_dim = 0;
  refresh_workspace();
  decode_ok();
}

// D = L + R is int32: a sum past INT32_MAX is refused, not wrapped (signed overflow).
TEST_F(ValidateTest, HeadDimsSumMustFitInt32) {
  p_.kv_lora_rank = std::numeric_limits<int32_t>::max();
  p_.qk_rope_head_dim = 1;
  expect_error(
      ErrorCode::kInvalidArgument, "qk_rope_head_dim",
      {"expected kv_lora_rank + qk_rope_head_dim to fit int32", "got 2147483647 + 1 = 2147483648"});
  p_.qk_rope_head_dim = 0;  // D = INT32_MAX fits, and then does not match the query
  expect_error(ErrorCode::kInvalidArgument, "query", {"= 2147483647, got 48"});
}

TEST_F(ValidateTest, NopeHeadDimMustBePositive) {
  for (int32_t v : {0, -128}) {
    p_.qk_nope_head_dim = v;
    expect_error(ErrorCode::kInvalidArgument, "qk_nope_head_dim",
                 {"expected a positive value", "got " + std::to_string(v)});
  }
}

TEST_F(ValidateTest, HeadDimsMustMatchTheTensors) {
  p_.kv_lora_rank = 64;  // query and kv_cache still have D = 48
  expect_error(ErrorCode::kInvalidArgument, "query",
               {"(kv_lora_rank 64 + qk_rope_head_dim 16) = 80", "got 48"});
}

// ---- kv_cache ----

TEST_F(ValidateTest, KvCacheMissing) {
  p_.kv_cache = TensorView{};
  expect_error(ErrorCode::kInvalidArgument, "kv_cache", {"expected a tensor", "got none"});
}

TEST_F(ValidateTest, KvCacheRank) {
  p_.kv_cache = TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages * kPageSize, kD});
  expect_error(
      ErrorCode::kInvalidArgument, "kv_cache",
      {"expected rank 3 [P, page_size, D] or 4 [P, 1, page_size, D]", "got rank 2", "[128, 48]"});
}

TEST_F(ValidateTest, KvCache4DNeedsOneHead) {
  p_.kv_cache =
      TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages / 2, 2, kPageSize, kD});
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected dim 1 (heads) = 1", "got 2", "[4, 2, 16, 48]"});
}

TEST_F(ValidateTest, KvCacheLastDim) {
  p_.kv_cache =
      TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages / 2, kPageSize, 2 * kD});
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected last dim (kv_lora_rank 32 + qk_rope_head_dim 16) = 48", "got 96"});
}

TEST_F(ValidateTest, KvCachePageSizeMustBeAPowerOfTwo) {
  p_.kv_cache = TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages, 12, kD});
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected page_size (dim 1) to be a power of two", "got 12"});
  p_.kv_cache = TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages, 0, kD});
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected page_size (dim 1) to be a power of two", "got 0"});
  p_.kv_cache = TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages, 1, 24, kD});
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected page_size (dim 2) to be a power of two", "got 24"});
}

TEST_F(ValidateTest, KvCacheLastDimMustBeContiguous) {
  p_.kv_cache = TensorView::strided(kv_.data(), dtype::kBFloat16, {kPages / 2, kPageSize, kD},
                                    {2 * kPageSize * kD, 2 * kD, 2});
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected a contiguous last dim (stride 1)", "[1536, 96, 2]"});
}

// ---- dtypes ----

TEST_F(ValidateTest, QueryDtype) {
  p_.query.dtype = dtype::kInt32;
  expect_error(ErrorCode::kTypeError, "query",
               {"expected dtype bfloat16, float16 or float8_e4m3fn (cpu backend: also float32)",
                "got int32"});
}

TEST_F(ValidateTest, KvCacheDtype) {
  p_.kv_cache.dtype = dtype::kUInt16;
  expect_error(ErrorCode::kTypeError, "kv_cache",
               {"expected dtype bfloat16, float16 or float8_e4m3fn", "got uint16"});
}

TEST_F(ValidateTest, DtypePairs) {
  struct Pair {
    mla::DataType q, kv;
    const char* got;
  };
  for (const Pair& pair : {Pair{dtype::kFloat16, dtype::kBFloat16, "(float16, bfloat16)"},
                           Pair{dtype::kFloat8E4M3, dtype::kBFloat16, "(float8_e4m3fn, bfloat16)"},
                           Pair{dtype::kBFloat16, dtype::kFloat16, "(bfloat16, float16)"},
                           Pair{dtype::kFloat16, dtype::kFloat8E4M3, "(float16, float8_e4m3fn)"},
                           Pair{dtype::kFloat32, dtype::kBFloat16, "(float32, bfloat16)"},
                           Pair{dtype::kBFloat16, dtype::kFloat32, "(bfloat16, float32)"}}) {
    SCOPED_TRACE(pair.got);
    p_.query.dtype = pair.q;
    p_.kv_cache.dtype = pair.kv;
    expect_error(ErrorCode::kTypeError, "kv_cache",
                 {"expected a dtype pair (query, kv_cache)", std::string("got ") + pair.got});
  }
}

// Every accepted pair runs; fp32 only on the cpu backend. Zero bytes are 0 in every dtype.
TEST_F(ValidateTest, AcceptedDtypePairs) {
  std::vector<float> q32(query_.size(), 0.0f), kv32(kv_.size(), 0.0f);
  for (auto [q, kv] :
       {std::pair{dtype::kBFloat16, dtype::kBFloat16}, std::pair{dtype::kFloat16, dtype::kFloat16},
        std::pair{dtype::kFloat8E4M3, dtype::kFloat8E4M3},
        std::pair{dtype::kBFloat16, dtype::kFloat8E4M3},
        std::pair{dtype::kFloat32, dtype::kFloat32}}) {
    make_dense();
    SCOPED_TRACE("query " + std::to_string(q.bits) + " bits code " + std::to_string(q.code) +
                 ", kv " + std::to_string(kv.bits) + " bits code " + std::to_string(kv.code));
    p_.query.data = q32.data();
    p_.query.dtype = q;
    p_.kv_cache.data = kv32.data();
    p_.kv_cache.dtype = kv;
    refresh_workspace();
    decode_ok();
  }
}

TEST_F(ValidateTest, Fp32QueryWithAutoBackendOnHostRunsOnCpu) {
  std::vector<float> q32(query_.size(), 0.25f), kv32(kv_.size(), 0.5f);
  p_.backend = Backend::kAuto;
  p_.query.data = q32.data();
  p_.query.dtype = dtype::kFloat32;
  p_.kv_cache.data = kv32.data();
  p_.kv_cache.dtype = dtype::kFloat32;
  refresh_workspace();
  decode_ok();
}

// ---- Devices and backends ----

TEST_F(ValidateTest, CpuBackendRejectsCudaTensors) {
  set_device(kCuda0);
  expect_error(ErrorCode::kDeviceError, "query",
               {"backend cpu expects host tensors", "got device cuda:0"});
}

// What backend sm90 says about CUDA tensors depends on the build and the machine: a build without
// CUDA and a machine without a CUDA device or driver reject it as unavailable, a GPU of another
// architecture is named, and a Hopper GPU accepts the call. Returns the expected fragments, or
// an empty list where the call must pass validation.
std::vector<std::string> sm90_unavailable_fragments() {
#ifdef MLA_TEST_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return {"sm90 is not available", "no CUDA device", "cuda:0"};
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major * 10 + minor != 90) return {"compute capability 9.0", "cuda:0", "compute capability"};
  return {};
#else
  return {"sm90 is not available in this build", "MLA_ENABLE_CUDA=OFF"};
#endif
}

// The baseline with the DeepSeek head dims (kv_lora_rank 512, rope 64) that sm90 supports, on
// cuda:0. The pointers are host memory: only validation and workspace_size() may look at them.
class Sm90ValidateTest : public ValidateTest {
 protected:
  void make_sm90_dense(Backend backend) {
    constexpr int64_t L = 512, R = 64, D = L + R;
    query16_.assign(kB * kQ * kH * D, 0);
    kv16_.assign(kPages * kPageSize * D, 0);
    out16_.assign(kB * kQ * kH * L, 0);
    p_.query = TensorView::contiguous(query16_.data(), dtype::kBFloat16, {kB, kQ, kH, D});
    p_.kv_cache = TensorView::contiguous(kv16_.data(), dtype::kBFloat16, {kPages, kPageSize, D});
    p_.out = TensorView::contiguous(out16_.data(), dtype::kBFloat16, {kB, kQ, kH, L});
    p_.kv_lora_rank = static_cast<int32_t>(L);
    p_.qk_rope_head_dim = static_cast<int32_t>(R);
    p_.workspace = TensorView{};
    p_.backend = backend;
    set_device(kCuda0);
  }

  void expect_sm90_availability() {
    const std::vector<std::string> fragments = sm90_unavailable_fragments();
    if (fragments.empty()) {
      EXPECT_NO_THROW(mla::workspace_size(p_));  // a Hopper GPU: validation passes
      return;
    }
    const std::string msg = error_of([&] { mla::workspace_size(p_); }, ErrorCode::kUnsupported);
    expect_message(msg, "backend", fragments);
  }

  std::vector<uint16_t> query16_, kv16_, out16_;
};

TEST_F(Sm90ValidateTest, Sm90BackendAvailabilityIsReported) {
  make_sm90_dense(Backend::kSm90);
  expect_sm90_availability();
}

TEST_F(Sm90ValidateTest, AutoBackendWithCudaTensorsPicksSm90OrSaysWhyNot) {
  make_sm90_dense(Backend::kAuto);
  expect_sm90_availability();
}

// The sm90 backend's limits are checked on the host before the device, in every build.
TEST_F(ValidateTest, Sm90RejectsOtherHeadDims) {
  set_device(kCuda0);
  p_.backend = Backend::kSm90;
  expect_error(ErrorCode::kUnsupported, "kv_lora_rank/qk_rope_head_dim",
               {"backend sm90", "(512, 64), (256, 64) or (512, 0)", "got (32, 16)"});
}

TEST_F(Sm90ValidateTest, Sm90RejectsTooManyHeads) {
  make_sm90_dense(Backend::kSm90);
  p_.query.shape[2] = 129;
  p_.out.shape[2] = 129;
  p_.lse = TensorView{};
  const std::string msg = error_of([&] { mla::workspace_size(p_); }, ErrorCode::kUnsupported);
  expect_message(msg, "query", {"backend sm90", "128 heads", "got 129"});
}

TEST_F(Sm90ValidateTest, Sm90RejectsLargePages) {
  make_sm90_dense(Backend::kSm90);
  p_.kv_cache.shape[0] = 1;
  p_.kv_cache.shape[1] = 512;
  p_.kv_cache.strides[0] = 512 * 576;
  const std::string msg = error_of([&] { mla::workspace_size(p_); }, ErrorCode::kUnsupported);
  expect_message(msg, "kv_cache", {"backend sm90", "page_size up to 256", "got 512"});
}

TEST_F(Sm90ValidateTest, Sm90RejectsLongDenseQueries) {
  make_sm90_dense(Backend::kSm90);
  p_.query.shape[1] = 17;
  p_.out.shape[1] = 17;
  p_.lse = TensorView{};
  const std::string msg = error_of([&] { mla::workspace_size(p_); }, ErrorCode::kUnsupported);
  expect_message(msg, "query", {"backend sm90", "q_len up to 16", "got 17"});
}

TEST_F(ValidateTest, Sm90BackendRejectsHostTensors) {
  p_.backend = Backend::kSm90;
  expect_error(ErrorCode::kDeviceError, "query",
               {"backend sm90 expects CUDA tensors", "got device cpu"});
}

TEST_F(ValidateTest, TensorsOnAnotherCudaDevice) {
  set_device(kCuda0);
  p_.backend = Backend::kAuto;
  p_.kv_cache.device = mla::cuda_device(1);
  expect_error(ErrorCode::kDeviceError, "kv_cache",
               {"expected device cuda:0 (the query's)", "got cuda:1"});
}

TEST_F(ValidateTest, UnknownDeviceType) {
  set_device(mla::Device{7, 0});
  p_.backend = Backend::kAuto;
  expect_error(ErrorCode::kDeviceError, "query",
               {"expected a host (cpu) or CUDA tensor", "got device device_type 7:0"});
  p_.backend = Backend::kCpu;
  expect_error(ErrorCode::kDeviceError, "query",
               {"backend cpu expects host tensors", "got device device_type 7:0"});
}

TEST_F(ValidateTest, PinnedHostMemoryRunsOnCpu) {
  set_device(mla::Device{static_cast<int32_t>(mla::DeviceType::kCUDAHost), 0});
  p_.backend = Backend::kAuto;
  decode_ok();
}

TEST_F(ValidateTest, BackendEnumOutOfRange) {
  p_.backend = static_cast<Backend>(7);
  expect_error(ErrorCode::kInvalidArgument, "backend",
               {"expected auto, sm90 or cpu", "got enum value 7"});
}

TEST(ParseBackend, KnownNames) {
  EXPECT_EQ(mla::parse_backend("auto"), Backend::kAuto);
  EXPECT_EQ(mla::parse_backend("sm90"), Backend::kSm90);
  EXPECT_EQ(mla::parse_backend("cpu"), Backend::kCpu);
  for (Backend b : {Backend::kAuto, Backend::kSm90, Backend::kCpu}) {
    EXPECT_EQ(mla::parse_backend(mla::backend_name(b)), b);
  }
}

TEST(ParseBackend, UnknownNameNamesTheValue) {
  for (const char* name : {"trtllm-gen", "CPU", ""}) {
    const std::string msg =
        error_of([&] { mla::parse_backend(name); }, ErrorCode::kInvalidArgument);
    EXPECT_EQ(msg.rfind("backend:", 0), 0u) << msg;
    EXPECT_NE(msg.find("auto, sm90, cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("got '") + name + "'"), std::string::npos) << msg;
  }
}

TEST(ErrorCodeName, EveryCode) {
  EXPECT_STREQ(mla::error_code_name(ErrorCode::kInvalidArgument), "InvalidArgument");
  EXPECT_STREQ(mla::error_code_name(ErrorCode::kTypeError), "TypeError");
  EXPECT_STREQ(mla::error_code_name(ErrorCode::kDeviceError), "DeviceError");
  EXPECT_STREQ(mla::error_code_name(ErrorCode::kUnsupported), "Unsupported");
  EXPECT_STREQ(mla::error_code_name(ErrorCode::kBadIndex), "BadIndex");
  EXPECT_STREQ(mla::error_code_name(ErrorCode::kWorkspaceTooSmall), "WorkspaceTooSmall");
  EXPECT_STREQ(mla::error_code_name(ErrorCode::kRuntimeError), "RuntimeError");
}

// ---- seq_lens ----

TEST_F(ValidateTest, SeqLensMissing) {
  p_.seq_lens = TensorView{};
  expect_error(ErrorCode::kInvalidArgument, "seq_lens", {"expected a tensor", "got none"});
}

TEST_F(ValidateTest, SeqLensRank) {
  p_.seq_lens = TensorView::contiguous(seq_lens_.data(), dtype::kInt32, {kB, 1});
  expect_error(ErrorCode::kInvalidArgument, "seq_lens",
               {"expected rank 1 [B]", "got rank 2", "[2, 1]"});
}

TEST_F(ValidateTest, SeqLensDtype) {
  p_.seq_lens.dtype = kInt64;
  expect_error(ErrorCode::kTypeError, "seq_lens", {"expected dtype int32", "got int64"});
}

TEST_F(ValidateTest, SeqLensLength) {
  seq_lens_.push_back(5);
  p_.seq_lens = TensorView::contiguous(seq_lens_.data(), dtype::kInt32, {kB + 1});
  expect_error(ErrorCode::kInvalidArgument, "seq_lens",
               {"expected length B (query dim 0) = 2", "got 3"});
}

TEST_F(ValidateTest, SeqLensMustBeContiguous) {
  p_.seq_lens = TensorView::strided(block_tables_.data(), dtype::kInt32, {kB}, {2});
  expect_error(ErrorCode::kInvalidArgument, "seq_lens",
               {"expected a contiguous last dim (stride 1)", "[2]"});
}

// ---- cum_seq_lens_q and max_q_len ----

TEST_F(ValidateTest, CumSeqLensQRank) {
  make_ragged();
  p_.cum_seq_lens_q = TensorView::contiguous(cum_.data(), dtype::kInt32, {1, kB + 1});
  expect_error(ErrorCode::kInvalidArgument, "cum_seq_lens_q",
               {"expected rank 1 [B + 1]", "got rank 2", "[1, 3]"});
}

TEST_F(ValidateTest, CumSeqLensQDtype) {
  make_ragged();
  p_.cum_seq_lens_q.dtype = dtype::kUInt32;
  expect_error(ErrorCode::kTypeError, "cum_seq_lens_q", {"expected dtype int32", "got uint32"});
}

TEST_F(ValidateTest, CumSeqLensQLengthIsBPlusOne) {
  make_ragged();
  p_.cum_seq_lens_q.shape[0] = kB;
  expect_error(ErrorCode::kInvalidArgument, "cum_seq_lens_q",
               {"expected length B + 1 (B from seq_lens) = 3", "got 2"});
}

TEST_F(ValidateTest, CumSeqLensQMustBeContiguous) {
  make_ragged();
  p_.cum_seq_lens_q = TensorView::strided(block_tables_.data(), dtype::kInt32, {kB + 1}, {2});
  expect_error(ErrorCode::kInvalidArgument, "cum_seq_lens_q",
               {"expected a contiguous last dim (stride 1)", "[2]"});
}

TEST_F(ValidateTest, MaxQLenDenseMustMatchQLen) {
  for (int32_t v : {1, 3, 0}) {
    p_.max_q_len = v;
    expect_error(ErrorCode::kInvalidArgument, "max_q_len",
                 {"expected -1 or q_len 2 for dense queries", "got " + std::to_string(v)});
  }
  p_.max_q_len = static_cast<int32_t>(kQ);
  decode_ok();
}

// 0 only where the query has no tokens (RaggedWithoutQueryTokensIsANoOp).
TEST_F(ValidateTest, MaxQLenRaggedMustBePositiveOrMinusOne) {
  make_ragged();
  for (int32_t v : {0, -2}) {
    p_.max_q_len = v;
    expect_error(ErrorCode::kInvalidArgument, "max_q_len",
                 {"expected -1 (unknown) or an upper bound of the query lengths",
                  "got " + std::to_string(v) + " with "});
  }
  p_.max_q_len = 2;
  decode_ok();
}

// ---- block_tables and max_seq_len ----

TEST_F(ValidateTest, BlockTablesMissingInDenseMode) {
  p_.block_tables = TensorView{};
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected a tensor in dense mode", "got none"});
}

TEST_F(ValidateTest, BlockTablesRank) {
  p_.block_tables = TensorView::contiguous(block_tables_.data(), dtype::kInt32, {kB * kMaxPages});
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected rank 2 [B, max_pages] or 3 [B, 2, max_pages]", "got rank 1", "[8]"});
  p_.block_tables =
      TensorView::contiguous(block_tables_.data(), dtype::kInt32, {kB, 1, 2, kMaxPages / 2});
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected rank 2 [B, max_pages] or 3 [B, 2, max_pages]", "got rank 4"});
}

// ---- Separate K and V page tables: [B, 2, max_pages] ----

// The K table (row 0) and the V table (row 1) of each request, equal to the baseline's table.
std::vector<int32_t> kv_page_tables(const std::vector<int32_t>& table) {
  std::vector<int32_t> t;
  for (int64_t b = 0; b < kB; ++b) {
    for (int row = 0; row < 2; ++row) {
      t.insert(t.end(), table.begin() + b * kMaxPages, table.begin() + (b + 1) * kMaxPages);
    }
  }
  return t;
}

TEST_F(ValidateTest, SeparateKvPageTablesGiveTheSameResult) {
  const std::vector<uint16_t> expected = decode_ok();
  std::vector<int32_t> tables = kv_page_tables(block_tables_);
  p_.block_tables = TensorView::contiguous(tables.data(), dtype::kInt32, {kB, 2, kMaxPages});
  EXPECT_EQ(decode_ok(), expected);
  // Request 0 (seq_len 20) needs pages 0 and 1 only: the V table may differ past them.
  tables[2] = tables[3] = -1;
  tables[kMaxPages + 3] = 99;
  EXPECT_EQ(decode_ok(), expected);
  // Strides free but the last: rows padded to 6 entries, requests to 16.
  std::vector<int32_t> padded(kB * 16, -5);
  for (int64_t b = 0; b < kB; ++b) {
    for (int row = 0; row < 2; ++row) {
      std::copy_n(&block_tables_[b * kMaxPages], kMaxPages, &padded[b * 16 + row * 6]);
    }
  }
  p_.block_tables =
      TensorView::strided(padded.data(), dtype::kInt32, {kB, 2, kMaxPages}, {16, 6, 1});
  EXPECT_EQ(decode_ok(), expected);
}

TEST_F(ValidateTest, SeparateKvPageTablesNeedTwoRows) {
  std::vector<int32_t> tables(kB * 3 * kMaxPages, 0);
  p_.block_tables = TensorView::contiguous(tables.data(), dtype::kInt32, {kB, 3, kMaxPages});
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected dim 1 (the K and V page tables) = 2", "got 3", "[2, 3, 4]"});
  p_.block_tables = TensorView::strided(tables.data(), dtype::kInt32, {kB, 2, kMaxPages / 2},
                                        {2 * kMaxPages, kMaxPages, 2});
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected a contiguous last dim (stride 1)", "[8, 4, 2]"});
  p_.block_tables = TensorView::contiguous(tables.data(), dtype::kInt32, {1, 2, kMaxPages});
  expect_error(ErrorCode::kInvalidArgument, "block_tables", {"expected B = 2", "got 1"});
}

// MLA reads K and V from one row: the checked mode (always on for cpu) names the first entry of
// the V table that differs on a needed page.
TEST_F(ValidateTest, SeparateKvPageTablesMustAgreeOnNeededPages) {
  std::vector<int32_t> tables = kv_page_tables(block_tables_);
  p_.block_tables = TensorView::contiguous(tables.data(), dtype::kInt32, {kB, 2, kMaxPages});
  tables[3 * kMaxPages + 2] = 3;  // request 1 (seq_len 33) needs pages 0..2; row 0 has 5 there
  poison();
  const std::string msg = error_of([&] { mla::decode(p_); }, ErrorCode::kBadIndex);
  EXPECT_EQ(msg,
            "block_tables[1][1][2]: page id 3 differs from block_tables[1][0][2] = 5 (separate "
            "K/V page tables must name the same pages for MLA)");
  expect_untouched();
}

TEST_F(ValidateTest, BlockTablesDtype) {
  p_.block_tables.dtype = dtype::kUInt32;
  expect_error(ErrorCode::kTypeError, "block_tables", {"expected dtype int32", "got uint32"});
}

TEST_F(ValidateTest, BlockTablesBatchMismatch) {
  p_.block_tables = TensorView::contiguous(block_tables_.data(), dtype::kInt32, {1, kMaxPages});
  expect_error(ErrorCode::kInvalidArgument, "block_tables", {"expected B = 2", "got 1"});
}

TEST_F(ValidateTest, BlockTablesMustBeContiguous) {
  p_.block_tables =
      TensorView::strided(block_tables_.data(), dtype::kInt32, {kB, kMaxPages / 2}, {4, 2});
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected a contiguous last dim (stride 1)", "[4, 2]"});
}

TEST_F(ValidateTest, BlockTablesRowStrideIsFree) {
  std::vector<int32_t> padded = {0, 1, 2, 3, -9, -9, 7, 6, 5, 4, -9, -9};
  const std::vector<uint16_t> expected = decode_ok();
  p_.block_tables =
      TensorView::strided(padded.data(), dtype::kInt32, {kB, kMaxPages}, {kMaxPages + 2, 1});
  EXPECT_EQ(decode_ok(), expected);
}

TEST_F(ValidateTest, MaxSeqLenBeyondCapacity) {
  p_.max_seq_len = static_cast<int32_t>(kMaxPages * kPageSize + 1);
  expect_error(ErrorCode::kInvalidArgument, "max_seq_len",
               {"[0, max_pages * page_size = 64]", "got 65"});
  p_.max_seq_len = static_cast<int32_t>(kMaxPages * kPageSize);
  decode_ok();
}

TEST_F(ValidateTest, MaxSeqLenBelowMinusOne) {
  p_.max_seq_len = -2;
  expect_error(ErrorCode::kInvalidArgument, "max_seq_len", {"expected -1 (unknown)", "got -2"});
  make_sparse();
  p_.max_seq_len = -5;
  expect_error(ErrorCode::kInvalidArgument, "max_seq_len",
               {"expected -1 (unknown) or a non-negative bound", "got -5"});
}

// Block tables without pages ([B, 0], no memory, any row stride) with empty requests are valid:
// nothing is read from them. Found by scripts/fuzz_validate.sh: the cpu backend's index check
// formed row pointers from the null data pointer and the stride (undefined behavior that
// UBSan reports in the fuzzing build, harmless here).
TEST_F(ValidateTest, BlockTablesWithoutPagesOrMemory) {
  seq_lens_ = {0, 0};
  p_.block_tables = TensorView::strided(nullptr, dtype::kInt32, {kB, 0},
                                        {std::numeric_limits<int32_t>::max(), 1});
  decode_ok();
  for (float v : lse_) EXPECT_EQ(v, -kInf);
}

// ---- Sizes that overflow int32 index math (fake shapes: validation fails before any access) ----

TEST_F(ValidateTest, KvCacheSlotsOverflowInt32) {
  p_.kv_cache = TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPow2_27, kPageSize, kD});
  expect_error(
      ErrorCode::kInvalidArgument, "kv_cache",
      {"expected at most 2^31 - 1 token slots (P * page_size)", "got 134217728 * 16 = 2147483648"});
  // The largest pool that fits is accepted (workspace_size reads no data).
  p_.kv_cache.shape[0] = kPow2_27 - 1;
  EXPECT_NO_THROW(mla::workspace_size(p_));
}

TEST_F(ValidateTest, QueryRowsOverflowInt32) {
  p_.query = TensorView::contiguous(query_.data(), dtype::kBFloat16, {kB, kQ, kPow2_29, kD});
  p_.out = TensorView::contiguous(out_.data(), dtype::kBFloat16, {kB, kQ, kPow2_29, kL});
  p_.lse = TensorView::contiguous(lse_.data(), dtype::kFloat32, {kB, kQ, kPow2_29});
  expect_error(
      ErrorCode::kInvalidArgument, "query",
      {"expected at most 2^31 - 1 query rows (tokens * H)", "got 4 * 536870912 = 2147483648"});
  p_.query.shape[2] = p_.out.shape[2] = p_.lse.shape[2] = kPow2_29 - 1;
  EXPECT_NO_THROW(mla::workspace_size(p_));
}

// Ragged: B + 1 (the length of cum_seq_lens_q) must not overflow (found by
// scripts/fuzz_validate.sh: seq_lens of shape [INT64_MAX] made B + 1 a signed overflow).
TEST_F(ValidateTest, RaggedBatchOverflowsInt32) {
  make_ragged();
  p_.seq_lens.shape[0] = std::numeric_limits<int64_t>::max();
  expect_error(ErrorCode::kInvalidArgument, "seq_lens",
               {"expected at most 2^31 - 2 requests (B) with cum_seq_lens_q",
                "got B = 9223372036854775807"});
  p_.seq_lens.shape[0] = std::numeric_limits<int32_t>::max();
  expect_error(ErrorCode::kInvalidArgument, "seq_lens", {"got B = 2147483647"});
  p_.seq_lens.shape[0] = std::numeric_limits<int32_t>::max() - 1;  // fits; then cum_seq_lens_q
  expect_error(ErrorCode::kInvalidArgument, "cum_seq_lens_q",
               {"expected length B + 1 (B from seq_lens) = 2147483647"});
}

TEST_F(ValidateTest, BlockTablesCapacityOverflowsInt32) {
  p_.block_tables = TensorView::contiguous(block_tables_.data(), dtype::kInt32, {kB, kPow2_27});
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected max_pages * page_size to fit int32", "got 134217728 * 16 = 2147483648"});
  p_.block_tables.shape[1] = kPow2_27 - 1;
  EXPECT_NO_THROW(mla::workspace_size(p_));
}

// A view of a huge fake shape: stride 1 on the last dim, 0 elsewhere, so that building it
// multiplies nothing (TensorView::contiguous would overflow computing strides).
TensorView huge_view(void* data, mla::DataType type, std::initializer_list<int64_t> shape) {
  TensorView t = TensorView::strided(data, type, {1}, {1});
  t.ndim = static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
  for (d = 0; d < t.ndim; ++d) t.strides[d] = d + 1 == t.ndim ? 1 : 0;
  return t;
}

// Products of huge sizes must not wrap around int64 and slip past the int32 checks.
// DISABLED until validate.cc multiplies sizes without wrapping: today P * page_size = 2^64 wraps
// to 0 and the call is accepted (likewise the other three cases). Only workspace_size() is
// called, since a wrongly accepted call would read the fake buffers.
TEST_F(ValidateTest, HugeShapesDoNotWrapAround) {
  const int64_t k2_32 = int64_t{1} << 32, k2_60 = int64_t{1} << 60, k2_62 = int64_t{1} << 62;
  auto expect_rejected = [&](const std::string& arg, const std::string& fragment) {
    expect_message(error_of([&] { mla::workspace_size(p_); }, ErrorCode::kInvalidArgument), arg,
                   {fragment});
  };
  // P * page_size = 2^64.
  p_.kv_cache = huge_view(kv_.data(), dtype::kBFloat16, {k2_60, kPageSize, kD});
  expect_rejected("kv_cache", "2^31 - 1 token slots");
  // max_pages * page_size = 2^64.
  make_dense();
  p_.block_tables = huge_view(block_tables_.data(), dtype::kInt32, {kB, k2_60});
  expect_rejected("block_tables", "to fit int32");
  // tokens * H = 4 * 2^62 = 2^64.
  make_dense();
  p_.query = huge_view(query_.data(), dtype::kBFloat16, {kB, kQ, k2_62, kD});
  p_.out = huge_view(out_.data(), dtype::kBFloat16, {kB, kQ, k2_62, kL});
  p_.lse = huge_view(lse_.data(), dtype::kFloat32, {kB, kQ, k2_62});
  expect_rejected("query", "2^31 - 1 query rows");
  // tokens = B * q_len = 2^32 * 2^32 = 2^64.
  make_dense();
  p_.query = huge_view(query_.data(), dtype::kBFloat16, {k2_32, k2_32, 1, kD});
  p_.out = huge_view(out_.data(), dtype::kBFloat16, {k2_32, k2_32, 1, kL});
  p_.lse = huge_view(lse_.data(), dtype::kFloat32, {k2_32, k2_32, 1});
  p_.seq_lens = huge_view(seq_lens_.data(), dtype::kInt32, {k2_32});
  p_.block_tables = huge_view(block_tables_.data(), dtype::kInt32, {k2_32, kMaxPages});
  expect_rejected("query", "2^31 - 1 query rows");
  // numel = 7 * 7905747460161236407 = 1 (mod 2^64): not "exactly 1 element".
  make_dense();
  p_.bmm1_scale_tensor = huge_view(lse_.data(), dtype::kFloat32, {7, int64_t{0x6db6db6db6db6db7}});
  expect_rejected("bmm1_scale (tensor)", "expected exactly 1 element");
}

// ---- Sparse mode ----

TEST_F(ValidateTest, SparseTopKNegative) {
  p_.sparse_top_k = -1;
  expect_error(ErrorCode::kInvalidArgument, "sparse_top_k",
               {"expected 0 (dense) or a positive top-k", "got -1"});
}

TEST_F(ValidateTest, SparseIndicesMissing) {
  make_sparse();
  p_.sparse_indices = TensorView{};
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected a tensor when sparse_top_k is 8", "got none"});
}

TEST_F(ValidateTest, SparseIndicesDtype) {
  make_sparse();
  p_.sparse_indices.dtype = dtype::kUInt32;
  expect_error(ErrorCode::kTypeError, "sparse_indices", {"expected dtype int32", "got uint32"});
}

TEST_F(ValidateTest, SparseIndicesRank) {
  make_sparse();
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kB * kQ, kTopK});
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected rank 3 [B, q_len, top_k]", "got rank 2"});
}

TEST_F(ValidateTest, SparseIndicesLastDimIsTopK) {
  make_sparse();
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kB, kQ, kTopK / 2});
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected last dim sparse_top_k = 8", "got 4"});
}

TEST_F(ValidateTest, SparseIndicesBatchAndQLen) {
  make_sparse();
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kB * kQ, 1, kTopK});
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected B (query dim 0) = 2", "got 4"});
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kB, 1, kTopK});
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected q_len (query dim 1) = 2", "got 1"});
}

TEST_F(ValidateTest, SparseIndicesRagged) {
  make_ragged();
  sparse_.assign(kT * kTopK, 5);
  p_.sparse_top_k = static_cast<int32_t>(kTopK);
  p_.block_tables = TensorView{};
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kT, kTopK});
  refresh_workspace();
  decode_ok();
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {1, kT, kTopK});
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected rank 2 [T, top_k]", "got rank 3"});
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kT - 1, kTopK});
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected T (query dim 0) = 3", "got 2"});
}

TEST_F(ValidateTest, SparseIndicesMustBeContiguous) {
  make_sparse();
  p_.sparse_indices = TensorView::strided(sparse_.data(), dtype::kInt32, {kB, kQ, kTopK},
                                          {kQ * kTopK, kTopK, 2});  // a fake view, never read
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected a contiguous last dim (stride 1)", "[16, 8, 2]"});
}

TEST_F(ValidateTest, BlockTablesInSparseMode) {
  make_sparse();
  p_.block_tables = TensorView::contiguous(block_tables_.data(), dtype::kInt32, {kB, kMaxPages});
  expect_error(ErrorCode::kInvalidArgument, "block_tables",
               {"expected none in sparse mode (sparse_top_k 8)", "got shape [2, 4]"});
}

TEST_F(ValidateTest, MaskInSparseMode) {
  make_sparse();
  add_mask();
  expect_error(ErrorCode::kInvalidArgument, "mask",
               {"expected none in sparse mode (sparse_top_k 8)", "got a mask"});
}

TEST_F(ValidateTest, SparseIndicesInDenseMode) {
  sparse_.assign(kB * kQ * kTopK, 0);
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kB, kQ, kTopK});
  expect_error(ErrorCode::kInvalidArgument, "sparse_indices",
               {"expected none in dense mode (sparse_top_k 0)", "got shape [2, 2, 8]"});
}

TEST_F(ValidateTest, SparseTopkLensInDenseMode) {
  add_topk_lens();
  expect_error(ErrorCode::kInvalidArgument, "sparse_topk_lens",
               {"expected none in dense mode (sparse_top_k 0)", "got shape [2]"});
}

TEST_F(ValidateTest, SparseTopkLensShapes) {
  make_sparse();
  add_topk_lens();
  p_.sparse_topk_lens.shape[0] = kB + 1;
  expect_error(ErrorCode::kInvalidArgument, "sparse_topk_lens",
               {"expected B (per request) = 2", "got 3"});
  p_.sparse_topk_lens = TensorView::contiguous(topk_lens_.data(), dtype::kInt32, {kB, kQ + 1});
  expect_error(ErrorCode::kInvalidArgument, "sparse_topk_lens",
               {"expected q_len (query dim 1) = 2", "got 3"});
  p_.sparse_topk_lens = TensorView::contiguous(topk_lens_.data(), dtype::kInt32, {1, kB});
  expect_error(ErrorCode::kInvalidArgument, "sparse_topk_lens",
               {"expected B (query dim 0) = 2", "got 1"});
  p_.sparse_topk_lens = TensorView::contiguous(topk_lens_.data(), dtype::kInt32, {1, 1, kB});
  expect_error(ErrorCode::kInvalidArgument, "sparse_topk_lens",
               {"expected rank 2 [B, q_len] (per token) or [B] (per request)", "got rank 3"});
}

TEST_F(ValidateTest, SparseTopkLensDtype) {
  make_sparse();
  add_topk_lens();
  p_.sparse_topk_lens.dtype = kInt64;
  expect_error(ErrorCode::kTypeError, "sparse_topk_lens", {"expected dtype int32", "got int64"});
}

TEST_F(ValidateTest, SparseTopkLensPerTokenAndRagged) {
  make_sparse();
  add_topk_lens();
  p_.sparse_topk_lens = TensorView::contiguous(topk_lens_.data(), dtype::kInt32, {kB, kQ});
  decode_ok();

  make_ragged();
  sparse_.assign(kT * kTopK, 3);
  p_.sparse_top_k = static_cast<int32_t>(kTopK);
  p_.block_tables = TensorView{};
  p_.sparse_indices = TensorView::contiguous(sparse_.data(), dtype::kInt32, {kT, kTopK});
  topk_lens_ = {1, 8, 0};
  p_.sparse_topk_lens = TensorView::contiguous(topk_lens_.data(), dtype::kInt32, {kT});
  refresh_workspace();
  decode_ok();
  p_.sparse_topk_lens.shape[0] = kB;
  expect_error(ErrorCode::kInvalidArgument, "sparse_topk_lens",
               {"expected T (query dim 0) = 3", "got 2"});
  p_.sparse_topk_lens = TensorView::contiguous(topk_lens_.data(), dtype::kInt32, {kT, 1});
  expect_error(ErrorCode::kInvalidArgument, "sparse_topk_lens",
               {"expected rank 1 [T] (per query token, cum_seq_lens_q given)", "got rank 2"});
}

// ---- mask ----

TEST_F(ValidateTest, MaskDtype) {
  add_mask();
  p_.mask.dtype = dtype::kInt32;
  expect_error(ErrorCode::kTypeError, "mask",
               {"expected dtype uint32 (or uint16 with twice the words)", "got int32"});
}

TEST_F(ValidateTest, MaskRank) {
  add_mask();
  p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt32, {kB * kQ, 1});
  expect_error(ErrorCode::kInvalidArgument, "mask",
               {"expected rank 3 [B, q_len, W]", "got rank 2"});
  make_ragged();
  add_mask();
  p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt32, {1, kT, 1});
  expect_error(ErrorCode::kInvalidArgument, "mask", {"expected rank 2 [T, W]", "got rank 3"});
}

TEST_F(ValidateTest, MaskTooFewWords) {
  add_mask();
  p_.mask.shape[2] = 0;
  expect_error(ErrorCode::kInvalidArgument, "mask",
               {"expected at least 1 uint32 words per row for query length 2", "got 0"});
  p_.mask.dtype = dtype::kUInt16;
  expect_error(ErrorCode::kInvalidArgument, "mask",
               {"expected at least 2 uint16 words per row for query length 2", "got 0"});
}

TEST_F(ValidateTest, MaskTooFewWordsForRaggedHint) {
  make_ragged();
  add_mask();
  p_.max_q_len = 40;  // needs ceil(40 / 32) = 2 words
  expect_error(ErrorCode::kInvalidArgument, "mask",
               {"expected at least 2 uint32 words per row for query length 40", "got 1"});
}

TEST_F(ValidateTest, MaskOddUint16Count) {
  add_mask();
  p_.mask.dtype = dtype::kUInt16;
  p_.mask.shape[2] = 3;
  p_.mask.strides[0] = 6;
  p_.mask.strides[1] = 3;
  expect_error(ErrorCode::kInvalidArgument, "mask",
               {"expected an even number of uint16 words per row (2W)", "got 3"});
}

TEST_F(ValidateTest, MaskShapeMismatch) {
  add_mask();
  p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt32, {1, kQ, 1});
  expect_error(ErrorCode::kInvalidArgument, "mask", {"expected B (query dim 0) = 2", "got 1"});
  p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt32, {kB, 1, 1});
  expect_error(ErrorCode::kInvalidArgument, "mask", {"expected q_len (query dim 1) = 2", "got 1"});
  make_ragged();
  add_mask();
  p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt32, {kT - 1, 1});
  expect_error(ErrorCode::kInvalidArgument, "mask", {"expected T (query dim 0) = 3", "got 2"});
}

TEST_F(ValidateTest, MaskMustBeContiguous) {
  add_mask();
  std::vector<uint32_t> words(kB * kQ * 4, 0xffffffffu);
  p_.mask = TensorView::strided(words.data(), dtype::kUInt32, {kB, kQ, 2}, {kQ * 4, 4, 2});
  expect_error(ErrorCode::kInvalidArgument, "mask",
               {"expected a contiguous last dim (stride 1)", "[8, 4, 2]"});
}

// The same bytes viewed as uint16 with twice the words (FlashInfer's layout) give the same result.
TEST_F(ValidateTest, Uint16MaskWithTwiceTheWordsIsAccepted) {
  add_mask();
  refresh_workspace();
  const std::vector<uint16_t> expected = decode_ok();
  p_.mask = TensorView::contiguous(mask_.data(), dtype::kUInt16, {kB, kQ, 2});
  EXPECT_EQ(decode_ok(), expected);
}

// ---- out ----

TEST_F(ValidateTest, OutMissing) {
  p_.out = TensorView{};
  expect_error(ErrorCode::kInvalidArgument, "out", {"expected a tensor", "got none"});
}

TEST_F(ValidateTest, OutRank) {
  p_.out = TensorView::contiguous(out_.data(), dtype::kBFloat16, {kB * kQ, kH, kL});
  expect_error(ErrorCode::kInvalidArgument, "out",
               {"expected rank 4 like query", "got rank 3", "[4, 4, 32]"});
}

TEST_F(ValidateTest, OutDimsLikeQuery) {
  for (int d = 0; d < 3; ++d) {
    make_dense();
    p_.out.shape[d] -= 1;
    expect_error(
        ErrorCode::kInvalidArgument, "out",
        {"expected dim " + std::to_string(d) + " like query = " + std::to_string(p_.query.shape[d]),
         "got " + std::to_string(p_.query.shape[d] - 1)});
  }
}

TEST_F(ValidateTest, OutLastDimIsKvLoraRank) {
  p_.out = TensorView::contiguous(out_.data(), dtype::kBFloat16, {kB, kQ, kH, 2 * kL});
  expect_error(ErrorCode::kInvalidArgument, "out",
               {"expected last dim kv_lora_rank = 32", "got 64"});
}

TEST_F(ValidateTest, OutDtype) {
  p_.out.dtype = dtype::kFloat32;
  expect_error(ErrorCode::kTypeError, "out", {"expected dtype bfloat16 or float16", "got float32"});
  p_.out.dtype = dtype::kFloat8E4M3;
  expect_error(ErrorCode::kTypeError, "out",
               {"expected dtype bfloat16 or float16", "got float8_e4m3fn"});
}

TEST_F(ValidateTest, OutMustBeContiguous) {
  p_.out = TensorView::strided(out_.data(), dtype::kBFloat16, {kB, kQ, kH, kL},
                               {kQ * kH * kL, kH * kL, kL, 2});
  expect_error(ErrorCode::kInvalidArgument, "out",
               {"expected a contiguous last dim (stride 1)", "[256, 128, 32, 2]"});
}

// Each element of out and lse is written once: no zero stride on a dim of size > 1.
TEST_F(ValidateTest, OutAndLseNeedNonZeroStrides) {
  p_.out.strides[1] = 0;
  expect_error(ErrorCode::kInvalidArgument, "out",
               {"expected a non-zero stride on every dim of size > 1 (each element written once)",
                "got strides [256, 0, 32, 1] for shape [2, 2, 4, 32]"});
  make_dense();
  p_.lse.strides[2] = 0;
  expect_error(ErrorCode::kInvalidArgument, "lse",
               {"expected a non-zero stride on every dim of size > 1",
                "got strides [8, 4, 0] for shape [2, 2, 4]"});
  make_ragged();
  p_.out = TensorView::strided(out_.data(), dtype::kBFloat16, {kT, kH, kL}, {0, kL, 1});
  expect_error(ErrorCode::kInvalidArgument, "out", {"got strides [0, 32, 1]"});
  // A dim of size 1 may have any stride, and an empty tensor is written nowhere.
  make_dense();
  for (TensorView* t : {&p_.query, &p_.out, &p_.lse}) t->shape[1] = 1;
  p_.out.strides[1] = 0;
  p_.lse.strides[1] = 0;
  refresh_workspace();
  EXPECT_NO_THROW(mla::decode(p_));
  for (TensorView* t : {&p_.query, &p_.out, &p_.lse}) t->shape[1] = 0;
  p_.out.strides[0] = p_.lse.strides[0] = 0;
  refresh_workspace();
  EXPECT_NO_THROW(mla::decode(p_));
}

TEST_F(ValidateTest, OutFp16WithBf16QueryIsAccepted) {
  p_.out.dtype = dtype::kFloat16;
  decode_ok();
}

// ---- lse ----

TEST_F(ValidateTest, LseDtype) {
  p_.lse.dtype = dtype::kBFloat16;
  expect_error(ErrorCode::kTypeError, "lse", {"expected dtype float32", "got bfloat16"});
}

TEST_F(ValidateTest, LseRank) {
  p_.lse = TensorView::contiguous(lse_.data(), dtype::kFloat32, {kB, kQ, kH, 1});
  expect_error(ErrorCode::kInvalidArgument, "lse", {"expected rank 3 [B, q_len, H]", "got rank 4"});
  make_ragged();
  p_.lse = TensorView::contiguous(lse_.data(), dtype::kFloat32, {kT * kH});
  expect_error(ErrorCode::kInvalidArgument, "lse", {"expected rank 2 [T, H]", "got rank 1"});
}

TEST_F(ValidateTest, LseDimsLikeQuery) {
  p_.lse = TensorView::contiguous(lse_.data(), dtype::kFloat32, {kB, kQ, kH - 1});
  expect_error(ErrorCode::kInvalidArgument, "lse", {"expected dim 2 like query = 4", "got 3"});
  p_.lse = TensorView::contiguous(lse_.data(), dtype::kFloat32, {kB, kQ * 2, kH / 2});
  expect_error(ErrorCode::kInvalidArgument, "lse", {"expected dim 1 like query = 2", "got 4"});
}

// ---- sinks ----

TEST_F(ValidateTest, SinksDtype) {
  add_sinks();
  p_.sinks.dtype = dtype::kInt32;
  expect_error(ErrorCode::kTypeError, "sinks",
               {"expected dtype float32, bfloat16 or float16", "got int32"});
  p_.sinks.dtype = dtype::kFloat8E4M3;
  expect_error(ErrorCode::kTypeError, "sinks",
               {"expected dtype float32, bfloat16 or float16", "got float8_e4m3fn"});
}

// Sinks in bf16 or fp16 are converted: values exact in both give the fp32 result.
TEST_F(ValidateTest, SixteenBitSinksAreAccepted) {
  add_sinks();
  refresh_workspace();
  const std::vector<uint16_t> expected = decode_ok();
  std::vector<uint16_t> sinks_bf16, sinks_fp16 = {0x3800, 0xbc00, 0x0000, 0x4000};  // fp16 bits
  for (float v : sinks_) sinks_bf16.push_back(bf16(v));
  p_.sinks = TensorView::contiguous(sinks_bf16.data(), dtype::kBFloat16, {kH});
  EXPECT_EQ(decode_ok(), expected);
  p_.sinks = TensorView::contiguous(sinks_fp16.data(), dtype::kFloat16, {kH});
  EXPECT_EQ(decode_ok(), expected);
}

TEST_F(ValidateTest, SinksRank) {
  add_sinks();
  p_.sinks = TensorView::contiguous(sinks_.data(), dtype::kFloat32, {1, kH});
  expect_error(ErrorCode::kInvalidArgument, "sinks", {"expected rank 1 [H]", "got rank 2"});
}

TEST_F(ValidateTest, SinksLengthIsH) {
  add_sinks();
  p_.sinks.shape[0] = kH - 1;
  expect_error(ErrorCode::kInvalidArgument, "sinks", {"expected H (query heads) = 4", "got 3"});
}

TEST_F(ValidateTest, SinksMustBeContiguous) {
  add_sinks();
  p_.sinks = TensorView::strided(sinks_.data(), dtype::kFloat32, {kH}, {2});
  expect_error(ErrorCode::kInvalidArgument, "sinks",
               {"expected a contiguous last dim (stride 1)", "[2]"});
}

// ---- bmm1/bmm2 scales and skip-softmax ----

TEST_F(ValidateTest, ScaleTensorDtype) {
  add_scale_tensors();
  p_.bmm1_scale_tensor.dtype = dtype::kBFloat16;
  expect_error(ErrorCode::kTypeError, "bmm1_scale (tensor)",
               {"expected dtype float32", "got bfloat16"});
  add_scale_tensors();
  p_.bmm2_scale_tensor.dtype = dtype::kInt32;
  expect_error(ErrorCode::kTypeError, "bmm2_scale (tensor)",
               {"expected dtype float32", "got int32"});
}

TEST_F(ValidateTest, ScaleTensorHasOneElement) {
  std::vector<float> two = {1.0f, 2.0f};
  p_.bmm1_scale_tensor = TensorView::contiguous(two.data(), dtype::kFloat32, {2});
  expect_error(ErrorCode::kInvalidArgument, "bmm1_scale (tensor)",
               {"expected exactly 1 element", "got shape [2]"});
  p_.bmm1_scale_tensor = TensorView{};
  p_.bmm2_scale_tensor = TensorView::contiguous(two.data(), dtype::kFloat32, {1, 2});
  expect_error(ErrorCode::kInvalidArgument, "bmm2_scale (tensor)",
               {"expected exactly 1 element", "got shape [1, 2]"});
}

TEST_F(ValidateTest, ScaleTensorOnAnotherDevice) {
  add_scale_tensors();
  p_.bmm2_scale_tensor.device = kCuda0;
  expect_error(ErrorCode::kDeviceError, "bmm2_scale (tensor)",
               {"expected device cpu (the query's)", "got cuda:0"});
}

TEST_F(ValidateTest, ScaleTensorsGiveTheSameResultAsFloats) {
  p_.bmm1_scale = 0.25f;
  p_.bmm2_scale = 2.0f;
  const std::vector<uint16_t> expected = decode_ok();
  add_scale_tensors();
  p_.bmm1_scale = 1.0f;  // replaced by the tensors
  p_.bmm2_scale = 1.0f;
  EXPECT_EQ(decode_ok(), expected);
}

// A NaN or inf scale is accepted and propagates (docs/contract.md section 1): every row of the
// baseline has keys, so every out and lse element is NaN.
TEST_F(ValidateTest, NonFiniteScaleFloatsAreAcceptedAndPropagate) {
  for (float v : {kNaN, kInf, -kInf}) {
    for (float* scale : {&p_.bmm1_scale, &p_.bmm2_scale}) {
      make_dense();
      *scale = v;
      std::fill(out_.begin(), out_.end(), bf16(1.0f));  // NaN must be written, not left
      std::fill(lse_.begin(), lse_.end(), 1.0f);
      EXPECT_NO_THROW(mla::decode(p_)) << v;
      size_t finite = 0;
      for (uint16_t x : out_) finite += (x & 0x7fff) <= 0x7f80;
      for (float x : lse_) finite += !std::isnan(x);
      EXPECT_EQ(finite, 0u) << "scale " << v;
    }
  }
}

TEST_F(ValidateTest, SkipSoftmaxFactor) {
  for (float v : {-1.0f, kNaN, kInf}) {
    std::ostringstream got;
    got << "got " << v;
    p_.skip_softmax_threshold_scale_factor = v;
    expect_error(ErrorCode::kInvalidArgument, "skip_softmax_threshold_scale_factor",
                 {"expected 0 (off) or a finite positive factor", got.str()});
  }
  p_.skip_softmax_threshold_scale_factor = 1e-30f;
  decode_ok();
}

// ---- workspace ----

TEST_F(ValidateTest, WorkspaceTooSmall) {
  const size_t required = mla::workspace_size(p_);
  ASSERT_GT(required, 0u);
  p_.workspace.shape[0] = static_cast<int64_t>(required) - 1;
  expect_error(ErrorCode::kWorkspaceTooSmall, "workspace",
               {"expected at least " + std::to_string(required) + " bytes",
                "got " + std::to_string(required - 1)});
}

TEST_F(ValidateTest, WorkspaceNegativeSize) {
  p_.workspace.shape[0] = -8;
  expect_error(ErrorCode::kInvalidArgument, "workspace",
               {"expected non-negative sizes", "got shape [-8]"});
}

TEST_F(ValidateTest, WorkspaceAbsentWhenNeeded) {
  const size_t required = mla::workspace_size(p_);
  ASSERT_GT(required, 0u);
  p_.workspace = TensorView{};
  expect_error(
      ErrorCode::kWorkspaceTooSmall, "workspace",
      {"expected a uint8 tensor of at least " + std::to_string(required) + " bytes", "got none"});
}

TEST_F(ValidateTest, WorkspaceDtype) {
  p_.workspace.dtype = dtype::kInt32;
  expect_error(ErrorCode::kTypeError, "workspace", {"expected dtype uint8", "got int32"});
}

TEST_F(ValidateTest, WorkspaceDevice) {
  p_.workspace.device = kCuda0;
  expect_error(ErrorCode::kDeviceError, "workspace",
               {"expected device cpu (the query's)", "got cuda:0"});
}

TEST_F(ValidateTest, WorkspaceRank) {
  p_.workspace =
      TensorView::contiguous(ws_.data(), dtype::kUInt8, {1, static_cast<int64_t>(ws_.size())});
  expect_error(ErrorCode::kInvalidArgument, "workspace", {"expected rank 1 [bytes]", "got rank 2"});
}

TEST_F(ValidateTest, WorkspaceMustBeContiguous) {
  p_.workspace.strides[0] = 2;
  expect_error(ErrorCode::kInvalidArgument, "workspace",
               {"expected a contiguous buffer (stride 1)", "got stride 2"});
}

TEST_F(ValidateTest, WorkspaceNullData) {
  p_.workspace.data = nullptr;
  expect_error(ErrorCode::kInvalidArgument, "workspace", {"expected a data pointer", "got null"});
}

TEST_F(ValidateTest, WorkspaceLargerThanNeededIsFine) {
  const std::vector<uint16_t> expected = decode_ok();
  std::vector<uint8_t> big(ws_.size() + 4096, 0xab);
  p_.workspace =
      TensorView::contiguous(big.data(), dtype::kUInt8, {static_cast<int64_t>(big.size())});
  EXPECT_EQ(decode_ok(), expected);
}

// ---- plan / run ----

TEST_F(ValidateTest, PlanThenRunEqualsDecode) {
  const std::vector<uint16_t> expected = decode_ok();
  const mla::Plan plan = mla::plan(p_);
  EXPECT_TRUE(plan.planned);
  EXPECT_EQ(plan.backend, Backend::kCpu);
  EXPECT_EQ(plan.batch, kB);
  EXPECT_EQ(plan.num_heads, kH);
  EXPECT_EQ(plan.workspace_bytes, static_cast<int64_t>(mla::workspace_size(p_)));
  for (int layer = 0; layer < 2; ++layer) {  // one plan serves every layer of a step
    poison();
    EXPECT_NO_THROW(mla::run(plan, p_));
    expect_written();
    EXPECT_EQ(out_, expected);
  }
}

TEST_F(ValidateTest, RunWithAnEmptyPlan) {
  expect_run_error(mla::Plan{}, ErrorCode::kInvalidArgument, "plan",
                   {"expected a plan made by mla::plan()", "got an empty Plan"});
}

TEST_F(ValidateTest, RunWithAPlanForAnotherBatch) {
  const mla::Plan plan = mla::plan(p_);
  for (TensorView* t : {&p_.query, &p_.seq_lens, &p_.block_tables, &p_.out, &p_.lse}) {
    t->shape[0] = 1;
  }
  expect_run_error(plan, ErrorCode::kInvalidArgument, "plan",
                   {"made for batch 2", "got batch 1", "call mla::plan() again"});
}

TEST_F(ValidateTest, RunWithAPlanForOtherHeads) {
  const mla::Plan plan = mla::plan(p_);
  for (TensorView* t : {&p_.query, &p_.out, &p_.lse}) t->shape[2] = kH / 2;  // strided views
  expect_run_error(plan, ErrorCode::kInvalidArgument, "plan", {"made for heads 4", "got heads 2"});
}

TEST_F(ValidateTest, RunWithAPlanForAnotherQLen) {
  const mla::Plan plan = mla::plan(p_);
  for (TensorView* t : {&p_.query, &p_.out, &p_.lse}) t->shape[1] = 1;
  expect_run_error(plan, ErrorCode::kInvalidArgument, "plan",
                   {"made for query tokens 4", "got query tokens 2"});
}

TEST_F(ValidateTest, RunWithAPlanForAnotherDevice) {
  set_device(mla::Device{static_cast<int32_t>(mla::DeviceType::kCUDAHost), 0});
  const mla::Plan plan = mla::plan(p_);
  set_device(mla::kCPU);
  expect_run_error(plan, ErrorCode::kInvalidArgument, "plan",
                   {"made for backend cpu on cuda_host", "got cpu on cpu"});
}

TEST_F(ValidateTest, RunChecksTheWorkspaceToo) {
  const mla::Plan plan = mla::plan(p_);
  p_.workspace.shape[0] = 1;
  expect_run_error(plan, ErrorCode::kWorkspaceTooSmall, "workspace",
                   {"expected at least " + std::to_string(ws_.size()) + " bytes", "got 1"});
}

TEST_F(ValidateTest, RunValidatesEveryArgument) {
  const mla::Plan plan = mla::plan(p_);
  p_.out.dtype = dtype::kFloat32;
  expect_run_error(plan, ErrorCode::kTypeError, "out", {"got float32"});
}

// ---- Valid edge cases ----

TEST_F(ValidateTest, EmptyDenseBatchIsANoOp) {
  for (TensorView* t : {&p_.query, &p_.seq_lens, &p_.block_tables, &p_.out, &p_.lse}) {
    t->shape[0] = 0;
  }
  refresh_workspace();
  poison();
  EXPECT_NO_THROW(mla::decode(p_));
  expect_untouched();
}

TEST_F(ValidateTest, RaggedWithoutQueryTokensIsANoOp) {
  make_ragged();
  cum_ = {0, 0, 0};
  p_.cum_seq_lens_q.data = cum_.data();
  for (TensorView* t : {&p_.query, &p_.out, &p_.lse}) t->shape[0] = 0;
  refresh_workspace();
  poison();
  EXPECT_NO_THROW(mla::decode(p_));
  expect_untouched();

  // The hint max_q_len = 0 is the true bound when there are no query tokens.
  p_.max_q_len = 0;
  refresh_workspace();
  EXPECT_NO_THROW(mla::decode(p_));
  expect_untouched();
  p_.max_q_len = -1;

  // B = 0 and T = 0 together.
  for (TensorView* t : {&p_.seq_lens, &p_.block_tables}) t->shape[0] = 0;
  p_.cum_seq_lens_q.shape[0] = 1;
  refresh_workspace();
  EXPECT_NO_THROW(mla::decode(p_));
  expect_untouched();
}

TEST_F(ValidateTest, KvCache4DLayoutIsAccepted) {
  const std::vector<uint16_t> expected = decode_ok();
  p_.kv_cache = TensorView::contiguous(kv_.data(), dtype::kBFloat16, {kPages, 1, kPageSize, kD});
  refresh_workspace();
  EXPECT_EQ(decode_ok(), expected);
}

// ---- out and lse apart from the inputs, the workspace and each other (docs/contract.md section 3)
// ----

class OverlapTest : public ValidateTest {
 protected:
  // Moves `input` into a copy at the start of arena_ and points `output` at the copy's last 4
  // bytes, so that they overlap while every value stays valid; the arena has room for all of
  // `output` past the copy (a call that were wrongly accepted writes inside it).
  void overlap(TensorView& output, TensorView& input) {
    const size_t in_bytes = static_cast<size_t>(input.numel()) * (input.dtype.bits / 8);
    const size_t out_bytes = static_cast<size_t>(output.numel()) * (output.dtype.bits / 8);
    ASSERT_GE(in_bytes, 4u);
    ASSERT_EQ(in_bytes % 4, 0u);
    arena_.assign(in_bytes + out_bytes, 0);
    std::memcpy(arena_.data(), input.data, in_bytes);
    input.data = arena_.data();
    output.data = arena_.data() + in_bytes - 4;
    input_copy_.assign(arena_.begin(), arena_.begin() + static_cast<int64_t>(in_bytes));
  }

  // decode() and run() refuse the call naming both arguments; workspace_size() and plan(), which
  // read only shapes, accept it; the input's bytes are untouched.
  void expect_overlap_error(const std::string& output, const std::string& input) {
    const std::string msg = error_of([&] { mla::decode(p_); }, ErrorCode::kInvalidArgument);
    expect_message(msg, output,
                   {output + ": overlaps " + input + " (bytes [0x", ") and [0x",
                    "expected out and lse apart from every input, the workspace "
                    "and each other"});
    EXPECT_NO_THROW(mla::workspace_size(p_));
    mla::Plan plan;
    EXPECT_NO_THROW(plan = mla::plan(p_));
    EXPECT_EQ(error_of([&] { mla::run(plan, p_); }, ErrorCode::kInvalidArgument), msg);
    EXPECT_TRUE(std::equal(input_copy_.begin(), input_copy_.end(), arena_.begin()))
        << "the input was written";
  }

  std::vector<uint8_t> arena_, input_copy_;
};

TEST_F(OverlapTest, OutMustNotOverlapAnInputOrTheWorkspace) {
  for (auto& [baseline_name, make] : baselines()) {
    std::vector<TensorArg> inputs = all_tensor_args();
    inputs.push_back({"query", &DecodeParams::query});
    inputs.push_back({"workspace", &DecodeParams::workspace});
    for (const TensorArg& arg : inputs) {
      const std::string name = arg.name;
      if (name == "out" || name == "lse") continue;
      make();
      TensorView& input = p_.*arg.member;
      if (!input.defined()) continue;
      SCOPED_TRACE(std::string(baseline_name) + " baseline, " + name);
      overlap(p_.out, input);
      expect_overlap_error("out", name);
    }
  }
}

TEST_F(OverlapTest, LseMustNotOverlapAnInputOrTheWorkspace) {
  for (const char* name : {"query", "kv_cache", "seq_lens", "block_tables", "workspace"}) {
    SCOPED_TRACE(name);
    make_dense();
    TensorView& input = std::string(name) == "query"       ? p_.query
                        : std::string(name) == "kv_cache"  ? p_.kv_cache
                        : std::string(name) == "seq_lens"  ? p_.seq_lens
                        : std::string(name) == "workspace" ? p_.workspace
                                                           : p_.block_tables;
    overlap(p_.lse, input);
    expect_overlap_error("lse", name);
  }
}

TEST_F(OverlapTest, OutAndLseMustNotOverlap) {
  p_.lse.data = reinterpret_cast<uint8_t*>(out_.data()) + 64;
  const std::string msg = error_of([&] { mla::decode(p_); }, ErrorCode::kInvalidArgument);
  expect_message(msg, "lse", {"lse: overlaps out (bytes [0x"});
}

// Extents that touch without sharing a byte are apart; empty tensors overlap nothing.
TEST_F(OverlapTest, AdjacentAndEmptyTensorsAreApart) {
  const std::vector<uint16_t> expected = decode_ok();
  // lse, then out right after it, right after a copy of the query, in one buffer.
  const size_t q_bytes = query_.size() * 2, lse_bytes = lse_.size() * 4,
               out_bytes = out_.size() * 2;
  arena_.assign(q_bytes + lse_bytes + out_bytes, 0);
  std::memcpy(arena_.data(), query_.data(), q_bytes);
  p_.query.data = arena_.data();
  p_.lse.data = arena_.data() + q_bytes;
  p_.out.data = arena_.data() + q_bytes + lse_bytes;
  EXPECT_NO_THROW(mla::decode(p_));
  std::vector<uint16_t> out(out_.size());
  std::memcpy(out.data(), arena_.data() + q_bytes + lse_bytes, out_bytes);
  EXPECT_EQ(out, expected);

  // q_len 0: out and lse are empty, wherever they point.
  make_dense();
  for (TensorView* t : {&p_.query, &p_.out, &p_.lse}) t->shape[1] = 0;
  p_.out.data = p_.lse.data = p_.query.data;
  refresh_workspace();
  EXPECT_NO_THROW(mla::decode(p_));
}

// ---- The fp8_ds_mla cache: uint8 [P, page_size, 656] with a bfloat16 query, L 512, R 64 ----

class Fp8DsMlaValidateTest : public ValidateTest {
 protected:
  void SetUp() override {
    make_dense();
    constexpr int64_t L = 512, D = 576;
    query16_.assign(kB * kQ * kH * D, bf16(0.5f));
    cache_.assign(kPages * kPageSize * 656, 0);
    out16_.assign(kB * kQ * kH * L, kOutSentinel);
    p_.query = TensorView::contiguous(query16_.data(), dtype::kBFloat16, {kB, kQ, kH, D});
    p_.kv_cache = TensorView::contiguous(cache_.data(), dtype::kUInt8, {kPages, kPageSize, 656});
    p_.out = TensorView::contiguous(out16_.data(), dtype::kBFloat16, {kB, kQ, kH, L});
    p_.kv_lora_rank = 512;
    p_.qk_rope_head_dim = 64;
    refresh_workspace();
  }
  std::vector<uint16_t> query16_, out16_;
  std::vector<uint8_t> cache_;
};

TEST_F(Fp8DsMlaValidateTest, BaselineIsValid) {
  EXPECT_NO_THROW(mla::decode(p_));
  // The 4-D layout and padded rows and pages (strides in bytes).
  p_.kv_cache = TensorView::contiguous(cache_.data(), dtype::kUInt8, {kPages, 1, kPageSize, 656});
  EXPECT_NO_THROW(mla::decode(p_));
  constexpr int64_t kRowStride = 672, kPageStride = kPageSize * kRowStride + 64;
  std::vector<uint8_t> padded(kPages * kPageStride, 0);
  p_.kv_cache = TensorView::strided(padded.data(), dtype::kUInt8, {kPages, kPageSize, 656},
                                    {kPageStride, kRowStride, 1});
  EXPECT_NO_THROW(mla::decode(p_));
}

TEST_F(Fp8DsMlaValidateTest, QueryMustBeBfloat16) {
  p_.query.dtype = dtype::kFloat16;
  expect_error(ErrorCode::kTypeError, "kv_cache",
               {"(bfloat16, uint8 fp8_ds_mla)", "got (float16, uint8)"});
  std::vector<uint8_t> q8(query16_.size(), 0);
  p_.query.data = q8.data();
  p_.query.dtype = dtype::kFloat8E4M3;
  expect_error(ErrorCode::kTypeError, "kv_cache", {"got (float8_e4m3fn, uint8)"});
}

TEST_F(Fp8DsMlaValidateTest, HeadDimsMustBe512And64) {
  p_.query.shape[3] = 320;  // a fake view over the same memory
  p_.out.shape[3] = 256;
  p_.kv_lora_rank = 256;
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected kv_lora_rank 512 and qk_rope_head_dim 64 with a uint8 (fp8_ds_mla) "
                "cache",
                "got kv_lora_rank 256 and qk_rope_head_dim 64"});
}

TEST_F(Fp8DsMlaValidateTest, RowsAre656Bytes) {
  p_.kv_cache = TensorView::contiguous(cache_.data(), dtype::kUInt8, {kPages, kPageSize, 576});
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected last dim of fp8_ds_mla bytes per token (512 float8_e4m3fn values, 4 "
                "float32 scales, 64 bfloat16 rope values) = 656",
                "got 576"});
  p_.kv_cache = TensorView::strided(cache_.data(), dtype::kUInt8, {kPages, kPageSize, 328},
                                    {kPageSize * 656, 656, 2});
  p_.kv_cache.shape[2] = 656;
  expect_error(ErrorCode::kInvalidArgument, "kv_cache",
               {"expected a contiguous last dim (stride 1)"});
}

TEST_F(ValidateTest, KvCachePageAndRowStridesAreFree) {
  const std::vector<uint16_t> expected = decode_ok();
  // Rows padded to 64 elements and pages padded by one row, filled with NaN: never read.
  constexpr int64_t kRowStride = 64, kPageStride = (kPageSize + 1) * kRowStride;
  std::vector<uint16_t> padded(kPages * kPageStride, kOutSentinel);
  for (int64_t page = 0; page < kPages; ++page) {
    for (int64_t row = 0; row < kPageSize; ++row) {
      std::memcpy(&padded[page * kPageStride + row * kRowStride],
                  &kv_[(page * kPageSize + row) * kD], kD * sizeof(uint16_t));
    }
  }
  p_.kv_cache = TensorView::strided(padded.data(), dtype::kBFloat16, {kPages, kPageSize, kD},
                                    {kPageStride, kRowStride, 1});
  EXPECT_EQ(decode_ok(), expected);
}

}  // namespace
