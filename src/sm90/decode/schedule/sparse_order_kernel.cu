// The order of a sparse call's tokens (params.h, sparse_order): by decreasing counted blocks.
//
// A sparse call of one split per token runs one CTA per (token, tile) for the token's counted
// entries, which vary with sparse_topk_lens and the causal bound. Where those CTAs are more than
// one wave, the hardware starts them in grid order as SMs free up: in token order, a long token
// late in the grid is the tail of the call. Started longest first (the LPT rule), the last CTAs to
// start are the shortest, and the wave ends evenly (docs/sm90-sparse.md, Varied lens).
//
// One CTA: a counting sort of the tokens by counted blocks (capped at kBuckets - 1), in two passes
// over the tokens with warp 0's prefix sums between them; the order within a bucket is the
// atomics' (any permutation gives the same results: each token's rows are its own).
#include "sm90/common.cuh"
#include "sm90/decode/schedule/launch.h"
#include "sm90/decode/tma/kv_pipeline.cuh"

namespace mla::sm90::schedule {
namespace {

constexpr int kThreads = 1024;
constexpr int kBuckets = 256;  // counted blocks 0 .. 254, and 255 for more
constexpr int kKept = 4;       // tokens a thread keeps the bucket of between the passes
static_assert(kBuckets % 32 == 0, "the prefix sums' lanes");

// Token t's bucket: 0 for the most counted blocks.
__device__ __forceinline__ int bucket_of(const DecodeKernelParams& p, int t) {
  tma::TileWork w;
  tma::resolve_sparse_token(p, t, w);
  const int blocks = (w.extent + kBlockKeys - 1) / kBlockKeys;
  return kBuckets - 1 - min(blocks, kBuckets - 1);
}

__global__ void __launch_bounds__(kThreads)
    sparse_order_kernel(const __grid_constant__ DecodeKernelParams p, int32_t* order) {
  __shared__ int count[kBuckets];
  __shared__ int next[kBuckets];
  for (int k = threadIdx.x; k < kBuckets; k += kThreads) count[k] = 0;
  __syncthreads();
  pdl_wait();               // seq_lens and sparse_topk_lens may come from the previous grid
  pdl_launch_dependents();  // the decode grid's own wait still waits for this grid to finish
  // The buckets of this thread's first kKept tokens stay in registers for the second pass (their
  // loads issued together); tokens past kKept x kThreads are resolved again there.
  int kept[kKept];
#pragma unroll
  for (int j = 0; j < kKept; ++j) {
    const int t = threadIdx.x + j * kThreads;
    kept[j] = t < p.num_tokens ? bucket_of(p, t) : 0;
  }
#pragma unroll
  for (int j = 0; j < kKept; ++j) {
    if (threadIdx.x + j * kThreads < p.num_tokens) atomicAdd(&count[kept[j]], 1);
  }
  for (int t = threadIdx.x + kKept * kThreads; t < p.num_tokens; t += kThreads) {
    atomicAdd(&count[bucket_of(p, t)], 1);
  }
  __syncthreads();
  // Exclusive prefix sums of the counts: warp 0, kBuckets / 32 consecutive buckets a lane.
  if (threadIdx.x < 32) {
    constexpr int kPerLane = kBuckets / 32;
    const int lane = threadIdx.x;
    int c[kPerLane];
    int sum = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      c[k] = count[kPerLane * lane + k];
      sum += c[k];
    }
    int inclusive = sum;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    int run = inclusive - sum;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      next[kPerLane * lane + k] = run;
      run += c[k];
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kKept; ++j) {
    const int t = threadIdx.x + j * kThreads;
    if (t < p.num_tokens) order[atomicAdd(&next[kept[j]], 1)] = t;
  }
  for (int t = threadIdx.x + kKept * kThreads; t < p.num_tokens; t += kThreads) {
    order[atomicAdd(&next[bucket_of(p, t)], 1)] = t;
  }
}

}  // namespace

cudaError_t launch_sparse_order(const DecodeKernelParams& params, int32_t* order,
                                cudaStream_t stream, bool pdl) {
  return launch(&sparse_order_kernel, dim3(1), dim3(kThreads), 0, stream, pdl, params, order);
}

}  // namespace mla::sm90::schedule
