// Seesaw decode kernel on the FP8 tensor cores: an e4m3 query over an e4m3 cache, 64-row tiles of
// the balanced schedule (docs/sm90-fp8.md, "fp8 query and fp8 cache: the FP8 seesaw").
//
// Grid mapping: as the seesaw kernel's balanced schedule: blockIdx.x = tile of 64 query rows of a
// request, blockIdx.y = part of the plan's line (tma::PartCursor); one segment per request the part
// touches, its partial rows or, for a whole request, out and lse.
//
// Warpgroup roles (384 threads):
//   WG0 producer: the 16-bit kernels' chunk producer over e4m3 boxes (64-byte swizzle), a ring of
//     four 36 KB stages, block i into stage i % 4.
//   WG1, WG2 consumers: consumer c owns the blocks of parity c: S = Q K^T for all 64 rows (18 wgmma
//     m64n64k32, both operands in shared memory, three promoted partials), the row softmax against
//     the running max handed over by the other consumer, and P (e4m3, 2^8 exp2(S - m)) into the
//     block's rope chunk, which only S read. Consumer c also owns O^T for V columns 256c .. 256c +
//     255 (four m tiles of N = 64 rows) and applies every block's P V to it: O^T = a O^T + V^T P^T,
//     V^T from registers (few_rows::load_fp8_v_fragment), P^T from the rope chunk, each m tile's
//     partial promoted in fp32.
// Per round (m: the running max; max(m, x) without slack: P' = 2^8 exp2(s - m) <= 2^8 < 448):
//   c0: S0; m0 = max(m, rowmax S0), a0, P0 -> both;   O_L = a0 O_L + V0_L^T P0^T;  (waits for c1)
//       O_L = a1 O_L + V1_L^T P1^T
//   c1: S1;  (waits for c0) O_R = a0 O_R + V0_R^T P0^T;  m1 = max(m0, rowmax S1), a1, P1 -> both;
//       O_R = a1 O_R + V1_R^T P1^T
#pragma once

#include <cute/tensor.hpp>

#include <climits>
#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/few_rows/few_rows_kernel.cuh"  // the e4m3 fragment helpers
#include "sm90/decode/output.cuh"
#include "sm90/decode/tma/chunk_producer.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"

namespace mla::sm90::seesaw {

// Named barriers of the FP8 seesaw kernel (id 0 is __syncthreads).
enum class Fp8Barrier : uint32_t {
  kConsumers = 1,   // both consumer warpgroups (256 threads)
  kToSecond = 2,    // first -> second: P of the even block, its max and factor (256, arrive/sync)
  kToFirst = 3,     // second -> first: P of the odd block, its max and factor
  kLocalFirst = 4,  // consumer 0 alone (128): its P stores and cleaned V rows, before its own P V
  kLocalSecond = 5,
};

// kVt: V^T transposed in place by the producer warpgroup's warps that issue no boxes: once the
// block's owner has read the stage for S, each V chunk becomes its m tile of V^T (K-major), and
// P V runs as SS wgmmas from there (docs/sm90-fp8.md, "V^T transposed by the producer warps").
template <bool kVt>
struct Fp8SeesawTraits {
  using T = cute::float_e4m3_t;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kRows = 64;  // query rows per CTA (M of S, N of O^T)
  static constexpr int kKeys = 64;  // keys per block (N of S)
  static constexpr int kD = 576;
  static constexpr int kL = 512;
  static constexpr int kStages = 4;  // block i in stage i % 4: consumer c's in c and c + 2
  static constexpr int kColsPerWg = kL / 2;
  static constexpr int kChunkCols = 64;  // e4m3 bytes per row of a chunk (64-byte swizzle)
  static constexpr int kStageElemBytes = 1;
  static constexpr int kChunks = kD / kChunkCols;
  static constexpr int kLeftChunks = 4;  // V columns 0..255: consumer 0's (empty_l)
  static constexpr int kRopeChunkBytes = (kL / kChunkCols) * kKeys * kChunkCols;  // P's place
  static constexpr int kProducerRegs = kVt ? 56 : 40;  // kVt: the transposing warps
  static constexpr int kConsumerRegs = kVt ? 224 : 232;
  static_assert(kRows * kKeys == kKeys * kChunkCols, "P (rows x keys, e4m3) fills the rope chunk");

  using QkAtom = cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN<>;
  using PvAtom = std::conditional_t<kVt, cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN<>,
                                    cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>>;
  using KAtom = cute::GMMA::Layout_K_SW64_Atom<T>;
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kRows>, cute::Int<kD>>{}));
  using SmemLayoutK =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kKeys>, cute::Int<kD>>{}));
  // P^T as O^T's B operand: N = rows, K = keys (the k slots of few_rows::fp8_p_slot), K-major.
  using SmemLayoutP =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kRows>, cute::Int<kKeys>>{}));
  // kVt: an m tile of V^T as O^T's A operand, in place of V chunk m: 64 V columns (the GMMA rows,
  // few_rows::fp8_o_row) x 64 k slots (few_rows::fp8_p_slot), K-major.
  using SmemLayoutVt =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<64>, cute::Int<kKeys>>{}));
  using TiledMmaQk = decltype(cute::make_tiled_mma(QkAtom{}));
  using TiledMmaPv = decltype(cute::make_tiled_mma(PvAtom{}));

  struct alignas(1024) SharedMemoryPlan {
    alignas(1024) T q[kRows * kD];           // query tile, SmemLayoutQ (padding rows 0)
    alignas(1024) T k[kStages][kKeys * kD];  // K blocks, SmemLayoutK; P in the rope chunk
    float max[2][2][kRows];    // [round parity][consumer] running max after its block (base 2)
    float scale[2][2][kRows];  // [round parity][consumer] exp2(previous max - that max)
    float row_sum[kRows];      // consumer 1's row sums at the segment's end
    uint32_t row_nan[kRows];   // a non-finite O^T value of the row (segment's end)
    int64_t out_row[kRows];    // the row's offset in out or partial_o (-1: not written)
    float out_scale[kRows];    // and what its O is multiplied by
    const uint4* query_row[kRows];
    uint64_t full[kStages][kChunks];
    uint64_t empty_l[kStages];  // chunks 0..3 read: one arrive per consumer-0 warp
    uint64_t empty_r[kStages];  // chunks 4..8 read (V_R, P): one arrive per consumer-1 warp
    // kVt: [stage][0]: the owner's S has read chunks 0..5, [1]: 6..8 (one arrive per owner warp)
    uint64_t s_done[kStages][2];
    // kVt: [stage][h]: consumer h's m tiles of V^T are in place (one arrive per transposing warp
    // after its m tiles of the half and a proxy fence)
    uint64_t vt_full[kStages][2];
  };
  static constexpr size_t kSmemBytes = sizeof(SharedMemoryPlan) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one sm90 CTA");
};

__device__ __forceinline__ uint32_t fp8_barrier(Fp8Barrier b) { return static_cast<uint32_t>(b); }

// kVt: transposing warp `tw` of `nt` (producer warps that issue no boxes) walks the CTA's segments
// as the producer does and turns each block's V chunks m = tw, tw + nt, ... into m tiles of V^T in
// place, once the block's owner has read them for S (s_done): the chunk's four 16-column units
// are few_rows::load_fp8_v_fragment's fragments (the RS route's A registers, its row relabelling
// and k slots), all four loaded before any is stored back by stmatrix where an SS wgmma reads the
// same operand. The m tiles of chunks 0..3 (consumer 0's V columns) first, then vt_full[stage][0],
// the rest, then vt_full[stage][1]. V rows past the extent become 0 and the draft keys some row of
// the tile does not attend lose their non-finite values, as the owner cleans the stage on the RS
// route (tma::clean_v_rows_e4m3).
template <typename Traits, typename Cursor>
__device__ __forceinline__ void transpose_v(const DecodeKernelParams& p,
                                            typename Traits::SharedMemoryPlan& smem, int tw,
                                            int nt) {
  constexpr int kStages = Traits::kStages, kKeys = Traits::kKeys;
  constexpr int kTileBytes = 64 * kKeys;  // one chunk, one m tile of V^T
  const int lane = threadIdx.x & 31;
  const int q = lane & 3;
  // stmatrix: lane l gives row l % 8 of matrix l / 8 (register j of k step k: GMMA rows 16 w4 +
  // 0..7 (+ 8 for odd j), k slots 32 k (+ 16 for j >= 2)); the 64-byte swizzle of that row.
  uint32_t st_off[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int row = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int slot = 32 * k + 16 * (lane >> 4);
    st_off[k] = tma::swizzled_offset_e4m3(row, slot, 64);  // + 1 KB per unit (16 rows)
  }
  uint32_t used0, used1;
  tma::walk_segments<Cursor, kStages>(
      p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t) {
        const int tile_limit = max(
            0, p.mask != nullptr ? w.seq_len - w.n : w.seq_len - w.n + w.row0 / p.num_heads + 1);
        for (int block = w.block_begin, it = 0; block < w.block_end; ++block, ++it) {
          const int stage = it % kStages;
          const uint32_t phase = ((u0 >> stage) + it / kStages) & 1;
          const int key0 = block * kKeys;
          const int valid = min(kKeys, w.extent - key0);
          const int clean0 = min(valid, max(0, tile_limit - key0));
          const uint32_t stage_addr = tma::smem_addr(smem.k[stage]);
          auto tile = [&](int m) {
            tma::mbar_wait(&smem.s_done[stage][m < 6 ? 0 : 1], phase);
            uint32_t raw[4][2][4];
#pragma unroll
            for (int w4 = 0; w4 < 4; ++w4) {
#pragma unroll
              for (int k = 0; k < 2; ++k) {
                tma::ldmatrix_x4_trans(stage_addr + few_rows::e4m3_offset<0>(m, 32 * k + lane, w4),
                                       raw[w4][k][0], raw[w4][k][1], raw[w4][k][2], raw[w4][k][3]);
              }
            }
            __syncwarp();  // every lane's loads of the chunk before any store into it
#pragma unroll
            for (int w4 = 0; w4 < 4; ++w4) {
              uint32_t a[2][4];
#pragma unroll
              for (int k = 0; k < 2; ++k) {
                a[k][0] = tma::byte_perm(raw[w4][k][0], raw[w4][k][1], 0x6240);
                a[k][1] = tma::byte_perm(raw[w4][k][0], raw[w4][k][1], 0x7351);
                a[k][2] = tma::byte_perm(raw[w4][k][2], raw[w4][k][3], 0x6240);
                a[k][3] = tma::byte_perm(raw[w4][k][2], raw[w4][k][3], 0x7351);
              }
              if (clean0 < kKeys) {
#pragma unroll
                for (int k = 0; k < 2; ++k) {
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                      // k slot 4 q + j of the group: keys 2q, 8 + 2q, 2q + 1, 9 + 2q (fp8_p_slot)
                      const int key = 32 * k + 16 * (i >> 1) + 8 * (j & 1) + 2 * q + (j >> 1);
                      const uint32_t byte = (a[k][i] >> (8 * j)) & 0xffu;
                      if (key >= clean0 && (key >= valid || (byte & 0x7fu) == 0x7fu)) {
                        a[k][i] &= ~(0xffu << (8 * j));
                      }
                    }
                  }
                }
              }
#pragma unroll
              for (int k = 0; k < 2; ++k) {
                tma::stmatrix_x4(stage_addr + m * kTileBytes + w4 * 1024 + st_off[k], a[k][0],
                                 a[k][1], a[k][2], a[k][3]);
              }
            }
          };
          for (int m = tw; m < 4; m += nt) tile(m);
          tma::fence_proxy_async_smem();
          __syncwarp();
          if (lane == 0) tma::mbar_arrive(&smem.vt_full[stage][0]);
          for (int m = 4 + (tw + 4 * (nt - 1)) % nt; m < 8; m += nt) tile(m);
          tma::fence_proxy_async_smem();
          __syncwarp();
          if (lane == 0) tma::mbar_arrive(&smem.vt_full[stage][1]);
        }
      });
}

// kDirect: a call of one request (the direct split): blockIdx.y = run of equal runs of the tile's
// blocks (tma::SplitCursor), partials in the uniform layout.
template <Elem Q, Elem KV, bool kDirect, bool kVt>
__global__ void __launch_bounds__(Fp8SeesawTraits<kVt>::kThreads, 1)
    seesaw_fp8_kernel(const __grid_constant__ DecodeKernelParams p,
                      const __grid_constant__ CUtensorMap kv_map) {
  using namespace cute;
  static_assert(Q == Elem::kFp8E4M3 && KV == Elem::kFp8E4M3, "an e4m3 query over an e4m3 cache");
  using Traits = Fp8SeesawTraits<kVt>;
  using Plan = typename Traits::SharedMemoryPlan;
  using tma::mbar_arrive;
  using tma::mbar_wait;
  using tma::named_barrier_arrive;
  using tma::named_barrier_sync;
  using Cursor = std::conditional_t<kDirect, tma::SplitCursor, tma::PartCursor>;
  constexpr int kRows = Traits::kRows, kKeys = Traits::kKeys, kL = Traits::kL;
  constexpr int kStages = Traits::kStages;
  constexpr int kCols = kRows / 4;  // rows (N columns of O^T) per thread: 16
  constexpr int kPartialChunks = 3;
  constexpr float kPShift = 8.0f;  // P' = 2^8 exp2(s - m) <= 2^8 (e4m3's largest finite: 448)

  extern __shared__ uint8_t smem_raw[];
  Plan& smem = shared_plan<Plan>(smem_raw);

  pdl_wait();
  pdl_launch_dependents();

  const int issuers = tma::producer_issuers<Traits>(p);
  // kVt: the producer warps that issue no boxes transpose V (the launch takes kVt only where
  // there is at least one: pages of 32 keys and up).
  const int transposers = 4 - issuers;
  if (kVt && threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      for (int h = 0; h < 2; ++h) {
        tma::mbar_init(&smem.s_done[s][h], 4);
        tma::mbar_init(&smem.vt_full[s][h], transposers);
      }
    }
  }
  tma::init_ring_barriers<Traits>(smem, issuers);  // its fence and sync publish these too

  const int wg = cutlass::canonical_warp_group_idx();
  if (wg == 0) {
    tma::regs_dealloc<Traits::kProducerRegs>();
    const int piece = threadIdx.x / 32;
    if (piece < issuers) {
      if (threadIdx.x % 32 == 0) {
        tma::prefetch_tensor_map(&kv_map);
        uint32_t used0, used1;
        tma::walk_segments<Cursor, kStages>(
            p, used0, used1, [&](const tma::TileWork& w, uint32_t u0, uint32_t u1) {
              tma::produce_chunks<Traits, kDirect>(p, w, &kv_map, smem, piece, u0, u1);
            });
      }
    } else if constexpr (kVt) {
      transpose_v<Traits, Cursor>(p, smem, piece - issuers, transposers);
    }
    return;
  }

  // ---- consumer warpgroups ----
  tma::regs_alloc<Traits::kConsumerRegs>();
  const int cw = wg - 1;
  const int ctid = threadIdx.x - 128;
  const int wtid = threadIdx.x - 128 * wg;
  const int lane = threadIdx.x & 31;
  const int warp = wtid / 32;

  typename Traits::TiledMmaQk mma_qk;
  typename Traits::TiledMmaPv mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(wtid);
  auto thr_pv = mma_pv.get_thread_slice(wtid);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, 1, 18)
  using SmemLayoutK = typename Traits::SmemLayoutK;
  using SmemLayoutP = typename Traits::SmemLayoutP;
  using SmemLayoutVt = typename Traits::SmemLayoutVt;
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kKeys>>{});
  Tensor tSrT = partition_fragment_C(mma_qk, Shape<Int<kRows>, Int<kKeys>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<Traits::kColsPerWg>, Int<kRows>>{});
  Tensor tOrT = partition_fragment_C(mma_pv, Shape<Int<64>, Int<kRows>>{});
  // !kVt: V^T's registers (MMA, 1, 2); kVt: unused (V^T in shared memory).
  auto tOrA = [&] {
    if constexpr (kVt) {
      return 0;
    } else {
      return thr_pv.partition_fragment_A(
          make_tensor(make_smem_ptr(smem.k[0]), Layout<Shape<Int<64>, Int<kKeys>>>{}));
    }
  }();
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kRows>, Int<kKeys>>{}));
  Tensor tOcO =
      thr_pv.partition_C(make_identity_tensor(Shape<Int<Traits::kColsPerWg>, Int<kRows>>{}));
  static_assert(size(decltype(tSrS){}) == 32 && size(decltype(tOrO){}) == 128, "fragments");

  // S's rows (M): slot 0 = tScS(0)'s row, slot 1 = 8 below. O^T's rows (N): slot s of 16.
  int my_row[2];
  my_row[0] = get<0>(tScS(0));
  my_row[1] = get<0>(tScS(2));
  auto o_row = [&](int s) { return 2 * (lane & 3) + (s & 1) + 8 * (s >> 1); };
  auto o_slot = [](int v) { return (v & 1) | ((v >> 2) << 1); };  // value v's row slot in O^T
  const float score_scale = bmm1_scale_of(p) * 1.4426950408889634f;

  // One arrive per warp: consumer 0's reads of the stage's chunks 0..3 and of its P are done
  // (empty_l), consumer 1's of chunks 4..8 (empty_r).
  auto release = [&](int stage) {
    __syncwarp();
    if (cute::elect_one_sync()) mbar_arrive(cw == 0 ? &smem.empty_l[stage] : &smem.empty_r[stage]);
  };

  uint32_t used = 0;  // parities of the blocks each stage held before the segment (bit: stage)
  if constexpr (kDirect) {
    tma::prefetch_query_rows<kRows, Traits::kConsumerThreads, 1>(p, 0, blockIdx.x * kRows, ctid);
  }
  Cursor cursor;
  cursor.begin(p);
  if constexpr (!kDirect) {
    cursor.template prefetch_first_query<kRows, Traits::kConsumerThreads, 1>(p, ctid);
  }
  tma::TileWork w;
  int64_t partial_row0;
  while (cursor.next(p, w, partial_row0)) {
    const int tile_rows = min(kRows, w.rows - w.row0);
    if (w.block_begin >= w.block_end) {
      tma::store_empty_segment(p, w, partial_row0, tile_rows, ctid, Traits::kConsumerThreads);
      continue;
    }
    // ---- the query tile (e4m3, 64-byte swizzle; padding rows 0) ----
    tma::load_query_tile_rows<kRows, Traits::kConsumerThreads, void, true>(
        p, w, tile_rows, reinterpret_cast<uint8_t*>(smem.q), smem.query_row, ctid,
        [] { named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads); },
        [&] {
          if (ctid < kRows) smem.row_nan[ctid] = 0;
        });
    tma::fence_proxy_async_smem();
    named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads);
    clear(tOrO);
    warpgroup_fence_operand(tOrO);

    // Masks: as the seesaw kernel (rule per S row; padding rows do not count).
    tma::RowRule rule[2];
    bool row_valid[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int r = my_row[s];
      row_valid[s] = r < tile_rows;
      const int i = (w.row0 + r) / p.num_heads;
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
    // The first key some row of the tile does not attend: blocks past it take the masked path in
    // every thread and clean their V rows from it on.
    const int tile_limit =
        max(0, p.mask != nullptr ? w.seq_len - w.n : w.seq_len - w.n + w.row0 / p.num_heads + 1);
    const int unmasked_limit =
        min(min(row_valid[0] ? rule[0].limit : INT_MAX, row_valid[1] ? rule[1].limit : INT_MAX),
            tile_limit);

    float row_max[2] = {kNegInf, kNegInf};
    float row_sum[2] = {0.0f, 0.0f};

    // O^T's m tile m += a V^T P^T of a partial t, a of the thread's 16 rows read where `owner`
    // left them. Values 4j .. 4j + 3 are rows 8j + 2q (even values) and 8j + 2q + 1 (odd): one
    // factor pair a load.
    auto promote = [&](int m, auto& t, int par, int owner) {
      warpgroup_fence_operand(t);
      CUTE_UNROLL
      for (int j = 0; j < size(t) / 4; ++j) {
        const float2 f =
            *reinterpret_cast<const float2*>(&smem.scale[par][owner][8 * j + 2 * (lane & 3)]);
        CUTE_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * j + e;
          tOrO(i, m, 0) = fmaf(e & 1 ? f.y : f.x, tOrO(i, m, 0), t(i));
        }
      }
    };
    // O^T = a O^T + V^T P^T of the block in `stage` (P in its rope chunk) over this consumer's V
    // columns, one partial per m tile (O^T's 128 registers leave no room for two). Waits for its
    // GEMMs. !kVt: V^T from registers, the next m tile's fragments loaded under the wait. kVt:
    // V^T in place of the V chunks once transpose_v has written this consumer's half (phase
    // `phase`), SS wgmmas.
    auto pv_gemm = [&](int stage, int par, int owner, uint32_t phase) {
      Tensor sP =
          make_tensor(make_smem_ptr(reinterpret_cast<typename Traits::T*>(
                          reinterpret_cast<uint8_t*>(smem.k[stage]) + Traits::kRopeChunkBytes)),
                      SmemLayoutP{});
      Tensor tOrP = thr_pv.partition_fragment_B(sP);  // (MMA, 1, 2)
      if constexpr (kVt) {
        tma::mbar_wait(&smem.vt_full[stage][cw], phase);
        CUTE_UNROLL
        for (int m = 0; m < 4; ++m) {
          Tensor sV = make_tensor(make_smem_ptr(smem.k[stage] + (Traits::kLeftChunks * cw + m) *
                                                                    Traits::kChunkCols * kKeys),
                                  SmemLayoutVt{});
          Tensor tOrV = thr_pv.partition_fragment_A(sV);  // (MMA, 1, 2)
          warpgroup_fence_operand(tOrT);
          warpgroup_arrive();
          mma_pv.accumulate_ = GMMA::ScaleOut::Zero;
          CUTE_UNROLL
          for (int k = 0; k < 2; ++k) {
            cute::gemm(mma_pv, tOrV(_, _, k), tOrP(_, _, k), tOrT);
            mma_pv.accumulate_ = GMMA::ScaleOut::One;
          }
          warpgroup_commit_batch();
          warpgroup_wait<0>();
          promote(m, tOrT, par, owner);
        }
      } else {
        const uint32_t stage_addr = tma::smem_addr(smem.k[stage]);
        uint32_t frag[2][2][4];  // [tile parity][k step][register]
        auto load = [&](int m) {
          few_rows::load_fp8_v_fragment(stage_addr, Traits::kLeftChunks * cw + m, warp, lane,
                                        frag[m & 1]);
        };
        auto issue = [&](int m) { few_rows::issue_fp8_pv(mma_pv, tOrA, tOrP, tOrT, frag[m & 1]); };
        load(0);
        issue(0);
        CUTE_UNROLL
        for (int m = 0; m < 4; ++m) {
          if (m + 1 < 4) load(m + 1);
          warpgroup_wait<0>();
          promote(m, tOrT, par, owner);
          if (m + 1 < 4) issue(m + 1);
        }
      }
      warpgroup_fence_operand(tOrO);
    };
    const int num_blocks = w.block_end - w.block_begin;
    for (int round = 0; 2 * round < num_blocks; ++round) {
      const int par = round & 1;
      const bool has_odd = 2 * round + 1 < num_blocks;
      const bool mine = cw == 0 || has_odd;
      // Block 2 round + c in stage c + 2 (round % 2), each stage used every other round.
      const int stage0 = __shfl_sync(0xffffffffu, 2 * par, 0);
      const int stage1 = stage0 + 1;
      const int own_stage = cw == 0 ? stage0 : stage1;
      const uint32_t phase0 = ((used >> stage0) + (round >> 1)) & 1;
      const uint32_t phase1 = ((used >> stage1) + (round >> 1)) & 1;
      const uint32_t phase = cw == 0 ? phase0 : phase1;
      const int key0 = (w.block_begin + 2 * round + cw) * kKeys;

      if (mine) {
        // ---- qk_gemm: S = Q K^T, three partials of three chunks, each chunk issued as it lands
        Tensor sK = make_tensor(make_smem_ptr(smem.k[own_stage]), SmemLayoutK{});
        Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, 1, 18)
        auto issue = [&](int c0, auto& t) {
          warpgroup_fence_operand(t);
          CUTE_UNROLL
          for (int c = c0; c < c0 + kPartialChunks; ++c) {
            mbar_wait(&smem.full[own_stage][c], phase);
            warpgroup_arrive();
            mma_qk.accumulate_ = c == c0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
            cute::gemm(mma_qk, tSrQ(_, _, 2 * c), tSrK(_, _, 2 * c), t);
            mma_qk.accumulate_ = GMMA::ScaleOut::One;
            cute::gemm(mma_qk, tSrQ(_, _, 2 * c + 1), tSrK(_, _, 2 * c + 1), t);
          }
          warpgroup_commit_batch();
        };
        auto add = [&] {
          warpgroup_fence_operand(tSrS);
          warpgroup_fence_operand(tSrT);
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); ++v) tSrS(v) += tSrT(v);
        };
        // kVt: S's reads of chunks 0..5, then 6..8, done: transpose_v may write V^T there.
        auto s_done = [&](int h) {
          if constexpr (kVt) {
            __syncwarp();
            if (cute::elect_one_sync()) mbar_arrive(&smem.s_done[own_stage][h]);
          }
        };
        issue(0, tSrS);
        issue(kPartialChunks, tSrT);
        warpgroup_wait<0>();
        s_done(0);
        add();
        issue(2 * kPartialChunks, tSrT);
        warpgroup_wait<0>();
        s_done(1);
        add();
      }

      float m_in[2];
      if (cw == 1) {
        // ---- consumer 0's hand-off: its max and factor (its P V comes after this consumer's
        // own hand-off, so that consumer 0 waits for that no longer than the softmax) ----
        named_barrier_sync(fp8_barrier(Fp8Barrier::kToSecond), Traits::kConsumerThreads);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          m_in[s] = smem.max[par][0][my_row[s]];
          row_sum[s] *= smem.scale[par][0][my_row[s]];
        }
      } else {
#pragma unroll
        for (int s = 0; s < 2; ++s) m_in[s] = row_max[s];
      }

      if (mine) {
        // ---- mask; row max; softmax; P into the rope chunk (e4m3) ----
        const bool unmasked =
            p.mask == nullptr && score_scale > 0.0f && key0 + kKeys <= unmasked_limit;
        const float s_mul = unmasked ? score_scale : 1.0f;
        float block_max[2] = {kNegInf, kNegInf};
        bool neg_inf[2] = {false, false};
        if (unmasked) {
          float abs_max = 0.0f;
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); ++v) {
            block_max[(v >> 1) & 1] = fmaxf(block_max[(v >> 1) & 1], tSrS(v));
            abs_max = fmaxf(abs_max, fabsf(tSrS(v)));
          }
          if (abs_max == kInf) {
            CUTE_UNROLL
            for (int v = 0; v < size(tSrS); ++v) {
              neg_inf[(v >> 1) & 1] = neg_inf[(v >> 1) & 1] || tSrS(v) == kNegInf;
            }
          }
        } else {
          CUTE_UNROLL
          for (int v = 0; v < size(tSrS); ++v) {
            const int slot = (v >> 1) & 1;
            float s = kNegInf;
            if (rule[slot].attends(key0 + get<1>(tScS(v)))) {
              s = tSrS(v) * score_scale;
              if (s == kNegInf) s = __int_as_float(0x7fffffff);
            }
            tSrS(v) = s;
            block_max[slot] = fmaxf(block_max[slot], s);
          }
        }
        float m_new[2], a_new[2];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          if (neg_inf[s]) row_sum[s] = __int_as_float(0x7fffffff);
          block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 1));
          block_max[s] = fmaxf(block_max[s], __shfl_xor_sync(0xffffffffu, block_max[s], 2));
          block_max[s] *= s_mul;
          m_new[s] = fmaxf(m_in[s], block_max[s]);
          const float m_use = m_new[s] == kNegInf ? 0.0f : m_new[s];
          a_new[s] = m_new[s] == kNegInf ? 1.0f : exp2f(m_in[s] - m_use);
          block_max[s] = m_use;
          row_sum[s] *= a_new[s];
        }
        CUTE_UNROLL
        for (int v = 0; v < size(tSrS); ++v) {
          const int slot = (v >> 1) & 1;
          tSrS(v) = tma::exp2_ftz(fmaf(tSrS(v), s_mul, kPShift - block_max[slot]));
          row_sum[slot] += tSrS(v);
        }
        // P: keys 16g + {2q, 2q + 1, 2q + 8, 2q + 9} of a row are k slots 16g + 4q .. + 3
        // (few_rows::fp8_p_slot): one 4-byte store per row and group of 16 keys.
        uint8_t* stage_bytes = reinterpret_cast<uint8_t*>(smem.k[own_stage]);
        uint8_t* p_bytes = stage_bytes + Traits::kRopeChunkBytes;
        const int q = lane & 3;
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int row = my_row[s];
#pragma unroll
          for (int g = 0; g < 4; ++g) {
            const int v0 = 4 * (2 * g) + 2 * s, v1 = 4 * (2 * g + 1) + 2 * s;
            const uint32_t word =
                static_cast<uint32_t>(tma::e4m3x2(tSrS(v0), tSrS(v1))) |
                (static_cast<uint32_t>(tma::e4m3x2(tSrS(v0 + 1), tSrS(v1 + 1))) << 16);
            const uint32_t offset = row * 64 + ((g ^ ((row >> 1) & 3)) << 4) + 4 * q;
            *reinterpret_cast<uint32_t*>(p_bytes + offset) = word;
          }
        }
        // V rows past the extent (TMA skips pages past it: stale or NaN bytes) become 0, and draft
        // keys some row of the tile does not attend lose non-finite values (both halves: the
        // other consumer reads its V columns after the hand-off).
        const int valid = min(kKeys, w.extent - key0);
        const int clean0 = min(valid, max(0, tile_limit - key0));
        if (!kVt && clean0 < kKeys) {  // kVt: transpose_v cleans V^T
          tma::clean_v_rows_e4m3(stage_bytes, kKeys, kL / Traits::kChunkCols, clean0, valid, wtid,
                                 128);
        }
        if ((lane & 3) == 0) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            smem.max[par][cw][my_row[s]] = m_new[s];
            smem.scale[par][cw][my_row[s]] = a_new[s];
          }
        }
        tma::fence_proxy_async_smem();
        named_barrier_sync(
            fp8_barrier(cw == 0 ? Fp8Barrier::kLocalFirst : Fp8Barrier::kLocalSecond), 128);
        named_barrier_arrive(fp8_barrier(cw == 0 ? Fp8Barrier::kToSecond : Fp8Barrier::kToFirst),
                             Traits::kConsumerThreads);
#pragma unroll
        for (int s = 0; s < 2; ++s) row_max[s] = m_new[s];
      } else {
#pragma unroll
        for (int s = 0; s < 2; ++s) row_max[s] = m_in[s];
      }
      if (cw == 1) {
        // ---- O_R = a0 O_R + V0_R^T P0^T ----
        pv_gemm(stage0, par, 0, phase0);
        release(stage0);
      }
      if (mine) {
        // ---- this consumer's own block: O^T = a O^T + V^T P^T ----
        pv_gemm(own_stage, par, cw, phase);
        release(own_stage);
      }

      if (cw == 0 && has_odd) {
        // ---- consumer 1's hand-off: O_L = a1 O_L + V1_L^T P1^T ----
        named_barrier_sync(fp8_barrier(Fp8Barrier::kToFirst), Traits::kConsumerThreads);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          row_max[s] = smem.max[par][1][my_row[s]];
          row_sum[s] *= smem.scale[par][1][my_row[s]];
        }
        pv_gemm(stage1, par, 1, phase1);
        release(stage1);
      }
    }

    // ---- store_rows: sums over both consumers, then each consumer its O^T columns ----
    CUTE_UNROLL
    for (int v = 0; v < size(tOrO); ++v) {
      if (!isfinite(tOrO(v))) smem.row_nan[o_row(o_slot(v % 32))] = 1;
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 1);
      row_sum[s] += __shfl_xor_sync(0xffffffffu, row_sum[s], 2);
      if (cw == 1 && (lane & 3) == 0) smem.row_sum[my_row[s]] = row_sum[s];
    }
    named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads);
    constexpr float kPUnscale = 1.0f / 256.0f;
    if (cw == 0 && (lane & 3) < 2) {
      const int s = lane & 1;
      const int r = my_row[s];
      float z = (row_sum[s] + smem.row_sum[r]) * kPUnscale;
      if (smem.row_nan[r] != 0) z = __int_as_float(0x7fffffff);
      const float m = row_max[s] == kNegInf ? kNegInf : row_max[s] * 0.6931471805599453f;
      int64_t out_row = -1;
      float scale = 0.0f;
      if (r < tile_rows) {
        if (w.whole) {
          const RowTarget t = finish_row(p, w.row0 + r, w.token0, m, z);
          out_row = t.offset;
          scale = t.scale;
        } else {
          p.partial_max[partial_row0 + r] = m;
          p.partial_sum[partial_row0 + r] = z;
          out_row = (partial_row0 + r) * kL;
          scale = z != 0.0f ? __fdiv_rn(bmm2_scale_of(p), z) : 0.0f;
        }
      }
      smem.out_row[r] = out_row;
      smem.out_scale[r] = scale;
    }
    named_barrier_sync(fp8_barrier(Fp8Barrier::kConsumers), Traits::kConsumerThreads);
    {
      int64_t row_out[kCols];
      float row_scale[kCols];
#pragma unroll
      for (int s = 0; s < kCols; ++s) {
        row_out[s] = smem.out_row[o_row(s)];
        row_scale[s] = smem.out_scale[o_row(s)];
      }
      const int cols = w.whole ? p.kv_lora_rank : kL;
      uint16_t* base = static_cast<uint16_t*>(w.whole ? p.out : p.partial_o);
      const bool words = !w.whole || p.out_vec16;
      CUTE_UNROLL
      for (int v = 0; v < size(tOrO); ++v) {
        if (v & 2) continue;  // v | 2: the next V column of the same row (few_rows::fp8_o_row)
        const int s = o_slot(v % 32);
        const int d = Traits::kColsPerWg * cw + few_rows::fp8_o_row(get<0>(tOcO(v)));
        const int64_t o = row_out[s];
        if (o < 0 || d >= cols) continue;
        const float f = row_scale[s] * kPUnscale;
        const uint32_t word =
            pack_out(p, f != 0.0f ? tOrO(v) * f : 0.0f, f != 0.0f ? tOrO(v | 2) * f : 0.0f);
        if (words) {
          *reinterpret_cast<uint32_t*>(base + o + d) = word;
        } else {
          base[o + d] = static_cast<uint16_t>(word & 0xffffu);
          if (d + 1 < cols) base[o + d + 1] = static_cast<uint16_t>(word >> 16);
        }
      }
    }
    // The blocks each stage and buffer held, as the producer and transpose_v count (block i in
    // stage i % kStages, buffer i % 2).
    // NOTE: the next segment's query tile and row_nan stores come after the first barrier of its
    // load; out_row, out_scale and row_nan are read above before any thread gets there.
    const uint32_t n = num_blocks;
#pragma unroll
    for (uint32_t st = 0; st < kStages; ++st) {
      used ^= (((n + kStages - 1 - st) / kStages) & 1) << st;
    }
  }
}

template <Elem Q, Elem KV, bool kVt>
cudaError_t launch_seesaw_fp8_as(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                                 int num_tiles, bool direct_split, cudaStream_t stream, bool pdl) {
  using Traits = Fp8SeesawTraits<kVt>;
  constexpr size_t smem = Traits::kSmemBytes;
  auto* kernel =
      direct_split ? &seesaw_fp8_kernel<Q, KV, true, kVt> : &seesaw_fp8_kernel<Q, KV, false, kVt>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(num_tiles, direct_split ? params.num_splits : params.num_parts);
  return launch(kernel, grid, dim3(Traits::kThreads), smem, stream, pdl, params, kv_map);
}

// vt: V^T transposed in place by the producer warps (Fp8SeesawTraits<true>), where pages of 32
// keys and up leave at least one producer warp without boxes to issue.
template <Elem Q, Elem KV>
cudaError_t launch_seesaw_fp8(const DecodeKernelParams& params, const CUtensorMap& kv_map,
                              int num_tiles, bool direct_split, bool vt, cudaStream_t stream,
                              bool pdl) {
  if (vt && params.page_size >= 32) {
    return launch_seesaw_fp8_as<Q, KV, true>(params, kv_map, num_tiles, direct_split, stream, pdl);
  }
  return launch_seesaw_fp8_as<Q, KV, false>(params, kv_map, num_tiles, direct_split, stream, pdl);
}

}  // namespace mla::sm90::seesaw
