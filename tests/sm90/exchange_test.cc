// The peer exchange kernel (include/mla/exchange.h) on one GPU: N ranks simulated by N buffers of
// device 0 and N streams, each rank's exchange launched on its own stream, so that the ranks'
// kernels run at once and signal each other through the buffers as ranks on N GPUs do. Checks that
// every slot of every buffer holds its rank's bytes of the step, over many steps (the step
// counters in the buffers), back to back without host syncs (a rank's next step must not land
// in a peer's buffer before the peer has copied out the previous one), and in CUDA graphs.
// A tool that runs one kernel at a time (compute-sanitizer's initcheck) hangs the ranks; memcheck,
// racecheck and synccheck run them at once. A watchdog fails a hung test after 30 s where the
// host is not blocked. Skips where no CUDA device of compute capability
// 9.0 is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/hopper.h"
#include "mla/mla.h"

namespace {

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::abort();
  }
}

// The byte of rank r's slot at position i in step `step`: differs between ranks, steps and bytes.
uint8_t pattern(int step, int r, int64_t i) {
  return static_cast<uint8_t>((i * 131 + r * 37 + step * 101 + (i >> 8)) & 0xFF);
}

// N simulated ranks: a zeroed buffer (slots, then flags) and a stream each.
class Ranks {
 public:
  Ranks(int n, int64_t slot_bytes) : n_(n), slot_(slot_bytes) {
    bytes_ = mla::peer_exchange_buffer_bytes(n, slot_bytes);
    buffers_.resize(n);
    streams_.resize(n);
    for (int r = 0; r < n; ++r) {
      cuda_ok(cudaMalloc(&buffers_[r], bytes_), "cudaMalloc");
      cuda_ok(cudaMemset(buffers_[r], 0, bytes_), "cudaMemset");
      cuda_ok(cudaStreamCreateWithFlags(&streams_[r], cudaStreamNonBlocking), "stream");
    }
    cuda_ok(cudaDeviceSynchronize(), "zeroing");
  }
  ~Ranks() {
    for (int r = 0; r < n_; ++r) {
      cudaFree(buffers_[r]);
      cudaStreamDestroy(streams_[r]);
    }
  }

  mla::PeerExchangeParams params(int r) const {
    mla::PeerExchangeParams p;
    p.buffer =
        mla::TensorView::contiguous(buffers_[r], mla::dtype::kUInt8, {bytes_}, mla::cuda_device(0));
    for (int s = 0; s < n_; ++s) p.peer_buffers[s] = buffers_[s];
    p.num_ranks = n_;
    p.rank = r;
    p.slot_bytes = slot_;
    p.backend = mla::Backend::kSm90;
    p.enable_pdl = true;
    p.stream = streams_[r];
    return p;
  }

  // Rank r's step on its stream: poison the other slots, write its slot from `src` (device),
  // exchange, copy the whole slots region into `dst` (device).
  void step(int r, const void* src, void* dst) const {
    char* base = static_cast<char*>(buffers_[r]);
    cudaStream_t s = streams_[r];
    cuda_ok(cudaMemsetAsync(base, 0xFF, n_ * slot_, s), "poison");
    cuda_ok(cudaMemcpyAsync(base + r * slot_, src, slot_, cudaMemcpyDeviceToDevice, s), "slot");
    mla::peer_exchange(params(r));
    cuda_ok(cudaMemcpyAsync(dst, base, n_ * slot_, cudaMemcpyDeviceToDevice, s), "copy out");
  }

  // Waits for every stream; fails the whole program when the ranks do not finish in 30 s (a hung
  // kernel cannot be stopped from here).
  void wait() const {
    const auto start = std::chrono::steady_clock::now();
    for (cudaStream_t s : streams_) {
      for (;;) {
        const cudaError_t q = cudaStreamQuery(s);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) cuda_ok(q, "a rank's stream");
        if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
          std::fprintf(stderr, "peer exchange: the ranks did not finish in 30 s\n");
          std::_Exit(1);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

  int n() const { return n_; }
  int64_t slot() const { return slot_; }
  cudaStream_t stream(int r) const { return streams_[r]; }

 private:
  int n_;
  int64_t slot_;
  int64_t bytes_ = 0;
  std::vector<void*> buffers_;
  std::vector<cudaStream_t> streams_;
};

// Device staging of each (step, rank) slot's bytes and of each (step, rank) result.
struct Staging {
  Staging(const Ranks& ranks, int steps) : n(ranks.n()), slot(ranks.slot()), steps(steps) {
    cuda_ok(cudaMalloc(&src, steps * n * slot), "src");
    cuda_ok(cudaMalloc(&dst, steps * n * n * slot), "dst");
    cuda_ok(cudaMemset(dst, 0, steps * n * n * slot), "dst zero");
    std::vector<uint8_t> host(slot);
    for (int k = 0; k < steps; ++k) {
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < slot; ++i) host[i] = pattern(k, r, i);
        cuda_ok(cudaMemcpy(src_of(k, r), host.data(), slot, cudaMemcpyHostToDevice), "fill");
      }
    }
  }
  ~Staging() {
    cudaFree(src);
    cudaFree(dst);
  }
  char* src_of(int k, int r) const { return static_cast<char*>(src) + (k * n + r) * slot; }
  char* dst_of(int k, int r) const { return static_cast<char*>(dst) + (k * n + r) * n * slot; }

  // Every slot s of rank r's result of step k holds rank s's bytes of step k.
  void check(int k) const {
    std::vector<uint8_t> got(n * slot);
    for (int r = 0; r < n; ++r) {
      cuda_ok(cudaMemcpy(got.data(), dst_of(k, r), n * slot, cudaMemcpyDeviceToHost), "fetch");
      for (int s = 0; s < n; ++s) {
        for (int64_t i = 0; i < slot; ++i) {
          const uint8_t want = pattern(k, s, i);
          if (got[s * slot + i] != want) {
            FAIL() << "step " << k << ", rank " << r << ", slot " << s << ", byte " << i << ": got "
                   << int(got[s * slot + i]) << ", expected " << int(want);
          }
        }
      }
    }
  }

  int n;
  int64_t slot;
  int steps;
  void* src = nullptr;
  void* dst = nullptr;
};

struct Shape {
  int n;
  int64_t slot;
};

class PeerExchange : public ::testing::TestWithParam<Shape> {};

// Steps back to back on each rank's stream, no host sync between them, then every result.
TEST_P(PeerExchange, StepsBackToBack) {
  SKIP_WITHOUT_HOPPER();
  const Shape shape = GetParam();
  Ranks ranks(shape.n, shape.slot);
  constexpr int kSteps = 6;
  Staging staging(ranks, kSteps);
  for (int k = 0; k < kSteps; ++k) {
    for (int r = 0; r < ranks.n(); ++r) ranks.step(r, staging.src_of(k, r), staging.dst_of(k, r));
  }
  ranks.wait();
  for (int k = 0; k < kSteps; ++k) staging.check(k);
}

// Each rank's step captured once in a CUDA graph and replayed: the step counters live on the
// device, so every replay is a new step. New bytes between replays come through the graph's
// source buffer.
TEST_P(PeerExchange, GraphReplays) {
  SKIP_WITHOUT_HOPPER();
  const Shape shape = GetParam();
  Ranks ranks(shape.n, shape.slot);
  constexpr int kSteps = 4;
  Staging staging(ranks, kSteps);
  // One eager step first (the counters then stand at 1 on every rank).
  for (int r = 0; r < ranks.n(); ++r) ranks.step(r, staging.src_of(0, r), staging.dst_of(0, r));
  ranks.wait();
  staging.check(0);
  void* live_src = nullptr;  // rank r's source slot at r * slot; dst at r * n * slot
  void* live_dst = nullptr;
  cuda_ok(cudaMalloc(&live_src, ranks.n() * ranks.slot()), "live src");
  cuda_ok(cudaMalloc(&live_dst, ranks.n() * ranks.n() * ranks.slot()), "live dst");
  std::vector<cudaGraphExec_t> graphs(ranks.n());
  for (int r = 0; r < ranks.n(); ++r) {
    cudaGraph_t graph;
    cuda_ok(cudaStreamBeginCapture(ranks.stream(r), cudaStreamCaptureModeThreadLocal), "capture");
    ranks.step(r, static_cast<char*>(live_src) + r * ranks.slot(),
               static_cast<char*>(live_dst) + r * ranks.n() * ranks.slot());
    cuda_ok(cudaStreamEndCapture(ranks.stream(r), &graph), "end capture");
    cuda_ok(cudaGraphInstantiate(&graphs[r], graph, 0), "instantiate");
    cudaGraphDestroy(graph);
  }
  // NOTE: every copy goes on the rank's own stream, ahead of or behind its replay: a
  // device-to-device cudaMemcpy is asynchronous to the host and runs on the legacy stream, which
  // the ranks' non-blocking streams do not wait for (a replay then read the previous step's bytes
  // whenever other work on the device delayed the copy).
  for (int k = 1; k < kSteps; ++k) {
    for (int r = 0; r < ranks.n(); ++r) {
      cuda_ok(cudaMemcpyAsync(static_cast<char*>(live_src) + r * ranks.slot(), staging.src_of(k, r),
                              ranks.slot(), cudaMemcpyDeviceToDevice, ranks.stream(r)),
              "new bytes");
      cuda_ok(cudaGraphLaunch(graphs[r], ranks.stream(r)), "replay");
      cuda_ok(cudaMemcpyAsync(staging.dst_of(k, r),
                              static_cast<char*>(live_dst) + r * ranks.n() * ranks.slot(),
                              ranks.n() * ranks.slot(), cudaMemcpyDeviceToDevice, ranks.stream(r)),
              "result");
    }
    ranks.wait();
    staging.check(k);
  }
  for (auto g : graphs) cudaGraphExecDestroy(g);
  cudaFree(live_src);
  cudaFree(live_dst);
}

// Slots from one vector to many CTAs' chunks (64 CTAs, the last chunk short), 2 to 8 ranks.
INSTANTIATE_TEST_SUITE_P(Shapes, PeerExchange,
                         ::testing::Values(Shape{2, 16}, Shape{2, 4096 + 16}, Shape{2, 131584},
                                           Shape{3, 1048576 + 528}, Shape{8, 20000 + 32},
                                           Shape{5, 48}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "n" + std::to_string(info.param.n) + "_slot" +
                                  std::to_string(info.param.slot);
                         });

// One rank: nothing to move, nothing launched; the slot is as written.
TEST(PeerExchangeOne, NothingToMove) {
  SKIP_WITHOUT_HOPPER();
  Ranks ranks(1, 64);
  Staging staging(ranks, 1);
  ranks.step(0, staging.src_of(0, 0), staging.dst_of(0, 0));
  ranks.wait();
  staging.check(0);
}

}  // namespace
