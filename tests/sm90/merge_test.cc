// The sm90 merge kernel (src/sm90/decode/merge/) against the float64 merge oracle and the cpu
// backend: the cpu suite's cases, 16-byte and scalar paths, graphs, PDL, determinism. Skips where
// no CUDA device of compute capability 9.0 is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/hopper.h"
#include "common/merge_case.h"
#include "mla/mla.h"

namespace {

using namespace mla_test::merge_case;
namespace dt = mla::dtype;

using mla_test::has_hopper;

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    ADD_FAILURE() << what << ": " << cudaGetErrorString(err);
    throw std::runtime_error(what);
  }
}

// Device copies of a Built merge call; `params` points at them (backend sm90, cuda:0). The outputs
// start as the host buffers' NaN poison; fetch() copies them back into the Built.
class DeviceMerge {
 public:
  explicit DeviceMerge(Built& b) : b_(b), params(b.params) {
    params.backend = mla::Backend::kSm90;
    copy(b.parts, params.out_parts);
    copy(b.lse_parts, params.lse_parts);
    copy(b.out, params.out);
    if (params.lse.defined()) copy(b.lse, params.lse);
    if (params.sinks.defined()) copy(b.sinks, params.sinks);
  }
  ~DeviceMerge() {
    for (void* d : device_) cudaFree(d);
  }
  void fetch() {
    cuda_check(cudaDeviceSynchronize(), "the merge");
    cuda_check(
        cudaMemcpy(b_.out.data(), params.out.data, b_.out.bytes().size(), cudaMemcpyDeviceToHost),
        "copy out");
    if (params.lse.defined()) {
      cuda_check(
          cudaMemcpy(b_.lse.data(), params.lse.data, b_.lse.bytes().size(), cudaMemcpyDeviceToHost),
          "copy lse");
    }
  }

 private:
  void copy(const mla_test::Buffer& host, mla::TensorView& view) {
    void* d = nullptr;
    cuda_check(cudaMalloc(&d, std::max<size_t>(host.bytes().size(), 1)), "cudaMalloc");
    cuda_check(cudaMemcpy(d, host.data(), host.bytes().size(), cudaMemcpyHostToDevice), "copy");
    device_.push_back(d);
    view.data = d;
    view.device = mla::cuda_device(0);
  }
  Built& b_;
  std::vector<void*> device_;

 public:
  mla::MergeParams params;
};

std::vector<Case> gpu_cases() {
  std::vector<Case> cases;
  uint64_t seed = 100;
  for (int N : {1, 2, 3, 4, 5, 8, 9}) {
    for (int H : {16, 128}) {
      for (mla::DataType d : {dt::kBFloat16, dt::kFloat16}) {
        Case c;
        c.N = N;
        c.H = H;
        c.T = 8;
        c.dtype = d;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  for (int L : {1, 7, 64, 512}) {  // L 1 and 7: the scalar path; strided 512: 16-byte
    for (bool strided : {false, true}) {
      Case c;
      c.N = 3;
      c.T = 4;
      c.H = 5;
      c.L = L;
      c.strided = strided;
      c.sinks = L == 7 ? dt::kBFloat16 : mla::DataType{};
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  for (Special sp : {Special::kEmptyParts, Special::kNanLse, Special::kWideRange}) {
    for (int N : {1, 2, 6}) {
      Case c;
      c.N = N;
      c.T = 4;
      c.H = 16;
      c.special = sp;
      c.sinks = dt::kFloat32;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  return cases;
}

class Sm90Merge : public ::testing::TestWithParam<Case> {};

TEST_P(Sm90Merge, MatchesOracleAndCpu) {
  SKIP_WITHOUT_HOPPER();
  std::unique_ptr<Built> gpu = build(GetParam());
  {
    DeviceMerge d(*gpu);
    mla::merge_states(d.params);
    d.fetch();
  }
  check_against_oracle(*gpu);
  // The cpu backend computes the same fp32 formula in the same order: within one ulp of out.
  std::unique_ptr<Built> cpu = build(GetParam());
  mla::merge_states(cpu->params);
  for (int64_t i = 0; i < cpu->out.count(); ++i) {
    const double g = gpu->out.get(i), c = cpu->out.get(i);
    if (std::isnan(c)) {
      ASSERT_TRUE(std::isnan(g) || gpu->out.is_poison(i)) << "element " << i;
      continue;
    }
    ASSERT_LE(std::fabs(g - c), std::fabs(c) / 128 + 1e-6) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, Sm90Merge, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return case_name(info.param) + "_" + std::to_string(info.index);
                         });

// Captured in a CUDA graph with PDL and replayed: the same bytes as a direct launch, run to run.
TEST(Sm90MergeGraph, CapturedWithPdlMatchesDirect) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.N = 4;
  c.T = 16;
  c.H = 128;
  c.sinks = dt::kFloat32;
  std::unique_ptr<Built> direct = build(c), graphed = build(c);
  {
    DeviceMerge d(*direct);
    mla::merge_states(d.params);
    d.fetch();
  }
  {
    DeviceMerge d(*graphed);
    cudaStream_t stream;
    cuda_check(cudaStreamCreate(&stream), "stream");
    d.params.stream = stream;
    d.params.enable_pdl = true;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    mla::merge_states(d.params);
    cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int i = 0; i < 3; ++i) cuda_check(cudaGraphLaunch(exec, stream), "replay");
    cuda_check(cudaStreamSynchronize(stream), "sync");
    d.fetch();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  EXPECT_EQ(direct->out.bytes(), graphed->out.bytes());
  EXPECT_EQ(direct->lse.bytes(), graphed->lse.bytes());
  check_against_oracle(*graphed);
}

}  // namespace
