// CUDA graphs on the sm90 backend (docs/contract.md section 6): one mla::run of a plan captured
// once, then replayed with new inputs written into the same device buffers, as an engine replays
// a captured decode step. Each replay must read what the buffers hold then: its out and lse match
// the oracle for those inputs, and differ from the previous replay's wherever a row attends keys.
// Shared by the GPU suites, which skip themselves without a Hopper GPU (common/hopper.h).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/decode_case.h"
#include "common/device_call.h"
#include "common/test_util.h"
#include "mla/mla.h"

namespace mla_test::gpu {

// A stream of its own and, once captured, the graph of one mla::run on it.
class CapturedRun {
 public:
  CapturedRun() {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CapturedRun() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    cudaStreamDestroy(stream_);
  }
  CapturedRun(const CapturedRun&) = delete;
  CapturedRun& operator=(const CapturedRun&) = delete;

  // Moves `params` to this stream with PDL on, plans it there (outside the graph: the plan is the
  // step's, made once from seq_lens and the shapes), then captures one run of that plan in global
  // mode, where any call that may not be captured (an allocation, a sync, a host copy) fails.
  ::testing::AssertionResult capture(mla::DecodeParams& params) {
    params.stream = stream_;
    params.enable_pdl = true;
    mla::Plan plan;
    try {
      plan = mla::plan(params);
    } catch (const mla::Error& e) {
      return ::testing::AssertionFailure() << "plan: " << e.what();
    }
    if (cudaError_t err = cudaStreamSynchronize(stream_); err != cudaSuccess) {
      return ::testing::AssertionFailure() << "plan: " << cudaGetErrorString(err);
    }
    if (cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal);
        err != cudaSuccess) {
      return ::testing::AssertionFailure() << "begin capture: " << cudaGetErrorString(err);
    }
    bool ran = true;
    std::string run_error;
    try {
      mla::run(plan, params);
    } catch (const mla::Error& e) {
      ran = false;
      run_error = e.what();
    }
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph_);  // ends it in any case
    if (!ran) return ::testing::AssertionFailure() << "run: " << run_error;
    if (end != cudaSuccess) {
      return ::testing::AssertionFailure() << "end capture: " << cudaGetErrorString(end);
    }
    if (cudaError_t err = cudaGraphGetNodes(graph_, nullptr, &nodes_); err != cudaSuccess) {
      return ::testing::AssertionFailure() << "graph nodes: " << cudaGetErrorString(err);
    }
    if (nodes_ == 0) return ::testing::AssertionFailure() << "run captured no work";
    if (cudaError_t err = cudaGraphInstantiate(&exec_, graph_, 0); err != cudaSuccess) {
      return ::testing::AssertionFailure() << "instantiate: " << cudaGetErrorString(err);
    }
    return ::testing::AssertionSuccess();
  }

  // One launch of the captured graph, waited for.
  ::testing::AssertionResult replay() {
    cudaError_t err = cudaGraphLaunch(exec_, stream_);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(err);
    return ::testing::AssertionSuccess();
  }

  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
};

// The inputs of replay k (1, 2, ...) of a call captured with `c`'s: the same shapes and seq_lens
// (the plan's), a new seed (new query, cache contents, sinks, block tables or sparse indices with
// their -1 entries and lens), and, where the scales are device tensors, new bmm1 and bmm2 values.
inline decode_case::Case replay_case(decode_case::Case c, int k) {
  constexpr double kBmm1[] = {0.12, 0.05, 0.25};
  constexpr double kBmm2[] = {1.5, 0.5, 3.0};
  c.seed = c.seed * 1000 + 17 * k;
  if (c.scale_tensors) {
    c.bmm1 = kBmm1[(k - 1) % 3];
    c.bmm2 = kBmm2[(k - 1) % 3];
  }
  return c;
}

// Rows (token, head) that attend a key in `now` or in `before` (a finite lse in either; the call
// must have lse) and whose out row or lse holds the same bits in both. With new inputs every such
// row changes: a count above 0 means a replay computed (or left) a row from an earlier replay's
// inputs.
inline int64_t rows_like_before(const decode_case::Built& now, const decode_case::Built& before) {
  const int64_t rows = static_cast<int64_t>(now.T) * now.c.H;
  const size_t element = dtype_bytes(now.c.out_dtype);
  const size_t row_bytes = element * now.c.L;
  const auto* out_now = static_cast<const uint8_t*>(now.out.data());
  const auto* out_before = static_cast<const uint8_t*>(before.out.data());
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double lse = now.lse.get(r), lse_before = before.lse.get(r);
    if (std::isinf(lse) && std::isinf(lse_before)) continue;  // no key either time: 0 and -inf
    const bool out_same = std::memcmp(out_now + now.out_row[r] * element,
                                      out_before + before.out_row[r] * element, row_bytes) == 0;
    same += out_same || lse == lse_before;
  }
  return same;
}

// Replays `graph`, captured from `call` with `first`'s inputs in its buffers, once with those and
// then once per new input set: make(k, kv_bytes) builds set k = 1 .. replays (for an fp8_ds_mla
// cache its bytes into kv_bytes, else left empty), which is uploaded into the same buffers with
// out and lse poisoned. After each replay out and lse go to check(built), which compares them
// with the oracle, and every row that attends keys must differ from the previous replay's
// (rows_like_before).
template <typename Make, typename Check>
void replay_with_new_inputs(DeviceCall& call, CapturedRun& graph, decode_case::Built& first,
                            int replays, Make make, Check check) {
  ASSERT_TRUE(first.c.lse) << "rows_like_before reads lse";
  std::unique_ptr<decode_case::Built> held;  // the previous replay's, after the first
  const decode_case::Built* before = nullptr;
  for (int k = 0; k <= replays; ++k) {
    SCOPED_TRACE("replay " + std::to_string(k) + " (0: the inputs of the capture)");
    std::unique_ptr<decode_case::Built> fresh;
    decode_case::Built* now = &first;
    if (k > 0) {
      std::vector<uint8_t> kv_bytes;
      fresh = make(k, kv_bytes);
      now = fresh.get();
      call.upload(*now, graph.stream(), kv_bytes.empty() ? nullptr : &kv_bytes);
    }
    ASSERT_TRUE(graph.replay());
    call.download(*now);
    check(*now);
    if (before != nullptr) {
      EXPECT_EQ(rows_like_before(*now, *before), 0)
          << "rows whose out or lse kept the previous replay's bits";
    }
    if (fresh) held = std::move(fresh);
    before = now;
  }
}

}  // namespace mla_test::gpu
