// v1 split-KV decode kernel: TMA-fed, warp-specialized, wgmma (Hopper).
//
// Grid mapping: blockIdx.x = tile of 64 query rows of one request (row = token * H + head; rows
// past the request's n_b * H are zero padding), blockIdx.y = request b, blockIdx.z = split s.
// The tile's attended extent (causal: the position of its last token + 1; custom mask: seq_len)
// is cut into 64-key blocks and split s takes the s-th of num_splits equal runs (possibly none).
// Like v0 it writes the split's unnormalized partial (acc, max, sum) of each row; v0's combine
// kernel merges the splits.
//
// Warpgroup roles (384 threads):
//   WG0 producer: one thread loads each K block (64 keys x 576) through the kv_cache tensor map
//     into a 2-stage ring (full/empty mbarriers), one box per (page, 64-column chunk).
//   WG1, WG2 consumers: consumer c scores keys [32c, 32c + 32) of the block (S = Q K^T), the two
//     exchange row maxima, each keeps its own row sums, writes its half of P (16-bit), and
//     accumulates columns [256c, 256c + 256) of O += P V over all 64 keys.
// Longer rationale: docs/sm90-v1.md.
#pragma once

#include <cute/tensor.hpp>

#include "sm90/common.cuh"
#include "sm90/decode/v1/kv_pipeline.cuh"
#include "sm90/decode/v1/ptx.cuh"
#include "sm90/decode/v1/traits.h"

namespace mla::sm90::v1 {

template <Elem E>
__global__ void __launch_bounds__(SplitKvTraits<E>::kThreads, 1)
    split_kv_kernel(const __grid_constant__ DecodeKernelParams p,
                    const __grid_constant__ CUtensorMap kv_map) {
  using namespace cute;
  using Traits = SplitKvTraits<E>;
  using T = typename Traits::T;
  using Plan = typename Traits::SharedMemoryPlan;
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys, kD = Traits::kD;

  extern __shared__ uint8_t smem_raw[];
  Plan& smem = *reinterpret_cast<Plan*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                        ~static_cast<uintptr_t>(1023));

  pdl_wait();  // inputs may come from the previous grid in the stream
  pdl_launch_dependents();

  const TileWork w = resolve_tile(p);
  if (w.row0 >= w.rows) return;  // a tile past this request's rows
  const int64_t partial_row0 =
      (static_cast<int64_t>(blockIdx.z) * p.num_tokens + w.token0) * p.num_heads + w.row0;
  const int tile_rows = min(kRows, w.rows - w.row0);

  if (w.block_begin >= w.block_end) {  // an empty split: max -inf, sum 0 (acc is not read)
    if (threadIdx.x < tile_rows) {
      p.partial_max[partial_row0 + threadIdx.x] = kNegInf;
      p.partial_sum[partial_row0 + threadIdx.x] = 0.0f;
    }
    return;
  }

  if (threadIdx.x == 0) {
    for (int s = 0; s < Traits::kStages; ++s) {
      mbar_init(&smem.full[s], 1);
      mbar_init(&smem.empty[s], Traits::kConsumerThreads / 32);
    }
    fence_mbar_init();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---- producer warpgroup ----
    regs_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&kv_map);
      produce_blocks<Traits>(p, w, &kv_map, smem);
    }
    return;
  }

  // ---- consumer warpgroups ----
  regs_alloc<Traits::kConsumerRegs>();
  const int cw = wg - 1;                    // consumer index
  const int ctid = threadIdx.x - 128;       // 0..255 over both consumers
  const int wtid = threadIdx.x - 128 * wg;  // 0..127 within the warpgroup
  const int lane = threadIdx.x & 31;

  // Query tile into shared memory (16-byte vectors; padding rows 0).
  {
    const auto* q = static_cast<const uint4*>(p.query);
    constexpr int kVecs = kD / 8;  // per row
    for (int e = ctid; e < kRows * kVecs; e += Traits::kConsumerThreads) {
      const int r = e / kVecs, v = e - r * kVecs;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (r < tile_rows) {
        const int row = w.row0 + r;
        const int i = row / p.num_heads, h = row - i * p.num_heads;
        const int t = p.cum_seq_lens_q != nullptr ? w.token0 + i : i;
        const int64_t elem = w.b * p.q_batch + t * p.q_token + h * p.q_head + v * 8;
        value = __ldg(q + elem / 8);
      }
      *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(smem.q) +
                                swizzled_offset(r, v * 8, kRows)) = value;
    }
    fence_proxy_async_smem();
    named_barrier_sync(static_cast<uint32_t>(NamedBarrier::kConsumers), Traits::kConsumerThreads);
  }

  typename Traits::TiledMmaQk mma_qk;
  typename Traits::TiledMmaPv mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(wtid);
  auto thr_pv = mma_pv.get_thread_slice(wtid);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
  Tensor sP = make_tensor(make_smem_ptr(smem.p), typename Traits::SmemLayoutP{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 36) descriptors
  Tensor tOrP = thr_pv.partition_fragment_A(sP);  // (MMA, 1, 4)

  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<Traits::kKeysPerWg>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kRows>, Int<Traits::kColsPerWg>>{});
  Tensor tScS =
      thr_qk.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<Traits::kKeysPerWg>>{}));
  Tensor tOcO =
      thr_pv.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<Traits::kColsPerWg>>{}));
  static_assert(size(decltype(tSrS){}) == 16 && size(decltype(tOrO){}) == 128, "GMMA fragments");
  clear(tOrO);

  // Each thread holds two rows of S and O: slot 0 = tScS(0)'s row, slot 1 = 8 rows below.
  int my_row[2];
  my_row[0] = get<0>(tScS(0));
  my_row[1] = get<0>(tScS(2));
  RowRule rule[2];
  bool row_valid[2];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int r = my_row[s];
    row_valid[s] = r < tile_rows;
    const int i = (w.row0 + r) / p.num_heads;  // token of the row
    rule[s].first_query = w.seq_len - w.n;
    rule[s].mask = nullptr;
    if (!row_valid[s]) {
      rule[s].limit = 0;
    } else if (p.mask != nullptr) {
      rule[s].limit = w.seq_len;
      const int t = p.cum_seq_lens_q != nullptr ? w.token0 + i : i;
      rule[s].mask = p.mask + w.b * p.mask_batch + t * p.mask_token;
    } else {
      rule[s].limit = max(0, w.seq_len - w.n + i + 1);
    }
  }

  const float bmm1_scale = p.bmm1_scale_ptr != nullptr ? *p.bmm1_scale_ptr : p.bmm1_scale;
  const float score_scale = bmm1_scale * 1.4426950408889634f;  // log2(e): scores in base 2
  const bool skip_softmax = p.skip_softmax_factor > 0.0f && w.seq_len > 0;
  const float skip_threshold =
      skip_softmax ? __fdiv_rn(p.skip_softmax_factor, static_cast<float>(w.seq_len)) : 0.0f;

  float row_max[2] = {kNegInf, kNegInf};  // running max, base-2 units
  float row_sum[2] = {0.0f, 0.0f};        // this thread's share of sum exp2(s - row_max)

  for (int block = w.block_begin, it = 0; block < w.block_end; ++block, ++it) {
    const int stage = it % Traits::kStages;
    const uint32_t phase = (it / Traits::kStages) & 1;
    const int key0 = block * kKeys;
    T* k_stage = smem.k[stage];
    mbar_wait(&smem.full[stage], phase);

    // ---- qk_gemm: S = Q K^T over this consumer's 32 keys ----
    {
      Tensor sK = make_tensor(make_smem_ptr(k_stage), typename Traits::SmemLayoutK{});
      Tensor sK_half = local_tile(sK, Shape<Int<Traits::kKeysPerWg>, Int<kD>>{}, make_coord(cw, 0));
      Tensor tSrK = thr_qk.partition_fragment_B(sK_half);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        cute::gemm(mma_qk, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
    }

    // ---- scale and mask; row max over this consumer's keys ----
    float block_max[2] = {kNegInf, kNegInf};
    CUTE_UNROLL
    for (int v = 0; v < size(tSrS); ++v) {
      const int slot = (v >> 1) & 1;
      const int j = key0 + cw * Traits::kKeysPerWg + get<1>(tScS(v));
      const float s = rule[slot].attends(j) ? tSrS(v) * score_scale : kNegInf;
      tSrS(v) = s;
      block_max[slot] = fmaxf(block_max[slot], s);
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 1));
      block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 2));
      if ((lane & 3) == 0) smem.block_max[it & 1][cw][my_row[s]] = block_max[s];
    }
    named_barrier_sync(static_cast<uint32_t>(NamedBarrier::kConsumers), Traits::kConsumerThreads);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      block_max[s] = fmaxf(block_max[s], smem.block_max[it & 1][cw ^ 1][my_row[s]]);
    }

    // ---- skip-softmax: the block is dropped when every row of the tile votes negligible ----
    if (skip_softmax) {
      bool negligible = true;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        negligible =
            negligible && (!row_valid[s] || exp2f(block_max[s] - row_max[s]) < skip_threshold);
      }
      // Both consumers see the same maxima of all 64 rows, so they decide alike.
      const uint32_t vote_id =
          static_cast<uint32_t>(cw == 0 ? NamedBarrier::kVoteFirst : NamedBarrier::kVoteSecond);
      if (named_barrier_and(vote_id, 128, negligible)) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&smem.empty[stage]);
        continue;
      }
    }

    // ---- online_softmax: new max, rescale O, P = exp2(S - max) ----
    float rescale[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float m_new = fmaxf(row_max[s], block_max[s]);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // no finite score yet: P = 0
      rescale[s] = exp2f(row_max[s] - m_use);
      row_max[s] = m_new;
      block_max[s] = m_use;
      row_sum[s] *= rescale[s];
    }
    CUTE_UNROLL
    for (int v = 0; v < size(tSrS); ++v) {
      const int slot = (v >> 1) & 1;
      const float e = exp2f(tSrS(v) - block_max[slot]);
      tSrS(v) = e;
      row_sum[slot] += e;
    }
    CUTE_UNROLL
    for (int v = 0; v < size(tOrO); ++v) tOrO(v) *= rescale[(v >> 1) & 1];

    // ---- P half into shared memory (16-bit); zero V rows of keys past the extent ----
    {
      // NOTE: rounding P to 16 bits moves out by up to half an ulp of P times sum_j p_j |v_j| / Z,
      // which dominates where the terms cancel (docs/sm90-v1.md, Precision).
      uint8_t* p_bytes = reinterpret_cast<uint8_t*>(smem.p);
      CUTE_UNROLL
      for (int v = 0; v < size(tSrS); v += 2) {
        const int r = get<0>(tScS(v));
        const int c = cw * Traits::kKeysPerWg + get<1>(tScS(v));
        const uint32_t offset = swizzled_offset(r, c, kRows);
        T pair[2] = {T(tSrS(v)), T(tSrS(v + 1))};
        *reinterpret_cast<uint32_t*>(p_bytes + offset) = *reinterpret_cast<const uint32_t*>(pair);
      }
      // NOTE: TMA loads whole boxes and skips pages past the extent; those rows may hold NaN
      // (poisoned cache, stale stage), and P = 0 times NaN is NaN.
      const int valid = min(kKeys, w.extent - key0);
      if (valid < kKeys) {
        uint8_t* k_bytes = reinterpret_cast<uint8_t*>(k_stage);
        constexpr int kVChunks = Traits::kL / Traits::kChunkCols;  // 8 chunks hold V
        const int n = (kKeys - valid) * kVChunks * 8;              // 16-byte pieces
        for (int e = ctid; e < n; e += Traits::kConsumerThreads) {
          const int piece = e & 7, rest = e >> 3;
          const int chunk = rest % kVChunks, r = valid + rest / kVChunks;
          *reinterpret_cast<uint4*>(k_bytes + chunk * kKeys * 128 + r * 128 + piece * 16) =
              make_uint4(0, 0, 0, 0);
        }
      }
      fence_proxy_async_smem();
    }
    named_barrier_sync(static_cast<uint32_t>(NamedBarrier::kConsumers), Traits::kConsumerThreads);

    // ---- pv_gemm: O[:, 256c : 256c + 256] += P V ----
    {
      Tensor sV = make_tensor(make_smem_ptr(k_stage), typename Traits::SmemLayoutV{});
      Tensor sV_half =
          local_tile(sV, Shape<Int<Traits::kColsPerWg>, Int<kKeys>>{}, make_coord(cw, 0));
      Tensor tOrV = thr_pv.partition_fragment_B(sV_half);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOrP); ++k) {
        cute::gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k), tOrO);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&smem.empty[stage]);  // the stage (K and V) is consumed
  }

  // ---- store_partials: max (natural log units), sum over both consumers, O half ----
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 1);
    row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 2);
    if (cw == 1 && (lane & 3) == 0) smem.row_sum[my_row[s]] = row_sum[s];
  }
  named_barrier_sync(static_cast<uint32_t>(NamedBarrier::kConsumers), Traits::kConsumerThreads);
  if (cw == 0 && (lane & 3) == 0) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      if (row_valid[s]) {
        const int64_t row = partial_row0 + my_row[s];
        p.partial_max[row] = row_max[s] == kNegInf ? kNegInf : row_max[s] * 0.6931471805599453f;
        p.partial_sum[row] = row_sum[s] + smem.row_sum[my_row[s]];
      }
    }
  }
  CUTE_UNROLL
  for (int v = 0; v < size(tOrO); v += 2) {
    const int r = get<0>(tOcO(v));
    if (r < tile_rows) {
      const int c = cw * Traits::kColsPerWg + get<1>(tOcO(v));
      *reinterpret_cast<float2*>(&p.partial_acc[(partial_row0 + r) * Traits::kL + c]) =
          make_float2(tOrO(v), tOrO(v + 1));
    }
  }
}

template <Elem E>
cudaError_t launch_split_kv(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                            int num_tiles, cudaStream_t stream, bool pdl) {
  using Traits = SplitKvTraits<E>;
  constexpr size_t smem = Traits::kSmemBytes;
  auto* kernel = &split_kv_kernel<E>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(num_tiles, params.batch, params.num_splits);
  return launch(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, params, kv_map);
}

}  // namespace mla::sm90::v1
