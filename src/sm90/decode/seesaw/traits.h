// Tile sizes, GMMA shapes and the shared-memory plan of the seesaw decode kernel.
#pragma once

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "sm90/decode/tma/tensor_map.h"
#include "sm90/params.h"

namespace mla::sm90::seesaw {

// The CuTe element type and the GMMA atoms of each supported 16-bit format (bf16, fp16), as CuTe's
// selectors pick them for these tiles. kPvN: the N of the P V atoms, 256 (one wgmma a k step over a
// consumer's O half) or 128 (two; a CTA of 512 threads, whose register target of 128 no single
// 64 x 256 wgmma fits: docs/sm90-sparse.md).
template <Elem E, int kPvN = 256>
struct GmmaOps {
  static_assert(E == Elem::kBf16 || E == Elem::kFp16, "16-bit GEMMs");
  static_assert(kPvN == 256 || kPvN == 128, "P V atoms of N 256 or 128");
  using Type = std::conditional_t<E == Elem::kBf16, cute::bfloat16_t, cute::half_t>;
  // S = Q K^T over a whole 64-key block: A = Q (K-major), B = K block (K-major).
  using QkAtom =
      decltype(cute::SM90::GMMA::ss_op_selector<Type, Type, float,
                                                cute::Shape<cute::_64, cute::_64, cute::_16>,
                                                cute::GMMA::Major::K, cute::GMMA::Major::K>());
  // O half += P V half: A = P (K-major), B = V, the same bytes as the K block read MN-major.
  using PvAtom =
      decltype(cute::SM90::GMMA::ss_op_selector<Type, Type, float,
                                                cute::Shape<cute::_64, cute::Int<kPvN>, cute::_16>,
                                                cute::GMMA::Major::K, cute::GMMA::Major::MN>());
  // The same with P from registers: a consumer's own block (its S accumulator, rounded).
  using PvAtomRs =
      decltype(cute::SM90::GMMA::rs_op_selector<Type, Type, float,
                                                cute::Shape<cute::_64, cute::Int<kPvN>, cute::_16>,
                                                cute::GMMA::Major::K, cute::GMMA::Major::MN>());
};

// Named barriers (id 0 is __syncthreads). The two hand-offs are one-way: one warpgroup arrives,
// the other syncs (256 threads).
enum class NamedBarrier : uint32_t {
  kConsumers = 1,   // both consumer warpgroups (256 threads)
  kToSecond = 2,    // first -> second: P of the even block, its max and rescale factor
  kToFirst = 3,     // second -> first: P of the odd block, its max and rescale factor
  kLocalFirst = 4,  // consumer warpgroup 0 alone (128 threads): its zeroed V rows are written
  kLocalSecond = 5,
  kVoteFirst = 6,  // skip-softmax vote of consumer warpgroup 0 (128 threads)
  kVoteSecond = 7,
  kDeferFirst = 8,  // consumer warpgroup 0: the next round's first chunk has landed (vote)
  kWiden = 9,       // producer warps 1..3 widening an fp8 chunk (tma/fp8_ring.cuh; 96 threads)
  kFirstS = 10,     // a segment's first round: consumer 0's S is done (p.hold_first_s)
};

template <Elem E, int kPvN = 256>
struct SeesawTraits {
  using Ops = GmmaOps<E, kPvN>;
  using T = typename Ops::Type;

  static constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
  static constexpr int kConsumerThreads = 256;
  static constexpr int kRows = tma::kTileRows;  // query rows per CTA
  static constexpr int kKeys = 64;              // keys per block (one pipeline stage)
  static constexpr int kD = 576;                // key width: kv_lora_rank 512 + rope 64
  static constexpr int kL = 512;                // value width
  // Consumer c scores every block of parity c; stage s holds the blocks of parity s.
  static constexpr int kStages = 2;
  static constexpr int kColsPerWg = kL / 2;  // consumer c owns O[:, 256c : 256c + 256]
  static constexpr int kChunkCols = 64;      // one 128-byte swizzle atom row of 16-bit values
  static constexpr int kStageElemBytes = 2;  // bytes of one cache value in a stage
  static constexpr int kChunks = kD / kChunkCols;
  // Element offset of a stage's rope chunk (columns 512..575): the block's P once its S is done.
  static constexpr int kRopeChunkOffset = (kL / kChunkCols) * kKeys * kChunkCols;
  // Chunks 0..3 hold V_L (consumer 0 releases them), 4..7 V_R (consumer 1); the rope chunk holds
  // P, which both read: it is refilled once both have released the stage.
  static constexpr int kLeftChunks = kColsPerWg / kChunkCols;
  static_assert(kChunks == kL / kChunkCols + 1, "one rope chunk of 64 columns");
  static_assert(kRows == kKeys, "P (rows x keys) fills the rope chunk (keys x 64 columns)");
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= 65536, "register file");

  // Shared-memory layouts: 64-column chunks of 128-byte-swizzled rows, chunk after chunk; a TMA
  // box of 64 columns x n rows with the 128-byte swizzle writes exactly these bytes.
  using SmemLayoutQ = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                                   cute::Shape<cute::Int<kRows>, cute::Int<kD>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                                   cute::Shape<cute::Int<kKeys>, cute::Int<kD>>{}));
  // V (L x keys) is the K block's first 512 columns read MN-major: the same bytes.
  using SmemLayoutV = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<T>{},
                                                   cute::Shape<cute::Int<kL>, cute::Int<kKeys>>{},
                                                   cute::Step<cute::_2, cute::_1>{}));
  using SmemLayoutP = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<T>{}, cute::Shape<cute::Int<kRows>, cute::Int<kKeys>>{}));

  using TiledMmaQk = decltype(cute::make_tiled_mma(typename Ops::QkAtom{}));
  using TiledMmaPv = decltype(cute::make_tiled_mma(typename Ops::PvAtom{}));
  // NOTE: its A fragment holds the elements of TiledMmaQk's C fragment in the same order (both
  // are the m64 accumulator layout), so P converts element by element.
  using TiledMmaPvRs = decltype(cute::make_tiled_mma(typename Ops::PvAtomRs{}));

  // NOTE: Q (72 KB) and two K stages (144 KB) leave 11 KB: no room for two 8 KB P tiles. Each P
  // lives in its block's rope chunk, which only the block's own S GEMM reads.
  struct alignas(1024) SharedMemoryPlan {
    alignas(1024) T q[kRows * kD];           // query tile, SmemLayoutQ (padding rows 0)
    alignas(1024) T k[kStages][kKeys * kD];  // K blocks, SmemLayoutK (V: SmemLayoutV; P: rope)
    float max[2][2][kRows];    // [round parity][consumer] running max after its block (base 2)
    float scale[2][2][kRows];  // [round parity][consumer] exp2(previous max - that max)
                               // (sparse calls: [stage][0], the factor of the stage's block)
    float row_sum[kRows];      // second consumer's row sums at the end
    // A one-segment request's rows, set while its query tile loads: offsets in out (-1: not
    // written) and lse (-1: none), the head's sink logit (-inf: none); out_scale holds the bmm2
    // scale until the segment's end, then what O is multiplied by (RowOutput).
    int64_t out_row[kRows];
    int64_t lse_row[kRows];
    float out_sink[kRows];
    float out_scale[kRows];
    const uint4* query_row[kRows];  // the query tile's row addresses (null: padding)
    uint32_t query_max[kRows];      // scaled query (seesaw_kernel.cuh): rows' largest |value| bits
    float query_unscale[kRows];     // scaled query: 2^-s, the inverse of the row's fp16 scale
    // Sparse calls (tma/gather.cuh): the block's entries (-1: no key; 0 past the counted ones),
    // and fp8_ds_mla's scales of each producer warp's two chunks.
    int32_t slot[kStages][kKeys];
    float scales[kStages][4][2][kKeys];
    uint64_t full[kStages][kChunks];    // 64-column chunk landed (transaction bytes) or widened
    uint64_t landed[kStages][kChunks];  // fp8 cache: the chunk's e4m3 bytes landed
    uint64_t empty_l[kStages];  // chunks 0..3 (V_L) consumed: one arrive per consumer-0 warp
    uint64_t empty_r[kStages];  // chunks 4..8 (V_R, rope / P) consumed: one per consumer-1 warp
    uint64_t q_full;            // the query tile's boxes landed (query tensor map: p.query_tma)
  };
  // NOTE: dynamic shared memory is only 16-byte aligned: 1 KB of slack to align the plan.
  static constexpr size_t kSmemBytes = sizeof(SharedMemoryPlan) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one sm90 CTA");
  // A one-segment request's out rows are staged in the query tile's bytes as [row][kOutPitch]
  // 16-bit values; the 16 bytes of padding put a warp's 8 rows of stores in different banks.
  static constexpr int kOutPitch = kL * 2 + 16;
  static_assert(kOutPitch * kRows <= sizeof(T) * kRows * kD, "out staging in the query tile");
};

}  // namespace mla::sm90::seesaw
