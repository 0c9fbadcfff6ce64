// Tile sizes, GMMA shapes and the shared-memory plan of the few-rows decode kernel.
#pragma once

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "sm90/params.h"

namespace mla::sm90::few_rows {

// The CuTe element type and the two GMMA atoms of each supported 16-bit format, for N = kRows
// padded query rows. Both GEMMs are transposed against the seesaw kernel's: the 64 keys of a block
// are M.
template <Elem E, int kRows>
struct GmmaOps;
template <>
struct GmmaOps<Elem::kBf16, 16> {
  using Type = cute::bfloat16_t;
  // S^T = K Q^T: A = K block (K-major), B = Q tile (K-major).
  using QkAtom =
      cute::SM90::GMMA::MMA_64x16x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
  // O^T += V^T P^T: A = V^T, the K block's first 512 columns read MN-major; B = P (K-major).
  using PvAtom =
      cute::SM90::GMMA::MMA_64x16x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};
template <>
struct GmmaOps<Elem::kBf16, 32> {
  using Type = cute::bfloat16_t;
  using QkAtom =
      cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using PvAtom =
      cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};
template <>
struct GmmaOps<Elem::kFp16, 16> {
  using Type = cute::half_t;
  using QkAtom =
      cute::SM90::GMMA::MMA_64x16x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using PvAtom =
      cute::SM90::GMMA::MMA_64x16x16_F32F16F16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};
template <>
struct GmmaOps<Elem::kFp16, 32> {
  using Type = cute::half_t;
  using QkAtom =
      cute::SM90::GMMA::MMA_64x32x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using PvAtom =
      cute::SM90::GMMA::MMA_64x32x16_F32F16F16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};

// e4m3 query and cache on the FP8 tensor cores (docs/sm90-fp8.md, fp8 query and cache in the
// few-rows kernel): S^T = K Q^T reads both operands from shared memory (both K-major there), and
// O^T += V^T P^T takes V^T from registers (loaded transposed: fp8 wgmma reads no MN-major operand
// from shared memory), P from shared memory.
template <>
struct GmmaOps<Elem::kFp8E4M3, 16> {
  using Type = cute::float_e4m3_t;
  using QkAtom = cute::SM90::GMMA::MMA_64x16x32_F32E4M3E4M3_SS_TN<>;
  using PvAtom = cute::SM90::GMMA::MMA_64x16x32_F32E4M3E4M3_RS_TN<>;
};
template <>
struct GmmaOps<Elem::kFp8E4M3, 32> {
  using Type = cute::float_e4m3_t;
  using QkAtom = cute::SM90::GMMA::MMA_64x32x32_F32E4M3E4M3_SS_TN<>;
  using PvAtom = cute::SM90::GMMA::MMA_64x32x32_F32E4M3E4M3_RS_TN<>;
};

// A bf16 query over an e4m3 cache read as it lands: fp16 GEMMs (e4m3 widens to fp16 in one
// instruction per pair, to bf16 in four; the query is scaled per row into fp16's range:
// tma::load_query_tile_rows, kPermute16) with their A operands (the K block for S^T, V^T for O^T)
// widened from the e4m3 stage into registers (the RS form); B from shared memory (the query tile,
// P).
template <int kRows>
struct GmmaOpsRegs {
  using Type = cute::half_t;
  using QkAtom = std::conditional_t<
      kRows == 16,
      cute::SM90::GMMA::MMA_64x16x16_F32F16F16_RS<cute::GMMA::Major::K, cute::GMMA::Major::K>,
      cute::SM90::GMMA::MMA_64x32x16_F32F16F16_RS<cute::GMMA::Major::K, cute::GMMA::Major::K>>;
  using PvAtom = QkAtom;
};

// Named barriers (id 0 is __syncthreads). Per-consumer barriers are `first + consumer index` for
// consumers 0 and 1, the `...Third` ones for consumer 2 (few_rows_kernel.cuh, barrier_id).
enum class NamedBarrier : uint32_t {
  kConsumers = 1,  // every consumer warpgroup (256 or 384 threads)
  kMaxFirst = 2,   // block maxima of consumer warpgroup 0 exchanged between its 4 warps (128)
  kMaxSecond = 3,
  kPFirst = 4,  // P of consumer warpgroup 0 stored (128 threads)
  kPSecond = 5,
  kVoteFirst = 6,  // skip-softmax vote of consumer warpgroup 0 (128 threads)
  kVoteSecond = 7,
  kWiden = 8,       // producer warps 1..3 widening an fp8 chunk (tma/fp8_ring.cuh; 96 threads)
  kLocalFirst = 9,  // consumer warpgroup 0 alone (128 threads), before each segment-end hand-off
  kLocalSecond = 10,
  kMaxThird = 11,  // consumer warpgroup 2 of three (kConsumersN 3)
  kPThird = 12,
  kVoteThird = 13,
  kLocalThird = 14,
};

// E: the GEMMs' element type. kRegsA (E fp16): the stages hold an e4m3 cache that the GEMMs take
// from registers (GmmaOpsRegs). kDsMla (with kRegsA, 16 rows): the stages hold a sparse call's
// fp8_ds_mla rows as they land (docs/sm90-sparse.md, fp8_ds_mla rows read as they land), whole at
// kRowPitchN 656; P goes to shared memory once per group, scaled by the keys' group scales.
// kRowPitchN (with kRegsA): the stages hold each cache row whole at that pitch, as one bulk copy
// lands it (tma::gather_rows_bulk): key k's byte b at k * kRowPitchN + b, every operand read
// through ldmatrix; 0: the 64-column chunks of the 64-byte swizzle a TMA box writes. kDeepRing
// (E e4m3): four stages instead of two (below, kStages). kConsumersN: consumer warpgroups, two, or
// three for a dense call's e4m3 cache widened in registers at 16 rows (below, kConsumers).
template <Elem E, int kRowsN, bool kRegsA = false, bool kDsMla = false, int kRowPitchN = 0,
          bool kDeepRing = false, int kConsumersN = 2>
struct FewRowsTraits {
  static_assert(!kRegsA || E == Elem::kFp16, "registers widen e4m3 to fp16");
  static_assert(!kDsMla || (kRegsA && kRowsN == 16 && kRowPitchN == 656),
                "fp8_ds_mla as it lands: 16 rows, whole");
  static_assert(kRowPitchN == 0 || kRegsA, "whole rows: the GEMMs' A operands from registers");
  using Ops = std::conditional_t<kRegsA, GmmaOpsRegs<kRowsN>, GmmaOps<E, kRowsN>>;
  using T = typename Ops::Type;
  // e4m3 operands on the FP8 tensor cores: 64-byte rows per chunk (64-byte swizzle), k steps of
  // 32; 16-bit operands: 128-byte rows (128-byte swizzle), k steps of 16.
  static constexpr bool kFp8 = E == Elem::kFp8E4M3;
  static constexpr int kStepK = kFp8 ? 32 : 16;
  // Bytes of one cache value in a stage: e4m3 blocks land as they are (kFp8, kRegsA).
  static constexpr int kStageElemBytes = kFp8 || kRegsA ? 1 : 2;

  // Consumer warpgroup c takes the blocks i with i % kConsumers == c. Three where the consumers'
  // chains bound the block rate: an e4m3 cache widened in registers (kRegsA: per-tensor e4m3, or
  // a sparse call's fp8_ds_mla rows) at 16 rows, whose O^T (64 registers) leaves room for three
  // warpgroups of 152 or 160 registers; one stage each (docs/sm90-fp8.md, the few-rows kernel's
  // three consumers).
  static constexpr int kConsumers = kConsumersN;
  static_assert(kConsumers == 2 || (kConsumers == 3 && kRegsA && kRowsN == 16 && !kDeepRing),
                "three consumers: an e4m3 cache widened in registers, 16 rows");
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + consumers
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kRows = kRowsN;  // padded query rows per CTA (GEMM N)
  static constexpr int kKeys = 64;      // keys per block (one pipeline stage, GEMM M of S^T)
  static constexpr int kD = 576;        // key width: kv_lora_rank 512 + rope 64
  static constexpr int kL = 512;        // value width
  // Two consumers: consumer c takes every block of parity c with its own online softmax, stage s
  // the blocks of parity s (three consumers: a stage each). kRegsA (36 KB e4m3 stages, consumers
  // busy widening): four stages, consumer c's blocks alternating between stages c and c + 2, so
  // that each consumer has a block landing while it widens another (B128 H16 -2.5%; on an H200
  // two stages cost 4 to 9%, Change 133). The e4m3 GEMMs take four where the route expects a
  // CTA's segments to hold many blocks (kDeepRing: twice the bytes in flight, B128 H16 -6% on an
  // H200), two where they are short (four cost a CTA of ~8 blocks ~0.7 us; docs/perf-notes.md,
  // Change 132).
  static_assert(!kDeepRing || (E == Elem::kFp8E4M3 && !kRegsA), "the e4m3 GEMMs' choice");
  static constexpr int kStages = kConsumers == 3 ? 3 : kRegsA || kDeepRing ? 4 : 2;
  static constexpr int kChunkCols = 64;  // one swizzle atom row: 128 bytes (16-bit), 64 (e4m3)
  static constexpr int kChunks = kD / kChunkCols;
  // The chunk producer's split of a stage: chunks 0..3 go back after the first half of P V,
  // chunks 4..8 after the second half (both released by the stage's one consumer).
  static constexpr int kLeftChunks = 4;
  static constexpr int kColsPerThread = kRows / 4;  // query rows per thread in a 64 x N fragment
  static_assert(kChunks == kL / kChunkCols + 1, "one rope chunk of 64 columns");
  static_assert(kRows == 16 || kRows == 32, "N of the GMMA atoms instantiated above");
  // Three consumers over fp8_ds_mla rows (a sparse call's gather: the producer only issues one
  // bulk copy a row) take 160 registers and leave the producer 32: at 152 the group scales
  // spilled, 11 reloads a block (docs/perf-notes.md, Change 139).
  static constexpr int kProducerRegs = kConsumers == 3 && kDsMla ? 32 : 40;
  static constexpr int kConsumerRegs = kConsumers == 3 ? (kDsMla ? 160 : 152) : 232;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register file");

  // Shared-memory layouts: 64-column chunks of swizzled rows (128-byte swizzle for 16-bit
  // values, 64-byte for e4m3), chunk after chunk; a TMA box of 64 columns x n rows with the same
  // swizzle writes exactly these bytes.
  using KAtom = std::conditional_t<kFp8, cute::GMMA::Layout_K_SW64_Atom<T>,
                                   cute::GMMA::Layout_K_SW128_Atom<T>>;
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kRows>, cute::Int<kD>>{}));
  using SmemLayoutK =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kKeys>, cute::Int<kD>>{}));
  // 16-bit: V^T (L x keys) is the K block's first 512 columns read MN-major: the same bytes.
  // (e4m3: V^T goes through registers, few_rows_kernel.cuh, load_fp8_v_fragment.)
  using SmemLayoutV = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<std::conditional_t<kFp8, cute::half_t, T>>{},
      cute::Shape<cute::Int<kL>, cute::Int<kKeys>>{}, cute::Step<cute::_2, cute::_1>{}));
  // P (rows x keys), the B operand P^T read K-major.
  using SmemLayoutP =
      decltype(cute::tile_to_shape(KAtom{}, cute::Shape<cute::Int<kRows>, cute::Int<kKeys>>{}));

  // At a segment's end the stage of consumer c's last block holds its O^T as [kRows][kMergeStride]
  // fp32, in kMergePasses passes of kMergeCols columns (two where [32][516] floats do not fit an
  // e4m3 stage); the 4 floats of padding put the 4 column pairs of a warp's stores in different
  // banks. A stage holds a K block or that, whichever is larger.
  static constexpr int kMergePasses = kStages == 4 && kRows == 32 ? 2 : 1;
  static constexpr int kMergeCols = kL / kMergePasses;
  static constexpr int kMergeStride = kMergeCols + 4;
  static constexpr int kRowPitch = kRowPitchN;
  // NOTE: at a pitch of 16 bytes times an odd number, the 8 keys an ldmatrix matrix reads (in a
  // row at the same column) fall in 8 different 16-byte bank groups: no conflict.
  static_assert(kRowPitch == 0 || (kRowPitch % 32 == 16 && kRowPitch >= kD),
                "an odd 16-byte pitch");
  static constexpr int kBlockBytes = kRowPitch > 0 ? kKeys* kRowPitch : kKeys* kD* kStageElemBytes;
  static constexpr int kStageBytes =
      (cute::max(kBlockBytes, kMergeStride* kRows * 4) + 1023) / 1024 * 1024;
  // kDsMla: P^T once per latent group (B operands of the group's two m tiles).
  static constexpr int kPTiles = kDsMla ? 4 : 1;

  using TiledMmaQk = decltype(cute::make_tiled_mma(typename Ops::QkAtom{}));
  using TiledMmaPv = decltype(cute::make_tiled_mma(typename Ops::PvAtom{}));
  // kDsMla (16 rows): S^T's rope part, bf16 x bf16 with K_rope from registers (ldmatrix of the
  // rows' bf16 rope bytes) and the query tile's rope chunk stored in bf16
  // (tma::load_query_tile_rows, kRopeBf16).
  using TiledMmaRope = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x16x16_F32BF16BF16_RS<cute::GMMA::Major::K, cute::GMMA::Major::K>{}));
  using SmemLayoutRopeQ =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<cute::bfloat16_t>{},
                                   cute::Shape<cute::Int<kRows>, cute::Int<64>>{}));

  struct alignas(1024) SharedMemoryPlan {
    alignas(1024) T q[kRows * kD];  // query tile, SmemLayoutQ (padding rows 0)
    alignas(1024) T k[kStages][kStageBytes / sizeof(T)];    // K blocks, SmemLayoutK
    alignas(1024) T p[kConsumers][kPTiles][kRows * kKeys];  // [consumer][group] P, SmemLayoutP
    float max[kConsumers][2][4][kRows];  // [consumer][block parity][warp] the warp's block max
    float sum[kConsumers][4][kRows];  // [consumer][warp] row sums over the warp's keys, at the end
    float final_max[kConsumers][kRows];  // [consumer] running max at the end
    int64_t out_row[kRows];              // the row's offset in out (one split; -1: not written) or
    float out_scale[kRows];              // partial_o, and what its O is multiplied by
    const uint4* query_row[kRows];       // the query tile's row addresses (null: padding)
    uint32_t query_max[kRows];           // kRegsA: the query rows' largest |value| (float bits)
    float query_unscale[kRows];          // kRegsA: 2^-s, the inverse of the row's fp16 scale
    // The consumers' current segment (few_rows_kernel.cuh, SegmentState), written by consumer
    // thread 0 at its start and read where needed, not held in registers across its blocks.
    alignas(16) uint8_t segment[128];
    // Sparse calls (tma/gather.cuh): the block's entries (-1: no key; 0 past the counted ones),
    // and fp8_ds_mla's scales of each producer warp's two chunks.
    int32_t slot[kStages][kKeys];
    float scales[kStages][4][2][kKeys];
    // kDsMla: each consumer warp's largest group scales of the block's keys, [consumer][block
    // parity][warp][group].
    alignas(16) float ds_max[kConsumers][2][4][4];
    uint64_t full[kStages][kChunks];    // 64-column chunk landed (transaction bytes) or widened
    uint64_t landed[kStages][kChunks];  // fp8 cache: the chunk's e4m3 bytes landed
    // Chunks 0..3 / 4..8 consumed: one arrive per consumer warp (an e4m3 cache read as it lands:
    // per consumer thread).
    uint64_t empty_l[kStages];
    uint64_t empty_r[kStages];
    // kPairMerge (few_rows_kernel.cuh): what the other split's partial o is multiplied by, per row,
    // and the barrier on which the cluster's rank 1 says its partial is stored (rank 0's).
    float other_scale[kRows];
    uint64_t merge_bar;
  };
  // NOTE: dynamic shared memory is only 16-byte aligned: 1 KB of slack to align the plan.
  static constexpr size_t kSmemBytes = sizeof(SharedMemoryPlan) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one sm90 CTA");
};

}  // namespace mla::sm90::few_rows
