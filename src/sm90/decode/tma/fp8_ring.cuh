// The K-block ring of the TMA kernels over an fp8 (e4m3) cache: each block's e4m3 bytes land in
// the upper half of its 16-bit stage (the seesaw kernel: the left half's in the upper half of V_L,
// once V_L is free), and warps 1..3 of the producer warpgroup widen them in place, chunk by chunk,
// into the 16-bit layout the consumers read (docs/sm90-fp8.md). The consumers' code is the 16-bit
// kernels' own: they wait on the same full barriers, which the widening warps complete instead of
// the copy engine.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"
#include "sm90/decode/tma/widen.cuh"

namespace mla::sm90::tma {

// The storage formats of one TMA-kernel instantiation and the 16-bit type its GEMMs run in: a bf16
// query keeps bf16 GEMMs (an fp8 cache is widened to bf16; the dense kernels run fp16 GEMMs over a
// scaled query instead: seesaw_kernel.cuh, few_rows_kernel.cuh); an fp8 query runs fp16 GEMMs (e4m3
// values are exact in fp16 as in bf16, and fp16 keeps 3 more bits of P). fp8_ds_mla (sparse
// calls, gathered: gather.cuh) has a bf16 query and bf16 GEMMs; kFp8Cache is the TMA fp8 ring's.
template <Elem Q, Elem KV>
struct Formats {
  static_assert((Q == KV && Q != Elem::kFp8DsMla) ||
                    (Q == Elem::kBf16 && (KV == Elem::kFp8E4M3 || KV == Elem::kFp8DsMla)),
                "the (query, kv_cache) pairs of the contract that the TMA kernels take");
  static constexpr bool kFp8Query = Q == Elem::kFp8E4M3;
  static constexpr bool kFp8Cache = KV == Elem::kFp8E4M3;
  static constexpr Elem kCompute = Q == Elem::kBf16 ? Elem::kBf16 : Elem::kFp16;
  static constexpr int kQueryBytes = kFp8Query ? 1 : 2;  // per query element
};

// Producer warps that widen (1..3; warp 0 issues the boxes).
inline constexpr int kWidenWarps = 3;
inline constexpr int kWidenThreads = kWidenWarps * 32;

// Byte offset of a stage's landing area: the e4m3 block (kChunks chunks of 64 keys x 64 bytes,
// unswizzled) takes the upper half of the 16-bit stage. Chunk c widens into bytes
// [8 KB c, 8 KB (c + 1)), which cover e4m3 chunks 2c - 9 and 2c - 8 only: never a chunk that has
// not been read yet, except chunk 8 itself (read whole before it is written).
template <typename Traits>
inline constexpr uint32_t kLandingOffset = Traits::kKeys* Traits::kD;  // 2-byte stage: half
template <typename Traits>
inline constexpr uint32_t kFp8ChunkBytes = Traits::kKeys* Traits::kChunkCols;
// Split landing (`split`; the seesaw kernel, whose consumer 0 releases V_L before consumer 1
// releases the rest): the left half's e4m3 chunks 0..3 land in the upper half of V_L instead,
// bytes [16 KB, 32 KB), once consumer 0 has released V_L, and widen while consumer 1 still holds
// the right half; widened chunk c (< 4) then covers e4m3 chunks 2c - 4 and 2c - 3 only. Chunks
// 4..8 land as above, after consumer 1's release. (The few-rows kernel widens a ring only with
// MLA_SM90_FP8_DIRECT=0, and lands whole there: not measured.)
template <typename Traits>
inline constexpr uint32_t kLeftLandingOffset = 2 * Traits::kKeys * 128;
template <typename Traits>
inline constexpr bool kLeftLandingFits =
    kLeftLandingOffset<Traits> + 4 * kFp8ChunkBytes<Traits> == 4 * Traits::kKeys * 128;
template <typename Traits>
__device__ __forceinline__ uint32_t fp8_landing_of(int c, bool split) {
  return split && c < 4 ? kLeftLandingOffset<Traits> + c * kFp8ChunkBytes<Traits>
                        : kLandingOffset<Traits> + c * kFp8ChunkBytes<Traits>;
}

// Issues the e4m3 boxes of the run's blocks into the stages' landing areas: issuer `piece` (lane
// `piece` of producer warp 0) loads page piece `piece` of every chunk, as produce_chunks does for
// 16-bit caches, but only once both consumers have released the stage (its landing area holds V_R
// and the rope chunk, where P lives, and the widened chunks 0..3 overwrite V_L).
template <typename Traits, bool kEvictFirst = false>
__device__ __forceinline__ void issue_fp8_chunks(const DecodeKernelParams& p, const TileWork& w,
                                                 const CUtensorMap* kv_map,
                                                 typename Traits::SharedMemoryPlan& smem, int piece,
                                                 uint32_t used0, uint32_t used1,
                                                 bool split = false) {
  static_assert(Traits::kStages == 2, "blocks alternate between two stages");
  static_assert(kLeftLandingFits<Traits>, "the left half's e4m3 chunks fill V_L's upper half");
  constexpr int kKeys = Traits::kKeys;
  const int page_rows = min(kKeys, p.page_size);
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.block_table_stride;
  const uint32_t box_bytes = page_rows * Traits::kChunkCols;  // one byte per value
  const int piece_key = piece * page_rows;
  const uint64_t policy = kEvictFirst ? l2_evict_first_policy() : 0;
  for (int block = w.block_begin, it = 0; block < w.block_end; ++block, ++it) {
    const int stage = it & 1;
    const uint32_t phase = ((stage == 0 ? used0 : used1) + (it >> 1)) & 1;
    const int key = block * kKeys + piece_key;
    const bool has = key < w.extent;  // a piece past the extent is neither looked up nor loaded
    const int page = has ? table[key >> p.page_shift] : 0;
    const int row_in_page = key & (p.page_size - 1);
    uint8_t* stage_bytes = reinterpret_cast<uint8_t*>(smem.k[stage]);
    mbar_wait(&smem.empty_l[stage], phase ^ 1);
    if (!split) mbar_wait(&smem.empty_r[stage], phase ^ 1);
#pragma unroll 1
    for (int c = 0; c < Traits::kChunks; ++c) {
      if (split && c == 4) mbar_wait(&smem.empty_r[stage], phase ^ 1);
      uint64_t* bar = &smem.landed[stage][c];
      mbar_arrive_expect_tx(bar, has ? box_bytes : 0u);
      if (has) {
        uint8_t* dst =
            stage_bytes + fp8_landing_of<Traits>(c, split) + piece_key * Traits::kChunkCols;
        if constexpr (kEvictFirst) {
          tma_load_3d_hint(dst, kv_map, bar, p.chunk_box[c], row_in_page, page, policy);
        } else {
          tma_load_3d(dst, kv_map, bar, p.chunk_box[c], row_in_page, page);
        }
      }
    }
  }
}

// Widens the run's blocks as they land, in three rounds per block: in round r, widening warp w
// (0..2, warps 1..3 of the producer warpgroup; `tid` 0 .. kWidenThreads - 1) takes chunk 3r + w
// whole: lane l reads 16-byte pieces l + 32 j (j < 8; piece e: key e / 4, columns 16 (e % 4) ..),
// all eight in flight, and writes the 32 bytes each widens to into the chunk's 128-byte-swizzled
// 16-bit rows; the warp then arrives on the chunk's full barrier once its stores are fenced for
// the async proxy. Keys past the extent (whatever the landing area holds there: TMA skips their
// pages) widen into zeros: the consumers mask those keys, and their V rows must be finite for P V
// (the 16-bit kernels zero them in the consumers; here it costs a branch per chunk and keeps the
// consumers from storing into rows that the widening warps wrote).
// NOTE: whole chunks per warp (eight loads in flight per lane, one fence and one arrive per chunk
// and warp, a barrier per round) replaced three warps splitting every chunk, whose loads' latency
// and nine fences per block were most of the widening time (docs/perf-notes.md).
template <typename Traits>
__device__ __forceinline__ void widen_fp8_chunks(const TileWork& w,
                                                 typename Traits::SharedMemoryPlan& smem, int tid,
                                                 uint32_t used0, uint32_t used1, uint32_t barrier,
                                                 bool split = false) {
  using T16 =
      std::conditional_t<std::is_same_v<typename Traits::T, cute::half_t>, __half, __nv_bfloat16>;
  constexpr int kPieces = kFp8ChunkBytes<Traits> / 16;  // 256 per chunk
  constexpr int kPerLane = kPieces / 32;                // 8
  constexpr int kRounds = Traits::kChunks / kWidenWarps;
  static_assert(Traits::kChunks % kWidenWarps == 0, "every round widens one chunk per warp");
  static_assert(Traits::kKeys * 128 / kPerLane == 1024, "rows 8 j apart: 1 KB per piece step");
  const int warp = tid >> 5, lane = tid & 31;
  // A lane's pieces sit in the same columns of rows lane / 4 + 8 j, whose swizzle phase
  // (row % 8 = lane / 4) is the same: one pair of destination offsets per lane.
  const int key0 = lane >> 2, unit = 2 * (lane & 3);
  const uint32_t dst_lo = key0 * 128 + ((unit ^ key0) << 4);
  const uint32_t dst_hi = key0 * 128 + (((unit + 1) ^ key0) << 4);
  // The stages' phases at the run's start, one bit each: one register across the loop, not two
  // (the few-rows kernel's segment walk left a lane of 56 registers short).
  const uint32_t phases = (used0 & 1) | ((used1 & 1) << 1);
  const int num_blocks = w.block_end - w.block_begin;
  static_assert(kRounds == 3, "the split landing's rounds: {0, 1, 2}, {3, 4, 5}, {6, 7, 8}");
#pragma unroll 1
  for (int it = 0; it < num_blocks; ++it) {
    const int stage = it & 1;
    const uint32_t phase = ((phases >> stage) + (it >> 1)) & 1;
    uint8_t* bytes = reinterpret_cast<uint8_t*>(smem.k[stage]);
    const int left = w.extent - (w.block_begin + it) * Traits::kKeys;  // keys before the extent
#pragma unroll 1
    for (int r = 0; r < kRounds; ++r) {
      const int c = r * kWidenWarps + warp;
      mbar_wait(&smem.landed[stage][c], phase);
      const uint8_t* src = bytes + fp8_landing_of<Traits>(c, split) + lane * 16;
      uint4 v[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) v[j] = *reinterpret_cast<const uint4*>(src + j * 512);
      // NOTE: a branch, not a select per piece: the widening is the producer's critical path, and
      // a select per widened piece cost 8.5% at B128 q1 H128 (docs/perf-notes.md).
      if (left < Traits::kKeys) {
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          if (key0 + 8 * j >= left) v[j] = make_uint4(0, 0, 0, 0);  // e4m3 0 widens to 0
        }
      }
      // NOTE: chunk c (>= 4) overwrites e4m3 chunks 2c - 9 and 2c - 8: chunks of earlier rounds
      // or of this one (chunk 8 itself), all read by every warp before this barrier. Split
      // landing: chunk 2 overwrites e4m3 chunks 0 and 1 (this round), chunk 3 chunks 2 (round 0)
      // and 3 (its own, read by every lane of the warp before the warp's sync), chunks 4 and 5
      // nothing, chunks 6..8 as above: no barrier in round 1.
      if (split ? r != 1 : r > 0) {
        named_barrier_sync(barrier, kWidenThreads);
      } else if (split) {
        __syncwarp();
      }
      uint8_t* dst = bytes + c * Traits::kKeys * 128;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        uint4 lo, hi;
        widen_e4m3x16<T16>(v[j], lo, hi);
        *reinterpret_cast<uint4*>(dst + dst_lo + j * 1024) = lo;
        *reinterpret_cast<uint4*>(dst + dst_hi + j * 1024) = hi;
      }
      fence_proxy_async_smem();
      // Every lane arrives (init_ring_barriers: 32 for an e4m3 ring), so that each lane's stores
      // are ordered before the consumers' reads (clean_v_rows) by its own arrive.
      mbar_arrive(&smem.full[stage][c]);
    }
  }
}

// The register split of the TMA kernels' warpgroups with an fp8 cache: a widening lane holds
// eight pieces in flight, which 40 registers do not hold; the consumers keep 224, which their code
// fits without spills. kAhead (the pair's gather, gather.cuh): a producer lane holds the next
// block's 176 bytes of its row (fp8_ds_mla: and the row's scales) in flight (88); the consumers'
// 208 still fit without spills (at 200 ptxas spilled and serialized the wgmma).
// NOTE: setmaxnreg moves registers only within what the CTA got at launch: 384 threads at 168
// registers each (__launch_bounds__), so the three warpgroups' counts may add up to 3 x 168, not
// to the whole register file (an increase beyond that never returns).
template <typename Traits, bool kFp8Cache, bool kAhead = false>
struct RegisterSplit {
  static constexpr uint32_t kProducer = kAhead ? 88 : kFp8Cache ? 56 : Traits::kProducerRegs;
  static constexpr uint32_t kConsumer = kAhead ? 208 : kFp8Cache ? 224 : Traits::kConsumerRegs;
  static_assert(kProducer + 2 * kConsumer <= 3 * 168, "registers the CTA holds at launch");
};

}  // namespace mla::sm90::tma
