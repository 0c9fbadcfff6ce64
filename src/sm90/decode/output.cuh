// Writing out and lse: the normalization of one query row, shared by the combine kernel and the
// decode kernels that finish a row themselves (a request of one segment or one split).
//
// With m the row's max (natural log units; -inf: no key) and z its sum of exp(s - m):
//   out = bmm2_scale * acc / (z + exp(sink_h - m)),  lse = m + log(z)
// and a row without a key (z = 0) gets out = 0, lse = -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "sm90/common.cuh"

namespace mla::sm90 {

struct RowOutput {
  float scale;  // what acc is multiplied by; 0 for a row without a key
  float lse;
};

// The same with the call's bmm2 scale and the head's sink logit (-inf: none) already read.
__device__ __forceinline__ RowOutput row_output(float bmm2_scale, float sink, float m, float z) {
  RowOutput r{0.0f, kNegInf};
  if (z == 0.0f) return r;
  float denom = z;
  if (sink != kNegInf) denom += expf(sink - m);
  r.scale = __fdiv_rn(bmm2_scale, denom);
  r.lse = m + logf(z);
  // A non-finite bmm2_scale turns the row NaN, out and lse alike (contract section 1).
  if (!isfinite(bmm2_scale)) r.scale = r.lse = __int_as_float(0x7fffffff);
  return r;
}

// bmm1_scale, NaN where it is not finite: every attended score is then NaN and the rows that
// attend a key turn NaN, while rows without a key stay empty (contract section 1).
__device__ __forceinline__ float bmm1_scale_of(const DecodeKernelParams& p) {
  const float s = p.bmm1_scale_ptr != nullptr ? *p.bmm1_scale_ptr : p.bmm1_scale;
  return isfinite(s) ? s : __int_as_float(0x7fffffff);
}
__device__ __forceinline__ float bmm2_scale_of(const DecodeKernelParams& p) {
  return p.bmm2_scale_ptr != nullptr ? *p.bmm2_scale_ptr : p.bmm2_scale;
}
__device__ __forceinline__ float sink_of(const DecodeKernelParams& p, int h) {
  if (p.sinks == nullptr) return kNegInf;
  const int64_t i = h * p.sinks_stride;
  if (p.sinks_elem == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p.sinks)[i]);
  if (p.sinks_elem == 2) return __half2float(static_cast<const __half*>(p.sinks)[i]);
  return static_cast<const float*>(p.sinks)[i];
}

__device__ __forceinline__ RowOutput row_output(const DecodeKernelParams& p, int h, float m,
                                                float z) {
  return row_output(bmm2_scale_of(p), sink_of(p, h), m, z);
}

// Element offsets of (global token t, head h) in out and lse: dense tensors index (t / q_len,
// t % q_len); ragged ones the token itself (batch stride 0).
__device__ __forceinline__ void token_coords(const DecodeKernelParams& p, int t, int& b, int& i) {
  if (p.cum_seq_lens_q != nullptr) {
    b = 0;
    i = t;
  } else {
    b = t / p.q_len;
    i = t - b * p.q_len;
  }
}
__device__ __forceinline__ int64_t out_offset(const DecodeKernelParams& p, int t, int h) {
  int b, i;
  token_coords(p, t, b, i);
  return b * p.out_batch + i * p.out_token + h * p.out_head;
}
__device__ __forceinline__ int64_t lse_offset(const DecodeKernelParams& p, int t, int h) {
  int b, i;
  token_coords(p, t, b, i);
  return b * p.lse_batch + i * p.lse_token + h * p.lse_head;
}

// Two out values rounded to nearest in the call's out type (p.out_fp16), as one 32-bit word.
__device__ __forceinline__ uint32_t pack_out(const DecodeKernelParams& p, float a, float b) {
  uint32_t word;
  if (p.out_fp16) {
    const __half2 v = __floats2half2_rn(a, b);
    word = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    word = *reinterpret_cast<const uint32_t*>(&v);
  }
  return word;
}

// Stores 4 consecutive out values (two packed words) at element offset o, a multiple of 4: one
// 8-byte store where out's address and strides allow it (p.out_vec8), else four 2-byte stores.
__device__ __forceinline__ void store_out4(const DecodeKernelParams& p, int64_t o,
                                           const uint2& words) {
  auto* base = static_cast<uint16_t*>(p.out);
  if (p.out_vec8) {
    *reinterpret_cast<uint2*>(base + o) = words;
    return;
  }
  base[o + 0] = static_cast<uint16_t>(words.x & 0xffffu);
  base[o + 1] = static_cast<uint16_t>(words.x >> 16);
  base[o + 2] = static_cast<uint16_t>(words.y & 0xffffu);
  base[o + 3] = static_cast<uint16_t>(words.y >> 16);
}

// Stores 8 consecutive out values (four packed words) at element offset o, a multiple of 8: one
// 16-byte store where out's address and strides allow it (p.out_vec16), else eight 2-byte stores.
// NOTE: no 8-byte tier (the combine's row kernel adds its own, through store_out4): with one in
// here, the decode kernels' out staging (this path only for an out not 16-byte aligned) changed
// the seesaw kernel's register allocation and ran 0.5 to 0.7% slower on aligned outs
// (docs/perf-notes.md, "One store_out8 for every kernel, measured").
__device__ __forceinline__ void store_out8(const DecodeKernelParams& p, int64_t o,
                                           const uint4& words) {
  auto* base = static_cast<uint16_t*>(p.out);
  if (p.out_vec16) {
    *reinterpret_cast<uint4*>(base + o) = words;
    return;
  }
  const uint32_t w[4] = {words.x, words.y, words.z, words.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    base[o + 2 * k] = static_cast<uint16_t>(w[k] & 0xffffu);
    base[o + 2 * k + 1] = static_cast<uint16_t>(w[k] >> 16);
  }
}

// Global token t and head h of query row `row` (token * H + head) of a request whose first token
// is token0; false for a token outside [0, T) (inconsistent cum_seq_lens_q: nothing is written).
__device__ __forceinline__ bool row_token(const DecodeKernelParams& p, int row, int token0, int& t,
                                          int& h) {
  const int i = row / p.num_heads;
  h = row - i * p.num_heads;
  t = token0 + i;
  return t >= 0 && t < p.num_tokens;
}

// A row a decode kernel finishes itself (its only split): writes its lse and returns where its out
// row starts (-1: not written) and what its O is multiplied by. m in natural-log units.
struct RowTarget {
  int64_t offset;
  float scale;
};
__device__ __forceinline__ RowTarget finish_row(const DecodeKernelParams& p, int row, int token0,
                                                float m, float z) {
  int t, h;
  if (!row_token(p, row, token0, t, h)) return RowTarget{-1, 0.0f};
  const RowOutput r = row_output(p, h, m, z);
  if (p.lse != nullptr) p.lse[lse_offset(p, t, h)] = r.lse;
  return RowTarget{out_offset(p, t, h), r.scale};
}

// out 0 and lse -inf for query rows [row0, row0 + rows) of a request whose first token is token0
// (rows that attend no key); threads tid, tid + nthreads, ... of the caller share the stores.
__device__ __forceinline__ void store_empty_rows(const DecodeKernelParams& p, int row0, int rows,
                                                 int token0, int tid, int nthreads) {
  constexpr int kPieces = 512 / 8;  // 8-value pieces per row of out (L 512; fewer below)
  for (int e = tid; e < rows * kPieces; e += nthreads) {
    const int r = e / kPieces, piece = e - r * kPieces;
    if (piece * 8 >= p.kv_lora_rank) continue;
    int t, h;
    if (!row_token(p, row0 + r, token0, t, h)) continue;
    store_out8(p, out_offset(p, t, h) + piece * 8, make_uint4(0, 0, 0, 0));
    if (p.lse != nullptr && piece == 0) p.lse[lse_offset(p, t, h)] = kNegInf;
  }
}

}  // namespace mla::sm90
