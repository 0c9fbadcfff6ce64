// mla-gather-probe: how fast rows of a sparse call's gather land in shared memory, by the two ways
// a CTA can issue them, with no compute behind them (docs/perf-notes.md, "The gather's issue,
// probed"). One CTA of 128 threads per SM, 128 CTAs; each takes blocks of 64 rows of 656 bytes
// (fp8_ds_mla), 576 (per-tensor e4m3) or 1152 (16-bit) by random index into a ring of 2 to 4
// stages:
//   cp.async 16 B: every thread issues 16-byte cp.async pieces (as the sparse gathers do);
//   bulk per row:  lanes 0..63 issue one cp.async.bulk of a whole row each on the stage's mbarrier.
// Rows come from all 2^20 rows of a buffer, or with WINDOW=1 from each CTA's own 8192 (a
// request's cache, as a top-k draws them). Events around one launch after a 256 MiB write that
// flushes L2, median of 20; TB/s counts the gathered bytes. SORT=N sorts each run of N indices
// (the rows of N / 64 blocks in ascending order). A measurement tool, not a test.
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

constexpr int kRows = 64;
constexpr int kThreads = 128;
constexpr int kMaxBlocks = 64;  // blocks a CTA at most (its indices' stride)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int kMode, int kStages, int kRowBytes>
__global__ void __launch_bounds__(kThreads, 1)
    gather(const uint8_t* __restrict__ src, const int* __restrict__ idx, int blocks, int stride,
           int* sink) {
  constexpr int kBlockBytes = kRows * kRowBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bar[kStages];
  const int* my = idx + static_cast<size_t>(blockIdx.x) * stride * kRows;  // this CTA's rows
  if (kMode == 1 && threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem_u32(&bar[s])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  auto issue = [&](int b) {
    uint8_t* dst = smem + (b % kStages) * kBlockBytes;
    if constexpr (kMode == 0) {
      for (int e = threadIdx.x; e < kRows * (kRowBytes / 16); e += kThreads) {
        const int r = e / (kRowBytes / 16), piece = e - r * (kRowBytes / 16);
        const uint8_t* g = src + static_cast<size_t>(my[b * kRows + r]) * kRowBytes + piece * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                         smem_u32(dst + r * kRowBytes + piece * 16)),
                     "l"(g));
      }
      asm volatile("cp.async.commit_group;");
    } else {
      uint64_t* br = &bar[b % kStages];
      if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_u32(br)),
                     "r"(kBlockBytes));
      }
      __syncwarp();
      if (threadIdx.x < kRows) {
        const uint8_t* g = src + static_cast<size_t>(my[b * kRows + threadIdx.x]) * kRowBytes;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(smem_u32(dst + threadIdx.x * kRowBytes)),
            "l"(g), "r"(kRowBytes), "r"(smem_u32(br)));
      }
    }
  };
  int acc = 0;
  for (int b = 0; b < min(kStages - 1, blocks); ++b) issue(b);
  for (int b = 0; b < blocks; ++b) {
    if (b + kStages - 1 < blocks) issue(b + kStages - 1);
    if constexpr (kMode == 0) {
      // groups committed after block b: min(kStages - 1, blocks - 1 - b)
      const int after = min(kStages - 1, blocks - 1 - b);
      if (after >= 3)
        asm volatile("cp.async.wait_group 3;");
      else if (after == 2)
        asm volatile("cp.async.wait_group 2;");
      else if (after == 1)
        asm volatile("cp.async.wait_group 1;");
      else
        asm volatile("cp.async.wait_group 0;");
      __syncthreads();
    } else {
      const uint32_t phase = (b / kStages) & 1;
      uint32_t done = 0;
      while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
            "p; }"
            : "=r"(done)
            : "r"(smem_u32(&bar[b % kStages])), "r"(phase));
      }
    }
    acc += smem[(b % kStages) * kBlockBytes + threadIdx.x * 7];
    __syncthreads();  // the stage is free for the issue kStages - 1 blocks on
  }
  if (acc == 0x7fffffff) sink[0] = acc;
}

template <int kMode, int kStages, int kRowBytes>
float run(const uint8_t* src, const int* idx, int blocks, int ctas, int* sink, void* flush,
          size_t flush_bytes) {
  const size_t smem = static_cast<size_t>(kStages) * kRows * kRowBytes;
  cudaFuncSetAttribute(gather<kMode, kStages, kRowBytes>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < 22; ++i) {
    cudaMemsetAsync(flush, i & 0xff, flush_bytes);
    cudaEventRecord(a);
    gather<kMode, kStages, kRowBytes><<<ctas, kThreads, smem>>>(src, idx, blocks, kMaxBlocks, sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 2) t.push_back(ms * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  if (cudaGetLastError() != cudaSuccess) std::printf("error\n");
  return t[t.size() / 2];
}

// The table of one row size: S 2 and 4 (3 for rows that do not fit four stages) for each issue.
template <int kRowBytes>
void table(const uint8_t* src, const int* idx, int* sink, void* flush, size_t flush_bytes) {
  constexpr int kBlockBytes = kRows * kRowBytes;
  constexpr int kDeep = 4 * kBlockBytes <= 220 * 1024 ? 4 : 3;
  std::printf("\nrows of %d B, %d a block (%d B)\n", kRowBytes, kRows, kBlockBytes);
  std::printf(
      "| issue | stages | CTAs | blocks a CTA | us | TB/s |\n| --- | --- | --- | --- | --- | --- "
      "|\n");
  const int ctas = 128;
  for (int blocks : {4, 16, 32, 64}) {
    const double bytes = static_cast<double>(ctas) * blocks * kBlockBytes;
    auto line = [&](const char* m, int st, float us) {
      std::printf("| %s | %d | %d | %d | %.1f | %.2f |\n", m, st, ctas, blocks, us,
                  bytes / us / 1e6);
    };
    line("cp.async 16 B", 2,
         run<0, 2, kRowBytes>(src, idx, blocks, ctas, sink, flush, flush_bytes));
    line("cp.async 16 B", kDeep,
         run<0, kDeep, kRowBytes>(src, idx, blocks, ctas, sink, flush, flush_bytes));
    line("bulk per row", 2, run<1, 2, kRowBytes>(src, idx, blocks, ctas, sink, flush, flush_bytes));
    line("bulk per row", kDeep,
         run<1, kDeep, kRowBytes>(src, idx, blocks, ctas, sink, flush, flush_bytes));
  }
}

int main() {
  const size_t n_rows = 1u << 20;     // rows of any size below
  const size_t max_row_bytes = 1152;  // a 16-bit (512 + 64) row
  uint8_t* src;
  cudaMalloc(&src, n_rows * max_row_bytes);
  cudaMemset(src, 1, n_rows * max_row_bytes);
  void* flush;
  const size_t flush_bytes = 256u << 20;
  cudaMalloc(&flush, flush_bytes);
  int* sink;
  cudaMalloc(&sink, 4);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::vector<int> h(static_cast<size_t>(sms) * kMaxBlocks * kRows);
  std::mt19937 rng(1);
  // WINDOW=1: each CTA's rows from its own window of 8192 consecutive rows (a request's cache of
  // seq 8192, as a sparse token's top-k draws them); else from all rows.
  const bool window = std::getenv("WINDOW") != nullptr;
  for (size_t i = 0; i < h.size(); ++i) {
    const size_t cta = i / (static_cast<size_t>(kMaxBlocks) * kRows);
    h[i] = window ? static_cast<int>(cta * 8192 + rng() % 8192) : static_cast<int>(rng() % n_rows);
  }
  // SORT=N: each consecutive run of N indices (a CTA's list starts at a multiple of N where N
  // divides 64 x 64) in ascending order, as a top-k list sorted before its gather would be.
  const int sort_run = std::getenv("SORT") != nullptr ? std::atoi(std::getenv("SORT")) : 0;
  if (sort_run > 0) {
    for (size_t i = 0; i + sort_run <= h.size(); i += sort_run) {
      std::sort(h.begin() + i, h.begin() + i + sort_run);
    }
  }
  std::printf("SMs %d; rows drawn %s; runs of %d indices sorted\n", sms,
              window ? "from each CTA's window of 8192 rows" : "from all 2^20 rows", sort_run);
  int* idx;
  cudaMalloc(&idx, h.size() * 4);
  cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  {
    uint8_t* dst;
    const size_t n = 512u << 20;
    cudaMalloc(&dst, n);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<float> t;
    for (int i = 0; i < 12; ++i) {
      cudaEventRecord(a);
      cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (i >= 2) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    std::printf("device copy: %.2f TB/s (read + write of 512 MiB)\n",
                2.0 * n / (t[t.size() / 2] * 1e-3) / 1e12);
    cudaFree(dst);
  }
  table<656>(src, idx, sink, flush, flush_bytes);   // fp8_ds_mla
  table<576>(src, idx, sink, flush, flush_bytes);   // per-tensor e4m3
  table<1152>(src, idx, sink, flush, flush_bytes);  // bf16 / fp16
  return 0;
}
