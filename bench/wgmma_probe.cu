// mla-wgmma-probe: how long one warpgroup waits for its own e4m3 wgmmas (m64nNk32, f32
// accumulators), the chain the FP8 seesaw kernel's P V m tiles and S partials are made of
// (docs/perf-notes.md, "The FP8 wgmma's latency, probed"). Each CTA's warpgroups repeat: issue
// `groups` commit groups of `steps` wgmmas each into their own accumulators, wait for all, with
// nothing else between; cycles per repetition by clock64, the median over the CTAs' warpgroup 0,
// and the clock they imply against %globaltimer. NOTE: its first figures (docs/perf-notes.md) give
// a k step less time than the FP8 dense peak and shared-memory bandwidth allow, so what it times
// is not yet understood, and they are not to be relied on until it is.
// A from registers (RS, as P V's V^T) or shared memory (SS, as S's query), B from shared memory
// (K-major, 64-byte swizzle); finite pseudo-random values. 132 CTAs of one or two
// warpgroups (two: both run the same chain at once, as the kernel's two consumers). A measurement
// tool, not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cute/tensor.hpp>
#include <type_traits>
#include <vector>

namespace wgmma_probe {

using namespace cute;
using T = float_e4m3_t;

template <class Atom, int kN, int kSteps, int kGroups>
__global__ void __launch_bounds__(256, 1) probe(long long* cycles, long long* ns, int reps) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr int kK = 64 * ((kSteps + 1) / 2);  // the swizzle atom's 64 columns at least
  using AtomL = GMMA::Layout_K_SW64_Atom<T>;
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<T*>(smem)),
                          tile_to_shape(AtomL{}, Shape<_64, Int<kK>>{}));
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(smem + 64 * kK)),
                          tile_to_shape(AtomL{}, Shape<Int<kN>, Int<kK>>{}));
  // finite e4m3 values (bytes below 0x40: exponents up to 7, never the NaN code 0x7f)
  auto bytes = [](uint32_t i) { return (i * 2654435761u >> 7) & 0x3f3f3f3fu; };
  for (int i = threadIdx.x; i < (64 + kN) * kK / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(smem)[i] = bytes(i);
  }
  __syncthreads();
  auto mma = make_tiled_mma(Atom{});
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor tA = thr.partition_fragment_A(sA);
  Tensor tB = thr.partition_fragment_B(sB);
  if constexpr (std::is_same_v<typename decltype(tA)::value_type, T>) {  // RS: A in registers
    for (int k = 0; k < size<2>(tA); ++k) {
      Tensor a = recast<uint32_t>(tA(_, 0, k));
      for (int i = 0; i < size(a); ++i) a(i) = bytes(threadIdx.x * 64 + 8 * k + i);
    }
  }
  using Acc = decltype(partition_fragment_C(mma, Shape<_64, Int<kN>>{}));
  Acc acc[kGroups];
  for (int g = 0; g < kGroups; ++g) clear(acc[g]);
  long long t0 = 0, g0 = 0;
  for (int r = -8; r < reps; ++r) {
    if (r == 0) {
      t0 = clock64();
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    }
    for (int g = 0; g < kGroups; ++g) warpgroup_fence_operand(acc[g]);
    CUTE_UNROLL
    for (int g = 0; g < kGroups; ++g) {
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = 0; k < kSteps; ++k) {
        mma.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        cute::gemm(mma, tA(_, _, k), tB(_, _, k), acc[g]);
      }
      warpgroup_commit_batch();
    }
    warpgroup_wait<0>();
    for (int g = 0; g < kGroups; ++g) warpgroup_fence_operand(acc[g]);
  }
  const long long t1 = clock64();
  long long g1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  float sum = 0.0f;
  for (int g = 0; g < kGroups; ++g) {
    for (int i = 0; i < size(acc[g]); ++i) sum += acc[g](i);
  }
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = (t1 - t0) + (sum != 0.0f ? 1 : 0);
    ns[blockIdx.x] = g1 - g0;
  }
}

template <class Atom, int kN, int kSteps, int kGroups>
void run(const char* name, int warpgroups) {
  constexpr int kCtas = 132, kReps = 2000;
  long long* d = nullptr;
  cudaMalloc(&d, 2 * kCtas * sizeof(long long));
  const int smem = (64 + kN) * 64 * ((kSteps + 1) / 2) + 1024;
  auto* k = &probe<Atom, kN, kSteps, kGroups>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  k<<<kCtas, 128 * warpgroups, smem>>>(d, d + kCtas, kReps);
  std::vector<long long> h(kCtas), t(kCtas);
  cudaMemcpy(t.data(), d + kCtas, kCtas * sizeof(long long), cudaMemcpyDeviceToHost);
  const cudaError_t e = cudaMemcpy(h.data(), d, kCtas * sizeof(long long), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) {
    std::printf("%-34s error: %s\n", name, cudaGetErrorString(e));
    return;
  }
  std::sort(h.begin(), h.end());
  std::sort(t.begin(), t.end());
  const double per = static_cast<double>(h[kCtas / 2]) / kReps;
  const double ghz = static_cast<double>(h[kCtas / 2]) / static_cast<double>(t[kCtas / 2]);
  // tensor work of one repetition at 8192 e4m3 FLOP per cycle and SM (dense peak)
  const double work = 2.0 * 64 * kN * 32 * kSteps * kGroups * warpgroups / 8192.0;
  std::printf(
      "%-34s %d warpgroup(s): %7.1f cycles a repetition (tensor work %5.1f; clock %.2f GHz)\n",
      name, warpgroups, per, work, ghz);
}

}  // namespace wgmma_probe

int main() {
  using namespace wgmma_probe;
  using namespace cute::SM90::GMMA;
  run<MMA_64x64x32_F32E4M3E4M3_RS_TN<>, 64, 1, 1>("RS N64, 1 step, 1 group", 1);
  run<MMA_64x64x32_F32E4M3E4M3_RS_TN<>, 64, 2, 1>("RS N64, 2 steps, 1 group", 1);
  run<MMA_64x64x32_F32E4M3E4M3_RS_TN<>, 64, 4, 1>("RS N64, 4 steps, 1 group", 1);
  run<MMA_64x64x32_F32E4M3E4M3_RS_TN<>, 64, 2, 2>("RS N64, 2 steps, 2 groups", 1);
  run<MMA_64x64x32_F32E4M3E4M3_RS_TN<>, 64, 2, 4>("RS N64, 2 steps, 4 groups", 1);
  run<MMA_64x32x32_F32E4M3E4M3_RS_TN<>, 32, 2, 1>("RS N32, 2 steps, 1 group", 1);
  run<MMA_64x128x32_F32E4M3E4M3_RS_TN<>, 128, 2, 1>("RS N128, 2 steps, 1 group", 1);
  run<MMA_64x256x32_F32E4M3E4M3_RS_TN<>, 256, 2, 1>("RS N256, 2 steps, 1 group", 1);
  run<MMA_64x64x32_F32E4M3E4M3_SS_TN<>, 64, 2, 1>("SS N64, 2 steps, 1 group", 1);
  run<MMA_64x64x32_F32E4M3E4M3_SS_TN<>, 64, 6, 1>("SS N64, 6 steps, 1 group", 1);
  run<MMA_64x64x32_F32E4M3E4M3_RS_TN<>, 64, 2, 1>("RS N64, 2 steps, 1 group", 2);
  run<MMA_64x64x32_F32E4M3E4M3_SS_TN<>, 64, 6, 1>("SS N64, 6 steps, 1 group", 2);
  return 0;
}
