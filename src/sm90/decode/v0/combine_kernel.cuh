// v0 combine kernel: merges the split partials of each (token, head) row into out and lse.
//
// Grid mapping: blockIdx.x = query token t, blockIdx.y = head h; 128 threads, 4 output columns
// each. With M = max over splits of the split max m_s (splits without keys excluded):
//   Z   = sum_s sum_s' * exp(m_s - M),  acc = sum_s acc_s * exp(m_s - M)
//   out = bmm2_scale * acc / (Z + exp(sink_h - M)),  lse = M + log(Z)
// and an empty row (no split saw a key) gets out = 0, lse = -inf.
#pragma once

#include "sm90/common.cuh"
#include "sm90/decode/v0/launch.h"

namespace mla::sm90::v0 {

inline constexpr int kCombineThreads = 128;

template <Elem Out>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const __grid_constant__ DecodeKernelParams p) {
  using OT = ElemTraits<Out>;
  constexpr int kL = 512;
  const int t = blockIdx.x, h = blockIdx.y;
  const int c = 4 * threadIdx.x;

  pdl_wait();  // the partials come from the split-KV grid
  pdl_launch_dependents();

  const int64_t stride = static_cast<int64_t>(p.num_tokens) * p.num_heads;  // between splits
  const int64_t row = static_cast<int64_t>(t) * p.num_heads + h;
  float m = kNegInf;
  for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, p.partial_max[s * stride + row]);

  float z = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (m != kNegInf) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float m_s = p.partial_max[s * stride + row];
      if (m_s == kNegInf) continue;  // an empty split: its acc holds nothing
      const float w = expf(m_s - m);
      z = fmaf(p.partial_sum[s * stride + row], w, z);
      const float4 a =
          *reinterpret_cast<const float4*>(&p.partial_acc[(s * stride + row) * kL + c]);
      acc.x = fmaf(a.x, w, acc.x);
      acc.y = fmaf(a.y, w, acc.y);
      acc.z = fmaf(a.z, w, acc.z);
      acc.w = fmaf(a.w, w, acc.w);
    }
  }

  // Where the row lives in out and lse: resolve (request, token within it) for the strides.
  int b, i;
  if (p.cum_seq_lens_q != nullptr) {
    b = 0;
    i = t;  // ragged tensors index rows by the global token; batch stride is 0
  } else {
    b = t / p.q_len;
    i = t - b * p.q_len;
  }
  const bool empty = z == 0.0f;
  float scale = 0.0f;
  if (!empty) {
    float denom = z;
    if (p.sinks != nullptr) denom += expf(p.sinks[h * p.sinks_stride] - m);
    const float bmm2_scale = p.bmm2_scale_ptr != nullptr ? *p.bmm2_scale_ptr : p.bmm2_scale;
    scale = __fdiv_rn(bmm2_scale, denom);
  } else {
    acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  auto* out = static_cast<typename OT::Storage*>(p.out);
  const int64_t o = b * p.out_batch + i * p.out_token + h * p.out_head + c;
  OT::store(out, o + 0, acc.x * scale);
  OT::store(out, o + 1, acc.y * scale);
  OT::store(out, o + 2, acc.z * scale);
  OT::store(out, o + 3, acc.w * scale);
  if (p.lse != nullptr && threadIdx.x == 0) {
    p.lse[b * p.lse_batch + i * p.lse_token + h * p.lse_head] = empty ? kNegInf : m + logf(z);
  }
}

template <Elem Out>
cudaError_t launch_combine(const DecodeKernelParams& params, cudaStream_t stream, bool pdl) {
  const dim3 grid(params.num_tokens, params.num_heads);
  return launch(&combine_kernel<Out>, grid, dim3(kCombineThreads), 0, stream, pdl, params);
}

}  // namespace mla::sm90::v0
