// Tile sizes, GMMA shapes and the shared-memory plan of the v1 split-KV decode kernel.
#pragma once

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <cstddef>
#include <cstdint>

#include "sm90/decode/v1/launch.h"
#include "sm90/params.h"

namespace mla::sm90::v1 {

// The CuTe element type and the two GMMA atoms of each supported 16-bit format.
template <Elem E>
struct GmmaOps;
template <>
struct GmmaOps<Elem::kBf16> {
  using Type = cute::bfloat16_t;
  // S = Q K^T: A = Q (K-major), B = K block (K-major).
  using QkAtom =
      cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
  // O += P V: A = P (K-major), B = V, the same bytes as the K block read MN-major.
  using PvAtom =
      cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>;
};
template <>
struct GmmaOps<Elem::kFp16> {
  using Type = cute::half_t;
  using QkAtom =
      cute::SM90::GMMA::MMA_64x32x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using PvAtom =
      cute::SM90::GMMA::MMA_64x256x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>;
};

// Named barriers (id 0 is __syncthreads).
enum class NamedBarrier : uint32_t {
  kConsumers = 1,   // both consumer warpgroups (256 threads)
  kVoteFirst = 2,   // skip-softmax vote of consumer warpgroup 0 (128 threads)
  kVoteSecond = 3,  // ... of consumer warpgroup 1
};

template <Elem E>
struct SplitKvTraits {
  using Ops = GmmaOps<E>;
  using T = typename Ops::Type;

  static constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
  static constexpr int kConsumerThreads = 256;
  static constexpr int kRows = kTileRows;   // query rows per CTA
  static constexpr int kKeys = kBlockKeys;  // keys per block (one pipeline stage)
  static constexpr int kD = 576;            // key width: kv_lora_rank 512 + rope 64
  static constexpr int kL = 512;            // value width
  static constexpr int kStages = 2;
  static constexpr int kKeysPerWg = kKeys / 2;  // each consumer scores half the block's keys
  static constexpr int kColsPerWg = kL / 2;     // and owns half of O's columns
  static constexpr int kChunkCols = 64;         // one 128-byte swizzle atom row of 16-bit values
  static constexpr int kChunks = kD / kChunkCols;
  static_assert(kChunks == kL / kChunkCols + 1, "one rope chunk of 64 columns");
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

  struct alignas(1024) SharedMemoryPlan {
    alignas(1024) T q[kRows * kD];           // query tile, SmemLayoutQ (padding rows 0)
    alignas(1024) T k[kStages][kKeys * kD];  // K blocks, SmemLayoutK (V: SmemLayoutV)
    alignas(1024) T p[kRows * kKeys];        // exp(S - max), SmemLayoutP
    float block_max[2][2][kRows];            // [parity][consumer] row max of its keys
    float row_sum[kRows];                    // second consumer's row sums at the end
    uint64_t full[kStages];                  // K block landed (transaction bytes)
    uint64_t empty[kStages];                 // K block consumed (one arrive per consumer warp)
  };
  // NOTE: dynamic shared memory is only 16-byte aligned: 1 KB of slack to align the plan.
  static constexpr size_t kSmemBytes = sizeof(SharedMemoryPlan) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one sm90 CTA");
};

}  // namespace mla::sm90::v1
