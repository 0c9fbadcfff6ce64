// mla-stasync-probe: how fast a cluster pair's producers can hand each other their halves of a
// sparse block, by the store path alone (no global loads, no widening, no GEMMs). A pair of CTAs
// per cluster, 66 clusters; each block is 64 rows x 1152 bytes (the 16-bit tile of a 576-column
// row) in a ring of two stages, and rank r's 128 producer threads write rows 32 r .. 32 r + 31 of
// it into their own stage and into the other CTA's (docs/perf-notes.md, Change 90). A consumer
// warp per CTA waits for each block's full barrier (the local arrivals and the other CTA's bytes)
// and releases the stage to both producers. Modes:
//   0 st.async, runs:     every 16-byte unit by st.shared here and st.async there, a warp's store
//                         covering 512 contiguous bytes (an unswizzled layout);
//   1 st.async, swizzle:  the same stores at the pair's places before Change 90 (lane l of warp
//                         w: row 32 r + 8 w + l % 8, units 2 (l / 8) and 2 (l / 8) + 1 of each
//                         128-byte swizzled chunk row);
//   2 bulk per chunk:     st.shared at those places, then per chunk a proxy fence and one 1 KB bulk
//                         copy a warp to the other CTA (the pair's gather before Change 90);
//   3 bulk per block:     the same with one proxy fence a block, then the nine copies.
// Cycles per block are clock64 over the CTA's blocks (median over CTAs), us per block from the
// global timer. A measurement tool, not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "sm90/decode/tma/ptx.cuh"

namespace {

using namespace mla::sm90::tma;

constexpr int kChunks = 9, kChunkBytes = 64 * 128;  // nine 64-column chunks of 64 rows
constexpr int kBlockBytes = kChunks * kChunkBytes;  // 73,728
constexpr int kHalfBytes = kBlockBytes / 2;         // a rank's 32 rows
constexpr int kProducers = 128, kThreads = kProducers + 32;
constexpr int kSmem = 2 * kBlockBytes + 1024;

struct Bars {
  uint64_t full[2];
  uint64_t empty[2];
};

template <int kMode>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    exchange(int blocks, long long* cycles, unsigned long long* ns, int* sink) {
  extern __shared__ __align__(1024) uint8_t raw[];
  uint8_t* stage_base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  __shared__ Bars bars;
  const uint32_t rank = cluster_ctarank(), peer = rank ^ 1;
  const int t = threadIdx.x;
  if (t == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(&bars.full[s], kProducers);  // local arrivals; the peer's bytes by transaction
      mbar_init(&bars.empty[s], 2);          // both CTAs' consumer warps
    }
    fence_mbar_init();
  }
  cluster_sync_relaxed();
  long long c0 = clock64();
  unsigned long long n0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n0));
  if (t < kProducers) {
    const int w = t / 32, l = t % 32;
    for (int b = 0; b < blocks; ++b) {
      const int s = b & 1;
      if (b >= 2) mbar_wait(&bars.empty[s], ((b >> 1) - 1) & 1);
      uint8_t* stage = stage_base + s * kBlockBytes;
      const uint32_t remote_full = cluster_addr(&bars.full[s], peer);
      const uint32_t remote_stage = cluster_addr(stage, peer);
      auto value = [&](int k) { return make_uint4(b, t, k, rank); };
      if constexpr (kMode == 0) {
#pragma unroll
        for (int k = 0; k < 18; ++k) {
          const uint32_t off = rank * kHalfBytes + (k * kProducers + t) * 16;
          const uint4 v = value(k);
          *reinterpret_cast<uint4*>(stage + off) = v;
          st_async_16(remote_stage + off, v, remote_full);
        }
      } else {
        const int row = 32 * rank + 8 * w + l % 8;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int unit = 2 * (l / 8) + h;
            const uint32_t off = c * kChunkBytes + row * 128 + ((unit ^ (row & 7)) << 4);
            const uint4 v = value(2 * c + h);
            *reinterpret_cast<uint4*>(stage + off) = v;
            if constexpr (kMode == 1) st_async_16(remote_stage + off, v, remote_full);
          }
          if constexpr (kMode == 2) {
            fence_proxy_async_smem();  // each lane's stores, for the async proxy
            __syncwarp();
            const uint32_t rows_off = c * kChunkBytes + (32 * rank + 8 * w) * 128;
            if (l == 0)
              bulk_copy_to_cluster(remote_stage + rows_off, stage + rows_off, 1024, remote_full);
          }
        }
        if constexpr (kMode == 3) {
          fence_proxy_async_smem();  // each lane's stores, for the async proxy
          __syncwarp();
          if (l == 0) {
            for (int c = 0; c < kChunks; ++c) {
              const uint32_t rows_off = c * kChunkBytes + (32 * rank + 8 * w) * 128;
              bulk_copy_to_cluster(remote_stage + rows_off, stage + rows_off, 1024, remote_full);
            }
          }
        }
      }
      // NOTE: the stage's expected bytes ride on one local arrival; the peer's may land first.
      if (t == 0) {
        mbar_arrive_expect_tx(&bars.full[s], kHalfBytes);
      } else {
        mbar_arrive(&bars.full[s]);
      }
    }
  } else if (t == kProducers) {
    int acc = 0;
    for (int b = 0; b < blocks; ++b) {
      const int s = b & 1;
      mbar_wait(&bars.full[s], (b >> 1) & 1);
      acc += stage_base[s * kBlockBytes + (b % 64) * 16];
      mbar_arrive(&bars.empty[s]);
      mbar_arrive_cluster(&bars.empty[s], peer);
    }
    if (acc == 0x7fffffff) *sink = acc;
  }
  __syncthreads();
  long long c1 = clock64();
  unsigned long long n1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n1));
  if (t == 0) {
    cycles[blockIdx.x] = c1 - c0;
    ns[blockIdx.x] = n1 - n0;
  }
  // The other CTA's remote arrivals and stores into this one are done before either exits.
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
}

template <int kMode>
void run(const char* name, int blocks, int ctas) {
  long long* cycles;
  unsigned long long* ns;
  int* sink;
  cudaMalloc(&cycles, ctas * sizeof(long long));
  cudaMalloc(&ns, ctas * sizeof(unsigned long long));
  cudaMalloc(&sink, sizeof(int));
  cudaFuncSetAttribute(exchange<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  std::vector<double> per_block_cycles, per_block_us;
  for (int rep = 0; rep < 7; ++rep) {
    exchange<kMode><<<ctas, kThreads, kSmem>>>(blocks, cycles, ns, sink);
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("%s: %s\n", name, cudaGetErrorString(err));
      std::exit(1);
    }
    std::vector<long long> c(ctas);
    std::vector<unsigned long long> n(ctas);
    cudaMemcpy(c.data(), cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost);
    cudaMemcpy(n.data(), ns, ctas * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    std::sort(c.begin(), c.end());
    std::sort(n.begin(), n.end());
    per_block_cycles.push_back(static_cast<double>(c[ctas / 2]) / blocks);
    per_block_us.push_back(static_cast<double>(n[ctas / 2]) / blocks / 1000.0);
  }
  std::sort(per_block_cycles.begin(), per_block_cycles.end());
  std::sort(per_block_us.begin(), per_block_us.end());
  std::printf(
      "%-20s %8.0f cycles a block  %7.3f us a block  (median of 7 launches, %d blocks, %d CTAs)\n",
      name, per_block_cycles[3], per_block_us[3], blocks, ctas);
  cudaFree(cycles);
  cudaFree(ns);
  cudaFree(sink);
}

}  // namespace

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 256;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int ctas = sms / 2 * 2;
  run<0>("st.async, runs", blocks, ctas);
  run<1>("st.async, swizzle", blocks, ctas);
  run<2>("bulk per chunk", blocks, ctas);
  run<3>("bulk per block", blocks, ctas);
  return 0;
}
