// The steps the FP8 seesaw kernels share (seesaw_fp8_kernel.cuh, two consumers;
// seesaw_fp8_three_kernel.cuh, two owners and a helper): a block's masked scores, its P in e4m3
// into the block's rope chunk and one consumer's P V pass over its m tiles; a segment's end rows
// and their out stores.
#pragma once

#include <cute/tensor.hpp>

#include "sm90/common.cuh"
#include "sm90/decode/few_rows/few_rows_kernel.cuh"  // the e4m3 fragment helpers
#include "sm90/decode/output.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"

namespace mla::sm90::seesaw {

// A masked block's scores (an m64n64 accumulator `s`, coordinates `c`): scaled where the thread's
// row `rule[slot]` attends key key0 + column, -inf where it does not, an attended -inf turned NaN
// (its row then turns NaN, contract section 1.2); their maxima into block_max.
template <typename Frag, typename Coords>
__device__ __forceinline__ void fp8_masked_scores(Frag& s, const Coords& c,
                                                  const tma::RowRule (&rule)[2], int key0,
                                                  float score_scale, float (&block_max)[2]) {
  CUTE_UNROLL
  for (int v = 0; v < cute::size(s); ++v) {
    const int slot = (v >> 1) & 1;
    float x = kNegInf;
    if (rule[slot].attends(key0 + cute::get<1>(c(v)))) {
      x = s(v) * score_scale;
      if (x == kNegInf) x = __int_as_float(0x7fffffff);
    }
    s(v) = x;
    block_max[slot] = fmaxf(block_max[slot], x);
  }
}

// One of the thread's two rows: its block max (block_max: the thread's own scores' largest)
// across the row's four lanes, times s_mul, against the running max m_in: the new max m_new, the
// factor a_new = exp2(m_in - m_use), and m_use (m_new, or 0 where no score of the row is finite
// yet, where a_new is 1) into block_max, the reference P is taken against (fp8_store_p).
__device__ __forceinline__ void fp8_new_max(float& block_max, float m_in, float s_mul, float& m_new,
                                            float& a_new) {
  block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
  block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
  block_max *= s_mul;
  m_new = fmaxf(m_in, block_max);
  const float m_use = m_new == kNegInf ? 0.0f : m_new;
  a_new = m_new == kNegInf ? 1.0f : tma::exp2_ftz(m_in - m_use);
  block_max = m_use;
}

// P' = 2^shift exp2(s s_mul - m) of the thread's two rows (m = max[slot]) added to row_sum, then
// stored as e4m3 into `p_bytes` (the block's rope chunk, 64 rows of 64 bytes): keys 16g + {2q,
// 2q + 1, 2q + 8, 2q + 9} of a row are k slots 16g + 4q .. + 3 (few_rows::fp8_p_slot), one 4-byte
// store per row and group of 16 keys, 16-byte units swizzled by (row >> 1) & 3.
template <typename Frag>
__device__ __forceinline__ void fp8_store_p(Frag& s, float s_mul, float shift,
                                            const float (&max)[2], float (&row_sum)[2],
                                            uint8_t* p_bytes, const int (&my_row)[2], int lane) {
  CUTE_UNROLL
  for (int v = 0; v < cute::size(s); ++v) {
    const int slot = (v >> 1) & 1;
    s(v) = tma::exp2_ftz(fmaf(s(v), s_mul, shift - max[slot]));
    row_sum[slot] += s(v);
  }
  // NOTE: the row sums' additions stay here (an empty asm on the sums): sunk past the callers' V
  // clean-up branch, they kept the 32 P values live across it (docs/perf-notes.md, Change 127).
  asm volatile("" : "+f"(row_sum[0]), "+f"(row_sum[1]));
  const int q = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = my_row[r];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int v0 = 4 * (2 * g) + 2 * r, v1 = 4 * (2 * g + 1) + 2 * r;
      const uint32_t word = static_cast<uint32_t>(tma::e4m3x2(s(v0), s(v1))) |
                            (static_cast<uint32_t>(tma::e4m3x2(s(v0 + 1), s(v1 + 1))) << 16);
      const uint32_t offset = row * 64 + ((g ^ ((row >> 1) & 3)) << 4) + 4 * q;
      *reinterpret_cast<uint32_t*>(p_bytes + offset) = word;
    }
  }
}

// One consumer's P V pass over kMTiles m tiles of 64 V columns (chunks chunk0 ..): O^T = a O^T +
// V^T P^T of the block in the stage at `stage_addr`, V^T from registers (load_fp8_v_fragment), P^T
// the B operand `p_frag`, each m tile's two k steps into the partial `t` and promoted into `o` with
// the factors a of the thread's 16 rows (`scale`: 64 floats, the block's). kAhead: each m tile's
// fragments load under the previous tile's GEMMs (two buffers); else after its wait (one).
// kFactorsAhead: the factors load once, under the first tile's GEMMs (16 registers); else after
// each tile's wait, where the promotion waits for them.
template <int kMTiles, bool kAhead, bool kFactorsAhead, typename Mma, typename FragA,
          typename FragB, typename Acc, typename AccO>
__device__ __forceinline__ void fp8_pv_pass(Mma& mma, FragA& a_frag, FragB& p_frag, Acc& t, AccO& o,
                                            uint32_t stage_addr, int chunk0, const float* scale,
                                            int warp, int lane) {
  using namespace cute;
  uint32_t frag[kAhead ? 2 : 1][2][4];  // [tile parity][k step][register]
  auto buf = [](int m) { return kAhead ? m & 1 : 0; };
  auto load = [&](int m) {
    few_rows::load_fp8_v_fragment(stage_addr, chunk0 + m, warp, lane, frag[buf(m)]);
  };
  auto issue = [&](int m) { few_rows::issue_fp8_pv(mma, a_frag, p_frag, t, frag[buf(m)]); };
  constexpr int kPairs = decltype(size(t))::value / 4;
  // Values 4j .. 4j + 3 are rows 8j + 2q (even values) and 8j + 2q + 1 (odd): one factor pair a
  // load.
  auto factors = [&](int j) {
    return *reinterpret_cast<const float2*>(&scale[8 * j + 2 * (lane & 3)]);
  };
  float2 ahead[kFactorsAhead ? kPairs : 1];
  load(0);
  issue(0);
  if constexpr (kFactorsAhead) {
    CUTE_UNROLL
    for (int j = 0; j < kPairs; ++j) ahead[j] = factors(j);
  }
  CUTE_UNROLL
  for (int m = 0; m < kMTiles; ++m) {
    if (kAhead && m + 1 < kMTiles) load(m + 1);
    warpgroup_wait<0>();
    warpgroup_fence_operand(t);
    CUTE_UNROLL
    for (int j = 0; j < kPairs; ++j) {
      const float2 f = kFactorsAhead ? ahead[j] : factors(j);
      CUTE_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * j + e;
        o(i, m, 0) = fmaf(e & 1 ? f.y : f.x, o(i, m, 0), t(i));
      }
    }
    if (m + 1 < kMTiles) {
      if (!kAhead) load(m + 1);
      issue(m + 1);
    }
  }
  warpgroup_fence_operand(o);
}

// Row r of segment w's tile at its end: a whole request's row finished into out and lse
// (finish_row), or the partial row's max and sum written; its target in out or partial_o (rows of
// kL values) and the scale of its O. The row's running max `m2` is in base-2 units, its sum
// `p_sum` one of P' = p_unscale^-1 exp2(s - m2) (fp8_store_p), and `nan` says some O^T value of
// the row is not finite (the sum then turns NaN, so that the row does). A padding row (`valid`
// false): offset -1, scale 0.
template <int kL>
__device__ __forceinline__ RowTarget fp8_finish_segment_row(const DecodeKernelParams& p,
                                                            const tma::TileWork& w, bool whole,
                                                            int64_t partial_row0, int r, bool valid,
                                                            float m2, float p_sum, float p_unscale,
                                                            bool nan) {
  float z = p_sum * p_unscale;
  if (nan) z = __int_as_float(0x7fffffff);
  const float m = m2 == kNegInf ? kNegInf : m2 * 0.6931471805599453f;  // natural-log units
  int64_t offset = -1;
  float scale = 0.0f;
  if (valid) {
    if (whole) {
      const RowTarget t = finish_row(p, w.row0 + r, w.token0, m, z);
      offset = t.offset;
      scale = t.scale;
    } else {
      p.partial_max[partial_row0 + r] = m;
      p.partial_sum[partial_row0 + r] = z;
      offset = (partial_row0 + r) * kL;
      scale = z != 0.0f ? __fdiv_rn(bmm2_scale_of(p), z) : 0.0f;
    }
  }
  return RowTarget{offset, scale};
}

// A segment's e4m3 query tile into `smem.q` (64-byte swizzle; padding rows 0) and its rows' NaN
// flags cleared, by the kThreads consumer threads (`ctid`): with `query_tma`, the boxes through
// `q_map` (kAsk: consumer thread 0 asks for them here; else the caller has) and a wait for them
// on smem.q_full (phase `q_phase`, flipped), else the consumers' loads (`sync`: their barrier;
// fenced for the GEMMs). The caller syncs the consumers after it.
template <int kThreads, bool kAsk, typename Plan, typename Sync>
__device__ __forceinline__ void fp8_segment_query_tile(const DecodeKernelParams& p,
                                                       const tma::TileWork& w, int tile_rows,
                                                       Plan& smem, int ctid, bool query_tma,
                                                       const CUtensorMap* q_map, uint32_t& q_phase,
                                                       Sync sync) {
  constexpr int kRows = tma::kTileRows;
  constexpr int kChunkCols = 64, kChunks = 576 / kChunkCols;  // the e4m3 tile's 64-byte chunks
  if (query_tma) {
    if (kAsk && ctid == 0) {
      tma::issue_query_tile<kChunks, kChunkCols, 1>(p, w, q_map, &smem.q_full, smem.q);
    }
    if (ctid < kRows) smem.row_nan[ctid] = 0;
    tma::mbar_wait(&smem.q_full, q_phase);
    q_phase ^= 1;
  } else {
    tma::load_query_tile_rows<kRows, kThreads, void, true>(
        p, w, tile_rows, reinterpret_cast<uint8_t*>(smem.q), smem.query_row, ctid, sync, [&] {
          if (ctid < kRows) smem.row_nan[ctid] = 0;
        });
    tma::fence_proxy_async_smem();
  }
}

// O^T values x, y of V columns d and d + 1 of one row (at `o` in `base`, out or partial_o) times
// f in the out type: one 4-byte store (`words`), else two 2-byte ones, the second only where
// d + 1 < cols; a row whose f is 0 gets zeros.
__device__ __forceinline__ void fp8_store_o_pair(const DecodeKernelParams& p, uint16_t* base,
                                                 int64_t o, int d, int cols, bool words, float f,
                                                 float x, float y) {
  const uint32_t word = pack_out(p, f != 0.0f ? x * f : 0.0f, f != 0.0f ? y * f : 0.0f);
  if (words) {
    *reinterpret_cast<uint32_t*>(base + o + d) = word;
  } else {
    base[o + d] = static_cast<uint16_t>(word & 0xffffu);
    if (d + 1 < cols) base[o + d + 1] = static_cast<uint16_t>(word >> 16);
  }
}

// One thread's O^T values (an accumulator of kMTiles m64nN tiles, `acc`) to their rows, in the
// out type: the pairs (v, v | 2), V columns d and d + 1, whose row slot (o_slot of v % 32) is one
// of the kSlots from slot0, each row at element offset row_out[s] of `base` (out or partial_o;
// negative: a padding row, not stored) times row_scale[s]. `d0`: the thread's first V column
// (value 0 of m tile 0, col0 + fp8_o_row of its accumulator row); m tile m's are 64 m further on.
// A warp whose rows are all real with non-zero scales and whose columns are all stored, as 4-byte
// words, takes the short form: each row's address once, then a multiply a value, one conversion
// and one store a pair at a fixed offset (the segment's end runs once a segment, so its
// instruction count is most of its time: docs/perf-notes.md, Change 119). Any other warp keeps
// fp8_store_o_pair's tests a pair.
template <int kSlots, typename AccO>
__device__ __forceinline__ void fp8_store_o_rows(const DecodeKernelParams& p, uint16_t* base,
                                                 int cols, bool words, int d0, int slot0,
                                                 const int64_t (&row_out)[kSlots],
                                                 const float (&row_scale)[kSlots],
                                                 const AccO& acc) {
  constexpr int kValues = decltype(cute::size(acc))::value;
  constexpr int kMTiles = kValues / 32;
  static_assert(kValues == 32 * kMTiles, "m64nN accumulator tiles, 32 values a thread each");
  auto slot_of = [](int v) { return ((v % 32) & 1) | (((v % 32) >> 2) << 1); };
  bool plain = words && d0 + 64 * (kMTiles - 1) + 1 < cols;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) plain = plain && row_out[s] >= 0 && row_scale[s] != 0.0f;
  if (__all_sync(0xffffffffu, plain)) {
    uint16_t* row[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) row[s] = base + row_out[s] + d0;
    auto store = [&](auto fp16) {
      CUTE_UNROLL
      for (int v = 0; v < kValues; ++v) {
        const int s = slot_of(v) - slot0;
        if ((v & 2) || s < 0 || s >= kSlots) continue;
        const float x = acc(v) * row_scale[s], y = acc(v | 2) * row_scale[s];
        uint32_t word;
        if constexpr (decltype(fp16)::value) {
          const __half2 h = __floats2half2_rn(x, y);
          word = *reinterpret_cast<const uint32_t*>(&h);
        } else {
          const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
          word = *reinterpret_cast<const uint32_t*>(&h);
        }
        *reinterpret_cast<uint32_t*>(row[s] + 64 * (v / 32)) = word;
      }
    };
    if (p.out_fp16) {
      store(std::true_type{});
    } else {
      store(std::false_type{});
    }
    return;
  }
  CUTE_UNROLL
  for (int v = 0; v < kValues; ++v) {
    const int s = slot_of(v) - slot0;
    if ((v & 2) || s < 0 || s >= kSlots) continue;
    const int d = d0 + 64 * (v / 32);
    const int64_t o = row_out[s];
    if (o < 0 || d >= cols) continue;
    fp8_store_o_pair(p, base, o, d, cols, words, row_scale[s], acc(v), acc(v | 2));
  }
}

}  // namespace mla::sm90::seesaw
