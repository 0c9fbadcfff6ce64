// The order of a sparse call's tokens (params.h, sparse_order): by decreasing counted blocks.
//
// A sparse call of one split per token runs one CTA per (token, tile) for the token's counted
// entries, which vary with sparse_topk_lens and the causal bound. Where those CTAs are more than
// one wave, the hardware starts them in grid order as SMs free up: in token order, a long token
// late in the grid is the tail of the call. Started longest first (the LPT rule), the last CTAs to
// start are the shortest, and the wave ends evenly (docs/sm90-sparse.md, Varied lens).
//
// One CTA: a counting sort of the tokens by counted blocks (capped at kBuckets - 1), in two passes
// over the tokens; the order within a bucket is the atomics' (any permutation gives the same
// results: each token's rows are its own).
#include "sm90/common.cuh"
#include "sm90/decode/schedule/launch.h"
#include "sm90/decode/tma/kv_pipeline.cuh"

namespace mla::sm90::schedule {
namespace {

constexpr int kThreads = 1024;
constexpr int kBuckets = 256;  // counted blocks 0 .. 254, and 255 for more

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
  for (int t = threadIdx.x; t < p.num_tokens; t += kThreads) atomicAdd(&count[bucket_of(p, t)], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int k = 0; k < kBuckets; ++k) {
      next[k] = sum;
      sum += count[k];
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < p.num_tokens; t += kThreads) {
    order[atomicAdd(&next[bucket_of(p, t)], 1)] = t;
  }
}

}  // namespace

cudaError_t launch_sparse_order(const DecodeKernelParams& params, int32_t* order,
                                cudaStream_t stream, bool pdl) {
  return launch(&sparse_order_kernel, dim3(1), dim3(kThreads), 0, stream, pdl, params, order);
}

}  // namespace mla::sm90::schedule
