// SIMT decode kernel: split-KV with fp32 math, for every call the TMA kernels do not take (sparse
// mode, fp8 and fp8_ds_mla caches, pages of fewer than 16 keys, unaligned strides).
//
// Grid mapping: blockIdx.x = query token t, blockIdx.y = group of up to 16 heads,
// blockIdx.z = split s. Each CTA derives its key range from seq_lens on the device: the token's
// attended extent is cut into 64-key blocks and split s takes the s-th of num_splits equal runs
// of blocks (possibly none). It writes the split's partial (max, sum, o = bmm2 acc / sum in the
// out type: params.h) of each head row; the combine kernel merges the splits.
// Longer rationale: docs/sm90-simt.md.
#pragma once

#include "sm90/common.cuh"
#include "sm90/decode/output.cuh"
#include "sm90/decode/simt/traits.h"

namespace mla::sm90::simt {

// One query token of one request, resolved on the device.
struct TokenInfo {
  int b;        // request
  int i;        // token within the request
  int t;        // row of per-token tensors: global token index
  int n;        // query tokens of the request
  int seq_len;  // seq_lens[b]
  int extent;   // keys (dense positions / sparse entries) [0, extent) may be attended
};

__device__ __forceinline__ TokenInfo resolve_token(const DecodeKernelParams& p, int t) {
  TokenInfo tok;
  tok.t = t;
  if (p.cum_seq_lens_q != nullptr) {
    const int lo = request_of_token(p, t);
    tok.b = lo;
    tok.i = t - p.cum_seq_lens_q[lo];
    tok.n = p.cum_seq_lens_q[lo + 1] - p.cum_seq_lens_q[lo];
  } else {
    tok.b = t / p.q_len;
    tok.i = t - tok.b * p.q_len;
    tok.n = p.q_len;
  }
  tok.seq_len = p.seq_lens[tok.b];
  if (p.top_k > 0) {
    tok.extent = p.top_k;
    if (p.topk_lens != nullptr) {
      // Per request: tl_token is 0. Per token: (b, i) dense, t ragged (batch stride 0).
      const int row = p.cum_seq_lens_q != nullptr ? tok.t : tok.i;
      tok.extent = min(tok.extent, p.topk_lens[tok.b * p.tl_batch + row * p.tl_token]);
    }
    // The causal bound: token i counts at most the seq_len - n + i + 1 entries it can see.
    tok.extent = max(0, min(tok.extent, tok.seq_len - tok.n + tok.i + 1));
  } else if (p.mask != nullptr) {
    tok.extent = tok.seq_len;
  } else {
    tok.extent = max(0, tok.seq_len - tok.n + tok.i + 1);  // causal: keys 0 .. position
  }
  return tok;
}

// Per-token tensors index rows by (b, t): t is the token within the request (dense) or the global
// token (ragged, batch stride 0).
__device__ __forceinline__ int64_t row_index(const DecodeKernelParams& p, const TokenInfo& tok,
                                             int64_t batch_stride, int64_t token_stride) {
  const int t = p.cum_seq_lens_q != nullptr ? tok.t : tok.i;
  return tok.b * batch_stride + t * token_stride;
}

// Element offset of the cache row of key `j` of the token, or -1 when j is not attended.
__device__ __forceinline__ long long key_row_offset(const DecodeKernelParams& p,
                                                    const TokenInfo& tok, int j) {
  if (j >= tok.extent) return -1;
  int64_t slot_page, slot_offset;
  if (p.top_k > 0) {
    const int32_t slot =
        p.sparse_indices[row_index(p, tok, p.si_batch, p.si_token) + static_cast<int64_t>(j)];
    if (slot < 0) return -1;  // -1: no key
    slot_page = slot >> p.page_shift;
    slot_offset = slot & (p.page_size - 1);
  } else {
    const int first_query_position = tok.seq_len - tok.n;
    if (p.mask != nullptr && j >= first_query_position) {
      const int bit = j - first_query_position;
      const uint8_t* row = p.mask + row_index(p, tok, p.mask_batch, p.mask_token);
      if (((row[bit >> 3] >> (bit & 7)) & 1) == 0) return -1;
    }
    slot_page = p.block_tables[tok.b * p.block_table_stride + (j >> p.page_shift)];
    slot_offset = j & (p.page_size - 1);
  }
  return slot_page * p.kv_page_stride + slot_offset * p.kv_row_stride;
}

template <Elem Q, Elem KV, int L, int R>
__global__ void __launch_bounds__(SimtTraits<L, R>::kThreads, 1)
    simt_kernel(const __grid_constant__ DecodeKernelParams p) {
  using Traits = SimtTraits<L, R>;
  using QT = ElemTraits<Q>;
  using KT = ElemTraits<KV>;
  constexpr int kD = Traits::kD, kL = Traits::kL, kHeads = Traits::kHeads, kKeys = Traits::kKeys;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<typename Traits::SharedMemoryPlan*>(smem_raw);

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int head0 = blockIdx.y * kHeads;
  const int num_heads = min(kHeads, p.num_heads - head0);  // heads of this CTA
  const int split = blockIdx.z;

  pdl_wait();  // inputs may come from the previous grid in the stream
  pdl_launch_dependents();

  const TokenInfo tok = resolve_token(p, blockIdx.x);
  const float bmm1_scale = bmm1_scale_of(p);

  // ---- this split's run of 64-key blocks ----
  const int num_blocks = (tok.extent + kKeys - 1) / kKeys;
  const int blocks_per_split = (num_blocks + p.num_splits - 1) / p.num_splits;
  const int block_begin = min(num_blocks, split * blocks_per_split);
  const int block_end = min(num_blocks, block_begin + blocks_per_split);

  // Skip-softmax threshold f / seq_len (sparse mode: the token's counted entries).
  const int skip_len = p.top_k > 0 ? tok.extent : tok.seq_len;
  const bool skip_softmax = p.skip_softmax_factor > 0.0f && skip_len > 0;
  const float skip_threshold =
      skip_softmax ? __fdiv_rn(p.skip_softmax_factor, static_cast<float>(skip_len)) : 0.0f;

  // ---- load the query rows (fp32; rows past num_heads are 0) ----
  {
    const auto* q = static_cast<const typename QT::Storage*>(p.query);
    const int64_t base = row_index(p, tok, p.q_batch, p.q_token);
    for (int e = tid; e < kHeads * kD; e += Traits::kThreads) {
      const int h = e / kD, d = e - h * kD;
      smem.q[h][d] = h < num_heads ? QT::load(q, base + (head0 + h) * p.q_head + d) : 0.0f;
    }
  }
  if (tid < kHeads) {
    smem.row_max[tid] = kNegInf;
    smem.row_sum[tid] = 0.0f;
  }
  float acc[kHeads][Traits::kColsPerThread];  // columns 2 * tid, 2 * tid + 1 of each head row
#pragma unroll
  for (int h = 0; h < kHeads; ++h) acc[h][0] = acc[h][1] = 0.0f;

  const auto* kv = static_cast<const typename KT::Storage*>(p.kv);
  for (int block = block_begin; block < block_end; ++block) {
    const int key0 = block * kKeys;
    __syncthreads();  // the previous block's k and p are consumed

    // ---- gather the block's key rows ----
    if (tid < kKeys) smem.row_offset[tid] = key_row_offset(p, tok, key0 + tid);
    __syncthreads();
    for (int e = tid; e < kKeys * kD; e += Traits::kThreads) {
      const int j = e / kD, d = e - j * kD;
      const long long row = smem.row_offset[j];
      smem.k[j][d] = row >= 0 ? load_key<KV>(kv, row, d) : 0.0f;
    }
    __syncthreads();

    // ---- qk: thread (key j, head quarter hq) scores heads hq, hq + 4, hq + 8, hq + 12 ----
    {
      const int j = tid % kKeys, hq = tid / kKeys;
      float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int d = 0; d < kD; d += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(&smem.k[j][d]);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float4 q4 = *reinterpret_cast<const float4*>(&smem.q[hq + 4 * u][d]);
          dot[u] = fmaf(q4.x, k4.x, dot[u]);
          dot[u] = fmaf(q4.y, k4.y, dot[u]);
          dot[u] = fmaf(q4.z, k4.z, dot[u]);
          dot[u] = fmaf(q4.w, k4.w, dot[u]);
        }
      }
      const bool attended = smem.row_offset[j] >= 0;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        // NOTE: an attended score of -inf comes from an infinite input: NaN, as the row must turn
        // (contract section 1).
        const float s = bmm1_scale * dot[u];
        smem.s[hq + 4 * u][j] = !attended ? kNegInf : s == kNegInf ? __int_as_float(0x7fffffff) : s;
      }
    }
    __syncthreads();

    // ---- online softmax: warp w owns head rows 2w and 2w + 1 ----
    float block_max[2], scores[2][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 2 * warp + r;
      scores[r][0] = smem.s[h][lane];
      scores[r][1] = smem.s[h][lane + 32];
      // NaN-propagating: a NaN score makes the row NaN, never an empty row.
      float m = fmax_nan(scores[r][0], scores[r][1]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
      block_max[r] = m;
      if (skip_softmax && lane == 0) {
        // Dropped only when exp(block_max - running_max) < f / seq_len for every head row.
        smem.negligible[h] = h >= num_heads || expf(m - smem.row_max[h]) < skip_threshold;
      }
    }
    if (skip_softmax) {
      __syncthreads();
      bool all_negligible = true;
      for (int h = 0; h < kHeads; ++h) all_negligible = all_negligible && smem.negligible[h];
      __syncthreads();  // every thread read the votes before the next block rewrites them
      if (all_negligible) continue;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 2 * warp + r;
      const float m_old = smem.row_max[h];
      const float m_new = fmax_nan(m_old, block_max[r]);
      float p0 = 0.0f, p1 = 0.0f, rescale = 1.0f;
      if (m_new != kNegInf) {  // some key so far has a finite score
        p0 = expf(scores[r][0] - m_new);
        p1 = expf(scores[r][1] - m_new);
        rescale = expf(m_old - m_new);  // 0 for the first block
      }
      float sum = p0 + p1;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      smem.p[lane][h] = p0;
      smem.p[lane + 32][h] = p1;
      __syncwarp();
      if (lane == 0) {
        smem.row_sum[h] = smem.row_sum[h] * rescale + sum;
        smem.row_max[h] = m_new;
        smem.rescale[h] = rescale;
      }
    }
    __syncthreads();

    // ---- pv: acc[h][c] = acc[h][c] * rescale[h] + sum_j p[j][h] * v[j][c] ----
    if (2 * tid < kL) {
      const int c = 2 * tid;
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        const float r = smem.rescale[h];
        acc[h][0] *= r;
        acc[h][1] *= r;
      }
      for (int j = 0; j < kKeys; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(&smem.k[j][c]);
#pragma unroll
        for (int h4 = 0; h4 < kHeads; h4 += 4) {
          const float4 w = *reinterpret_cast<const float4*>(&smem.p[j][h4]);
          acc[h4 + 0][0] = fmaf(w.x, v.x, acc[h4 + 0][0]);
          acc[h4 + 0][1] = fmaf(w.x, v.y, acc[h4 + 0][1]);
          acc[h4 + 1][0] = fmaf(w.y, v.x, acc[h4 + 1][0]);
          acc[h4 + 1][1] = fmaf(w.y, v.y, acc[h4 + 1][1]);
          acc[h4 + 2][0] = fmaf(w.z, v.x, acc[h4 + 2][0]);
          acc[h4 + 2][1] = fmaf(w.z, v.y, acc[h4 + 2][1]);
          acc[h4 + 3][0] = fmaf(w.w, v.x, acc[h4 + 3][0]);
          acc[h4 + 3][1] = fmaf(w.w, v.y, acc[h4 + 3][1]);
        }
      }
    }
  }
  __syncthreads();

  // ---- the call's only split (p.direct_out): out and lse, the combine's normalization ----
  if (p.direct_out) {
    if (tid < num_heads) {
      const RowOutput r = row_output(p, head0 + tid, smem.row_max[tid], smem.row_sum[tid]);
      if (p.lse != nullptr) p.lse[lse_offset(p, tok.t, head0 + tid)] = r.lse;
      smem.rescale[tid] = r.scale;  // the row's out scale (0: no key)
    }
    __syncthreads();
    auto* out = static_cast<uint16_t*>(p.out);
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      if (h < num_heads && 2 * tid < kL) {
        const float f = smem.rescale[h];
        const uint32_t word =
            pack_out(p, f != 0.0f ? acc[h][0] * f : 0.0f, f != 0.0f ? acc[h][1] * f : 0.0f);
        const int64_t o = out_offset(p, tok.t, head0 + h) + 2 * tid;
        out[o] = static_cast<uint16_t>(word & 0xffffu);
        out[o + 1] = static_cast<uint16_t>(word >> 16);
      }
    }
    return;
  }

  // ---- store the split's partials: max, sum and o = bmm2 acc / sum (params.h) ----
  // Other head dims run one split (route.cc): the combine's rows are 512 wide.
  if constexpr (L != 512 || R != 64) return;
  const int64_t row0 = (static_cast<int64_t>(split) * p.num_tokens + tok.t) * p.num_heads + head0;
  const float bmm2_scale = bmm2_scale_of(p);
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < num_heads) {
      const float sum = smem.row_sum[h];
      const float f = sum != 0.0f ? __fdiv_rn(bmm2_scale, sum) : 0.0f;
      *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.partial_o) + (row0 + h) * kL +
                                   2 * tid) =
          pack_out(p, f != 0.0f ? acc[h][0] * f : 0.0f, f != 0.0f ? acc[h][1] * f : 0.0f);
    }
  }
  if (tid < num_heads) {
    p.partial_max[row0 + tid] = smem.row_max[tid];
    p.partial_sum[row0 + tid] = smem.row_sum[tid];
  }
}

template <Elem Q, Elem KV, int L, int R>
cudaError_t launch_simt(const DecodeKernelParams& params, cudaStream_t stream, bool pdl) {
  using Traits = SimtTraits<L, R>;
  constexpr size_t smem = sizeof(typename Traits::SharedMemoryPlan);
  auto* kernel = &simt_kernel<Q, KV, L, R>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(params.num_tokens, (params.num_heads + Traits::kHeads - 1) / Traits::kHeads,
                  params.num_splits);
  return launch(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, params);
}

}  // namespace mla::sm90::simt
