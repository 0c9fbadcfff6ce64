// The K-block ring of the TMA kernels filled by gathering cache rows by index (sparse calls): no
// TMA box gathers rows, so the four producer warps copy each block's 64 rows with cp.async, 16
// bytes at a time, straight into the layouts the consumers read (docs/sm90-sparse.md). The
// consumers' code is the dense kernels' own: they wait on the same full barriers.
//
// - 16-bit rows land in the stage's 128-byte-swizzled chunks directly; each thread's copies of a
//   chunk complete one arrival on its full barrier (cp.async.mbarrier.arrive.noinc). Like CUTLASS's
//   cp.async + GMMA mainloops, the consumers' wgmma reads follow the barrier with no proxy fence.
// - e4m3 rows (per-tensor fp8, and fp8_ds_mla's 512 latent values) land unswizzled in the upper
//   half of their own chunk's 16-bit region, and the warp that copied a chunk widens it in place
//   (rows 0..31 into the free lower half first, then rows 32..63 over the landing bytes, all of
//   them read before the first write). No chunk touches another chunk's region, so each warp
//   widens its chunks alone, without a barrier between warps.
// - fp8_ds_mla: the 64 bf16 rope values land in the rope chunk directly; each latent value is
//   multiplied by its group's fp32 scale as it widens, rounded once to bf16.
// The block's entries land in `slot[stage]` too, where the consumers find which keys are -1.
// The few-rows kernel's routes that read e4m3 rows as they land take their own producers:
// per-tensor rows in the 64-byte swizzle (gather_e4m3_direct), fp8_ds_mla rows whole, one bulk copy
// a row (gather_rows_bulk).
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

#include "sm90/common.cuh"
#include "sm90/decode/tma/kv_pipeline.cuh"
#include "sm90/decode/tma/ptx.cuh"
#include "sm90/decode/tma/widen.cuh"

namespace mla::sm90::tma {

// How a cache row of format KV is gathered.
template <Elem KV>
struct GatherFormat {
  static constexpr bool kDsMla = KV == Elem::kFp8DsMla;
  // Lands as e4m3 and is widened: per-tensor fp8 (all 9 chunks) and fp8_ds_mla (the 8 latent
  // chunks; its rope chunk is bf16).
  static constexpr bool kE4m3 = KV == Elem::kFp8E4M3 || kDsMla;
  static constexpr int kElemBytes = kE4m3 ? 1 : 2;  // of kv_page_stride and kv_row_stride
};

// fp8_ds_mla's row: 512 e4m3 latent values, 4 fp32 scales (one per 128 values), 64 bf16 rope
// values (docs/contract.md section 1).
inline constexpr int kDsMlaScaleOffset = 512;
inline constexpr int kDsMlaRopeOffset = 528;
inline constexpr int kDsMlaRowBytes = kDsMlaRopeOffset + 64 * 2;  // 656

// Arrivals that complete chunk c's full barrier: one per producer thread's copies (16-bit rows),
// the one warp that widens it (e4m3 chunks), or one per copying lane of warps 0 and 1
// (fp8_ds_mla's rope chunk).
template <typename Traits, Elem KV>
__host__ __device__ constexpr uint32_t gather_full_arrivals(int c) {
  if constexpr (!GatherFormat<KV>::kE4m3) {
    return 128;
  } else if constexpr (GatherFormat<KV>::kDsMla) {
    return c == Traits::kChunks - 1 ? 64 : 1;
  } else {
    return 1;
  }
}

// Every consumer thread of a gathering kernel arrives on the empty barrier it releases (128 a
// warpgroup), so that each thread's reads of the stage (the block's entries) are ordered before
// the producer's next stores by its own arrive.
inline constexpr uint32_t kGatherReleases = 128;

// The ring's barriers for the gather producer (init_ring_barriers' counterpart, unpaired): full
// barriers counted by gather_full_arrivals, one empty arrive per consumer warp, and (e4m3 rows)
// landed[stage][w]: producer warp w's copies of the block landed, one arrival per lane.
template <typename Traits, Elem KV>
__device__ __forceinline__ void init_gather_barriers(typename Traits::SharedMemoryPlan& smem) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Traits::kStages; ++s) {
      for (int c = 0; c < Traits::kChunks; ++c) {
        mbar_init(&smem.full[s][c], gather_full_arrivals<Traits, KV>(c));
      }
      for (int w = 0; w < 4; ++w) mbar_init(&smem.landed[s][w], 32);
      mbar_init(&smem.empty_l[s], kGatherReleases);
      mbar_init(&smem.empty_r[s], kGatherReleases);
    }
    fence_mbar_init();
  }
  __syncthreads();
}

// Head dims other than (512, 64) (params.h): which of a tile's chunks the call's rows hold, and
// where the rope chunk's columns start in a row. Chunks 0..3 are always there; 4..7 only with L
// 512, the rope chunk (columns L..) only with R 64. A chunk the rows lack lands as zeros: its
// copies read nothing (source size 0) from the row's first bytes.
struct GatherDims {
  bool upper;    // chunks 4..7
  bool rope;     // chunk 8
  int rope_col;  // its first column in a row (0 without one)
};
__device__ __forceinline__ GatherDims gather_dims(const DecodeKernelParams& p) {
  return {p.kv_lora_rank == 512, p.rope_dim > 0, p.rope_dim > 0 ? p.kv_lora_rank : 0};
}

// The cache row of `slot` (page * page_size + offset): its byte offset from p.kv in 16-byte units
// (the route takes only 16-byte-aligned rows; 32 bits reach 64 GB), 0 for slot -1.
__device__ __forceinline__ uint32_t slot_row16(const DecodeKernelParams& p, int slot,
                                               int elem_bytes) {
  if (slot < 0) return 0;
  const int64_t e = static_cast<int64_t>(slot >> p.page_shift) * p.kv_page_stride +
                    static_cast<int64_t>(slot & (p.page_size - 1)) * p.kv_row_stride;
  return static_cast<uint32_t>(e * elem_bytes / 16);
}

__device__ __forceinline__ const uint8_t* row_at(const DecodeKernelParams& p, uint32_t row16) {
  return static_cast<const uint8_t*>(p.kv) + static_cast<uint64_t>(row16) * 16;
}

// Gathers the run's blocks, block `it` into stage it % 2 (phases from used0 and used1 as in
// produce_chunks); `tid` 0..127 over the producer warpgroup. Keys past w.extent and entries of
// -1 land as zeros (their V rows are then 0; the consumers mask their scores).
// kCoupled: a consumer may hold a stage until the next block is ready (the seesaw kernel): e4m3
// rows are then copied and widened as each becomes possible (polled), not in a fixed order.
// kSparse: key j's row is the token's entry j (w.slots); else, a dense call's (the fp8_ds_mla
// cache), position j through the request's block table.
template <typename Traits, Elem KV, bool kCoupled = true, bool kSparse = true>
__device__ __forceinline__ void gather_blocks(const DecodeKernelParams& p, const TileWork& w,
                                              typename Traits::SharedMemoryPlan& smem, int tid,
                                              uint32_t used0, uint32_t used1) {
  using G = GatherFormat<KV>;
  static_assert(Traits::kStages == 2 && Traits::kKeys == 64 && Traits::kChunks == 9,
                "two stages of 64 keys x 9 chunks of 64 columns");
  constexpr int kKeys = Traits::kKeys;
  constexpr uint32_t kChunkBytes = kKeys * 128;  // one 16-bit chunk region
  const int warp = tid >> 5, lane = tid & 31;
  const int num_blocks = w.block_end - w.block_begin;
  auto phase_of = [&](int it) { return (((it & 1) == 0 ? used0 : used1) + (it >> 1)) & 1; };
  // The entry of key `key` of the token (-1 past the counted ones).
  // NOTE: each block's entries are loaded while the previous block waits for its stage: read at
  // the copy, they put an L2 round trip before every block's gather (docs/sm90-sparse.md).
  auto entry = [&](int key) -> int {
    if (key >= w.extent) return -1;
    if constexpr (kSparse) {
      return __ldg(w.slots + key);
    } else {
      const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.block_table_stride;
      return __ldg(table + (key >> p.page_shift)) * p.page_size + (key & (p.page_size - 1));
    }
  };
  // The entries of block `it`'s rows r0 + stride j into rows[j] (-1 past the run).
  auto load_rows = [&](auto& rows, int it, int r0, int stride) {
    constexpr int kRows = sizeof(rows) / sizeof(rows[0]);
    const int key0 = (w.block_begin + it) * kKeys;
#pragma unroll
    for (int j = 0; j < kRows; ++j) rows[j] = it < num_blocks ? entry(key0 + r0 + stride * j) : -1;
  };
  // The block's entries into slot[stage] (keys past the extent: 0), by the lanes given. (Dense
  // calls: nothing; the consumers read the entries of sparse calls only.)
  // NOTE: after the waits on both of the stage's empty barriers, on which every consumer thread
  // arrives after its reads of the stage's previous entries (kGatherReleases): each reader's own
  // arrive orders its reads before these writes (docs/sm90-sparse.md, Sanitizers).
  auto copy_slot = [&](int stage, int key0, int r) {
    if constexpr (kSparse) {
      const int key = key0 + r;
      cp_async_4(&smem.slot[stage][r], key < w.extent ? w.slots + key : w.slots,
                 key < w.extent ? 4u : 0u);
    }
  };

  if constexpr (!G::kE4m3) {
    // ---- 16-bit rows: warp w copies rows 16 w .. 16 w + 15 of every chunk; lane l rows
    // 16 w + l / 8 + 4 j (j < 4), piece l % 8 of each chunk row. Nothing waits for the copies
    // here: their arrivals complete the full barriers. ----
    const GatherDims dims = gather_dims(p);
    const int q = lane & 7;
    const int r0 = 16 * warp + (lane >> 3);
    int next[4];  // the entries of the next block's rows
    auto load_entries = [&](int it) { load_rows(next, it, r0, 4); };
    load_entries(0);
#pragma unroll 1
    for (int it = 0; it < num_blocks; ++it) {
      const int stage = it & 1;
      const uint32_t phase = phase_of(it);
      const int key0 = (w.block_begin + it) * kKeys;
      uint32_t row16[4], n[4], n_upper[4], n_rope[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        row16[j] = slot_row16(p, next[j], G::kElemBytes);
        n[j] = next[j] >= 0 ? 16u : 0u;
        n_upper[j] = dims.upper ? n[j] : 0u;
        n_rope[j] = dims.rope ? n[j] : 0u;
      }
      load_entries(it + 1);
      uint8_t* bytes = reinterpret_cast<uint8_t*>(smem.k[stage]);
      auto copy_chunk = [&](int c) {
        const int col = c < 8 ? 64 * c : dims.rope_col;
        const uint32_t* size = c < 4 ? n : c < 8 ? n_upper : n_rope;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = r0 + 4 * j;
          cp_async_16(bytes + c * kChunkBytes + r * 128 + ((q ^ (r & 7)) << 4),
                      row_at(p, row16[j]) + (size[j] != 0 ? col * 2 : 0) + 16 * q, size[j]);
        }
        cp_async_mbar_arrive(&smem.full[stage][c]);
      };
      mbar_wait(&smem.empty_l[stage], phase ^ 1);
#pragma unroll
      for (int c = 0; c < Traits::kLeftChunks; ++c) copy_chunk(c);
      mbar_wait(&smem.empty_r[stage], phase ^ 1);
      // The entries after both releases (every consumer thread that read the stage's previous
      // entries has arrived on one of them); the right chunks' arrivals cover their copies.
      if (q == 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) copy_slot(stage, key0, r0 + 4 * j);
      }
#pragma unroll
      for (int c = Traits::kLeftChunks; c < Traits::kChunks; ++c) copy_chunk(c);
    }
  } else {
    // ---- e4m3 rows: warp w copies and widens chunks w and w + 4 (and, per-tensor fp8, warp 0
    // the rope chunk 8) of all 64 rows; lane l rows l / 4 + 8 j (j < 8), piece l % 4 of each
    // 64-byte chunk row. Its copies of a block complete landed[stage][w]. ----
    using T16 =
        std::conditional_t<std::is_same_v<typename Traits::T, cute::half_t>, __half, __nv_bfloat16>;
    static_assert(!G::kDsMla || std::is_same_v<T16, __nv_bfloat16>, "fp8_ds_mla: bf16 GEMMs");
    const int q = lane & 3;
    const int r0 = lane >> 2;                         // rows r0 + 8 j: the same swizzle phase r0
    const bool rope_chunk = !G::kDsMla && warp == 0;  // per-tensor fp8: warp 0 widens chunk 8
    const bool rope_copy = G::kDsMla && warp < 2;     // fp8_ds_mla: warps 0 and 1 copy it
    const GatherDims dims = gather_dims(p);
    const int upper_col = dims.upper ? 64 * (warp + 4) : 0;  // this warp's second chunk
    auto landing = [&](uint8_t* bytes, int c) { return bytes + c * kChunkBytes + kKeys * 64; };
    int next[8];  // the entries of the next block's rows
    auto load_entries = [&](int it) { load_rows(next, it, r0, 8); };
    load_entries(0);
    // Copies block `it` into its stage, which the consumers have released.
    auto issue = [&](int it) {
      const int stage = it & 1;
      const int key0 = (w.block_begin + it) * kKeys;
      uint32_t row16[8];
      uint32_t valid = 0;  // bit j: row r0 + 8 j names a key
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        row16[j] = slot_row16(p, next[j], G::kElemBytes);
        valid |= next[j] >= 0 ? 1u << j : 0u;
      }
      load_entries(it + 1);
      auto n_of = [&](int j) { return (valid >> j) & 1 ? 16u : 0u; };
      uint8_t* bytes = reinterpret_cast<uint8_t*>(smem.k[stage]);
      // `live`: valid, or 0 for a chunk the rows lack; `col` its first column (0 then).
      auto copy_chunk = [&](int c, int col, uint32_t live) {
        uint8_t* dst = landing(bytes, c) + lane * 16;  // row r0 + 8 j at 64 (r0 + 8 j) + 16 q
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          cp_async_16(dst + j * 512, row_at(p, row16[j]) + col + 16 * q,
                      (live >> j) & 1 ? 16u : 0u);
        }
      };
      if (warp == 0 && q == 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j) copy_slot(stage, key0, r0 + 8 * j);
      }
      // fp8_ds_mla: the scales of this warp's two groups (its chunks' own).
      if constexpr (G::kDsMla) {
        if (q < 2) {
          const int group = warp / 2 + 2 * q;  // chunk warp (q 0) or warp + 4 (q 1)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            cp_async_4(&smem.scales[stage][warp][q][r0 + 8 * j],
                       row_at(p, row16[j]) + kDsMlaScaleOffset + 4 * group,
                       ((valid >> j) & 1) * 4u);
          }
        }
      }
      copy_chunk(warp, 64 * warp, valid);
      copy_chunk(warp + 4, upper_col, dims.upper ? valid : 0u);
      if (rope_chunk) copy_chunk(8, dims.rope_col, dims.rope ? valid : 0u);
      cp_async_mbar_arrive(&smem.landed[stage][warp]);
      if (rope_copy) {
        const int u = 4 * warp + q;  // 16-byte piece of the 128-byte bf16 rope row
        uint8_t* rope = bytes + 8 * kChunkBytes;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int r = r0 + 8 * j;
          cp_async_16(rope + r * 128 + ((u ^ r0) << 4),
                      row_at(p, row16[j]) + kDsMlaRopeOffset + 16 * u, n_of(j));
        }
        cp_async_mbar_arrive(&smem.full[stage][8]);
      }
    };
    // Lane l's destinations in a widened chunk: rows r0 + 8 j, 16-byte units 2q and 2q + 1, at
    // the row's swizzle phase r0 (1 KB per j).
    const uint32_t dst_lo = r0 * 128 + (((2 * q) ^ r0) << 4);
    const uint32_t dst_hi = r0 * 128 + (((2 * q + 1) ^ r0) << 4);
    auto widen_chunk = [&](uint8_t* bytes, int stage, int c, int g) {
      const uint8_t* src = landing(bytes, c) + lane * 16;
      uint8_t* dst = bytes + c * kChunkBytes;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          v[j] = *reinterpret_cast<const uint4*>(src + (4 * half + j) * 512);
        }
        // NOTE: rows 32..63 widen over the landing bytes: every lane has read them first.
        if (half == 1) __syncwarp();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int jj = 4 * half + j;
          uint4 lo, hi;
          if constexpr (G::kDsMla) {
            widen_scaled_e4m3x16(v[j], smem.scales[stage][warp][g][r0 + 8 * jj], lo, hi);
          } else {
            widen_e4m3x16<T16>(v[j], lo, hi);
          }
          *reinterpret_cast<uint4*>(dst + dst_lo + jj * 1024) = lo;
          *reinterpret_cast<uint4*>(dst + dst_hi + jj * 1024) = hi;
        }
      }
      fence_proxy_async_smem();
      __syncwarp();
      if (cute::elect_one_sync()) mbar_arrive(&smem.full[stage][c]);
    };
    // Widens block `it`, whose copies have landed.
    auto finish = [&](int it) {
      const int stage = it & 1;
      uint8_t* bytes = reinterpret_cast<uint8_t*>(smem.k[stage]);
      widen_chunk(bytes, stage, warp, 0);
      widen_chunk(bytes, stage, warp + 4, 1);
      if (rope_chunk) widen_chunk(bytes, stage, 8, 0);
    };
    // NOTE: the next block is copied as soon as its stage is released and a landed block widened
    // as soon as it lands, whichever comes first: the seesaw kernel's second consumer releases a
    // stage only once it has the next block (docs/sm90-seesaw.md), so a producer that waited for
    // the release before widening that block would wait forever, and one that widened first would
    // hold one block in flight instead of two. The tests are the warp's lane 0's.
    if constexpr (!kCoupled) {
      // The few-rows kernel's consumers release a stage without waiting for the other's block:
      // copy the next block once its stage is free, then widen this one.
      auto wait_free = [&](int it) {
        mbar_wait(&smem.empty_l[it & 1], phase_of(it) ^ 1);
        mbar_wait(&smem.empty_r[it & 1], phase_of(it) ^ 1);
      };
      if (num_blocks > 0) {
        wait_free(0);
        issue(0);
      }
#pragma unroll 1
      for (int it = 0; it < num_blocks; ++it) {
        if (it + 1 < num_blocks) {
          wait_free(it + 1);
          issue(it + 1);
        }
        mbar_wait(&smem.landed[it & 1][warp], phase_of(it));
        finish(it);
      }
      return;
    }
    int issued = 0, finished = 0;
#pragma unroll 1
    while (finished < num_blocks) {
      if (issued < num_blocks && issued <= finished + 1) {
        const int stage = issued & 1;
        const uint32_t phase = phase_of(issued);
        bool ready = mbar_test(&smem.empty_l[stage], phase ^ 1) &&
                     mbar_test(&smem.empty_r[stage], phase ^ 1);
        if (__shfl_sync(0xffffffffu, ready, 0)) {
          issue(issued++);
          continue;
        }
      }
      if (finished < issued) {
        const bool landed = mbar_test(&smem.landed[finished & 1][warp], phase_of(finished));
        if (__shfl_sync(0xffffffffu, landed, 0)) {
          finish(finished++);
          continue;
        }
      }
    }
  }
}

// ---- e4m3 rows landed as they are (the few-rows kernel's kFp8Direct consumers) ----
// Per-tensor fp8 rows go into a stage of kStages (2 or 4) e4m3 blocks, each 64-column chunk of
// 64-byte rows in the 64-byte swizzle a TMA box would have written (swizzled_offset_e4m3): the
// consumers widen or multiply them where they read them (docs/sm90-fp8.md), so the producer only
// copies, and blocks stay in flight until their stages come back. Thread t copies 16-byte piece
// t % 4 of rows t / 4 and t / 4 + 32 of every chunk; each thread's copies of a chunk complete one
// arrival on its full barrier (128 per phase: init_ring_barriers with 128 issuers). Keys past
// w.extent and entries of -1 land as zeros; the block's entries land in slot[stage].
// Block `it` goes to stage it % kStages (the consumers' order: few_rows_kernel.cuh), phase
// (it / kStages) % 2: one segment per CTA (the sparse grid), so nothing carries over.
template <typename Traits>
__device__ __forceinline__ void gather_e4m3_direct(const DecodeKernelParams& p, const TileWork& w,
                                                   typename Traits::SharedMemoryPlan& smem,
                                                   int tid) {
  constexpr int kStages = Traits::kStages;
  constexpr int kKeys = Traits::kKeys;
  constexpr uint32_t kChunkBytes = kKeys * 64;
  static_assert(kKeys == 64 && Traits::kChunks == 9 && Traits::kStageElemBytes == 1,
                "e4m3 stages of 64 keys x 9 chunks of 64 columns");
  const int u = tid & 3;
  const int r0 = tid >> 2;  // rows r0 and r0 + 32 (the same swizzle phase)
  const uint32_t dst = static_cast<uint32_t>(swizzled_offset_e4m3(r0, 16 * u, kKeys));
  const GatherDims dims = gather_dims(p);
  const int num_blocks = w.block_end - w.block_begin;
  auto entry = [&](int key) -> int { return key < w.extent ? __ldg(w.slots + key) : -1; };
  int next[2];  // the entries of the next block's rows
  auto load_entries = [&](int it) {
    const int key0 = (w.block_begin + it) * kKeys;
#pragma unroll
    for (int j = 0; j < 2; ++j) next[j] = it < num_blocks ? entry(key0 + r0 + 32 * j) : -1;
  };
  load_entries(0);
#pragma unroll 1
  for (int it = 0; it < num_blocks; ++it) {
    const int stage = it % kStages;
    const uint32_t phase = (it / kStages) & 1;
    const int key0 = (w.block_begin + it) * kKeys;
    const uint8_t* row[2];
    uint32_t n[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      row[j] = row_at(p, slot_row16(p, next[j], 1));
      n[j] = next[j] >= 0 ? 16u : 0u;
    }
    load_entries(it + 1);
    uint8_t* bytes = reinterpret_cast<uint8_t*>(smem.k[stage]);
    // Chunk c from column `col` of each row (size 0: a chunk the rows lack lands as zeros).
    auto copy_chunk = [&](int c, int col, bool live) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t size = live ? n[j] : 0u;
        cp_async_16(bytes + c * kChunkBytes + dst + j * (32 * 64),
                    row[j] + (size != 0 ? col + 16 * u : 0), size);
      }
      cp_async_mbar_arrive(&smem.full[stage][c]);
    };
    mbar_wait(&smem.empty_l[stage], phase ^ 1);
#pragma unroll
    for (int c = 0; c < Traits::kLeftChunks; ++c) copy_chunk(c, 64 * c, true);
    mbar_wait(&smem.empty_r[stage], phase ^ 1);
    // The entries after both releases (every consumer thread read the stage's previous entries
    // before its arrives); the right chunks' arrivals publish them.
    if (u == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = key0 + r0 + 32 * j;
        cp_async_4(&smem.slot[stage][r0 + 32 * j], key < w.extent ? w.slots + key : w.slots,
                   key < w.extent ? 4u : 0u);
      }
    }
#pragma unroll
    for (int c = Traits::kLeftChunks; c < 8; ++c) copy_chunk(c, 64 * c, dims.upper);
    copy_chunk(8, dims.rope_col, dims.rope);
  }
}

// ---- fp8_ds_mla rows landed whole, one bulk copy each (FewRowsTraits::kRowPitch) ----
// Thread r (0..63) of the producer warpgroup lands row r of every block at r * kRowPitch of the
// block's stage with one cp.async.bulk of its 656 bytes as the cache holds them (latent e4m3 at 0,
// the four group scales at 512, the bf16 rope at 528; docs/sm90-sparse.md, fp8_ds_mla rows read as
// they land), which the consumers read through ldmatrix. Each thread's arrive on the stage's full
// barrier (chunk 0's, 64 arrivals) carries its row's bytes and publishes its entry in
// slot[stage]; the block lands whole. The rows of -1 entries and of keys past w.extent are zeroed
// by the thread's stores. Block `it` goes to stage it % kStages, phase (it / kStages) % 2 (one
// segment per CTA, as gather_e4m3_direct).
template <typename Traits>
__device__ __forceinline__ void gather_rows_bulk(const DecodeKernelParams& p, const TileWork& w,
                                                 typename Traits::SharedMemoryPlan& smem, int r) {
  constexpr int kStages = Traits::kStages;
  constexpr int kKeys = Traits::kKeys;
  constexpr int kPitch = Traits::kRowPitch;
  constexpr uint32_t kRowBytes = kDsMlaRowBytes;
  static_assert(kKeys == 64 && kPitch >= kRowBytes && Traits::kStageElemBytes == 1,
                "stages of 64 whole fp8_ds_mla rows");
  const int num_blocks = w.block_end - w.block_begin;
  auto entry = [&](int it) {
    const int key = (w.block_begin + it) * kKeys + r;
    return key < w.extent ? __ldg(w.slots + key) : -1;
  };
  int next = entry(0);
#pragma unroll 1
  for (int it = 0; it < num_blocks; ++it) {
    const int stage = it % kStages;
    const uint32_t phase = (it / kStages) & 1;
    const int key = (w.block_begin + it) * kKeys + r;
    const int e = next;
    if (it + 1 < num_blocks) next = entry(it + 1);
    uint8_t* dst = reinterpret_cast<uint8_t*>(smem.k[stage]) + r * kPitch;
    uint64_t* bar = &smem.full[stage][0];
    mbar_wait(&smem.empty_l[stage], phase ^ 1);
    mbar_wait(&smem.empty_r[stage], phase ^ 1);
    // After both releases: every consumer thread read the stage's previous entries before its
    // arrive. This thread's arrive below publishes it.
    smem.slot[stage][r] = key < w.extent ? e : 0;
    if (e >= 0) {
      mbar_arrive_expect_tx(bar, kRowBytes);
      bulk_copy_g2s(dst, row_at(p, slot_row16(p, e, 1)), kRowBytes, bar);
    } else {
      // NOTE: zeros by generic stores (a bulk copy from a zero row in this CTA's shared memory
      // faulted outside a cluster launch), fenced for the next bulk copy into the same bytes.
      for (uint32_t b = 0; b < kRowBytes; b += 16) {
        *reinterpret_cast<uint4*>(dst + b) = uint4{0, 0, 0, 0};
      }
      fence_proxy_async_smem();
      mbar_arrive(bar);
    }
  }
}

// ---- e4m3 rows loaded ahead into registers (docs/sm90-sparse.md, Pairs) ----
// Rows are plain global loads into registers, issued one block ahead (a stage's release is not
// followed by a DRAM round trip), widened there and stored into the stage. Eight lanes hold one
// row's chunk, each the 8 e4m3 bytes of one 16-byte unit of its 128-byte chunk row, so that each
// store instruction of a warp covers four whole chunk rows, 512 bytes in a row.
// - kPair: the two tiles of a sparse token with more than 64 heads run as a cluster of two CTAs
//   that read the same blocks. Rank r gathers rows 32 r .. 32 r + 31 of every block and stores
//   each unit into its own stage and, with st.async, into the other CTA's (which completes that
//   CTA's full barrier by bytes). Each row crosses from L2 once and each CTA's producer widens
//   half the rows. No producer thread fences: the consumers fence after their waits.
// - unpaired: the few-rows kernel's sparse calls gather all 64 rows in one producer warpgroup,
//   four a lane; the seesaw kernel's (kHalfRows) in two, two rows a lane each (rows
//   32 rank .. 32 rank + 31, as a pair's ranks), into the CTA's own stages only.

// How the producer threads publish a chunk of gather_ahead_blocks:
// - fp8_ds_mla (kEachArrives): every producer thread arrives on the chunk's full barrier after
//   its own stores of the chunk (and, for chunk kSlotChunk, of its rows' entries): one arrive
//   instruction a warp, no branch, and each thread's arrive publishes its own writes (B128 H128
//   -3.1%, Changes 97 and 98).
// - per-tensor e4m3: lane 0 of each warp arrives after the warp's sync, and for chunk kSlotChunk
//   also the slot writers (every thread's arrive measured 1.4 to 5.1% slower there).
template <Elem KV>
inline constexpr bool kEachArrives = GatherFormat<KV>::kDsMla;
// Lanes of a producer warp that write the block's entries of their rows (units 0).
inline constexpr uint32_t kSlotWriters = 4;
// The chunk whose full barrier publishes the entries: the first one stored after both releases.
inline constexpr int kSlotChunk = 4;

// The ring barriers of gather_ahead_blocks: full[s][c] completes on its local arrivals (above;
// kPair: the first arrival also expects the other CTA's 4 KB of the chunk, and chunk
// kSlotChunk's the other CTA's 128 bytes of entries too, and those bytes); a stage is refilled
// once the consumer warps (kPair: of both CTAs) have released it.
// kProducers: the producer warpgroups (two split each block's rows: gather_ahead_blocks'
// kHalfRows), whose threads all arrive (kEachArrives).
template <typename Traits, Elem KV, bool kPair, int kProducers = 1>
__device__ __forceinline__ void init_gather_ahead_barriers(
    typename Traits::SharedMemoryPlan& smem) {
  static_assert(kProducers == 1 || (!kPair && kEachArrives<KV>),
                "two producer warpgroups: unpaired fp8_ds_mla rows");
  if (threadIdx.x == 0) {
    for (int s = 0; s < Traits::kStages; ++s) {
      for (int c = 0; c < Traits::kChunks; ++c) {
        mbar_init(&smem.full[s][c], kEachArrives<KV>  ? 128 * kProducers
                                    : c == kSlotChunk ? 4 * kSlotWriters
                                                      : 4);
      }
      // This CTA's consumer threads, and (kPair) one arrive per consumer warp of the other CTA.
      mbar_init(&smem.empty_l[s], kGatherReleases + (kPair ? 4 : 0));
      mbar_init(&smem.empty_r[s], kGatherReleases + (kPair ? 4 : 0));
    }
    fence_mbar_init();
  }
  if constexpr (kPair) {
    // NOTE: the other CTA's stores and releases reach these barriers from here on.
    cluster_sync_relaxed();
  } else {
    __syncthreads();
  }
}

// Gathers the run's blocks (kPair: rank `rank`'s half of each, into both CTAs' stages), block `it`
// into stage it % 2 (phases from used0 and used1 as in produce_chunks); `tid` 0..127 over the
// producer warpgroup. Lane l of warp w holds unit l % 8 (e4m3 columns 8 (l % 8) .. + 7 of every
// chunk, bf16 units for fp8_ds_mla's rope) of rows 8 w + l / 8 and 8 w + 4 + l / 8 of each 32-row
// group of a block (kHalfRows: group `rank`; else both). kHalfRows without kPair: the CTA's two
// producer warpgroups (rank: which) each gather half of every block into the CTA's own stages. Keys
// past w.extent and entries of -1 land as zeros. The chunks are published without a proxy fence
// where the consumers fence after their waits (kPair, or p.consumer_fence): a fence here waits for
// this thread's loads of the next block in flight (docs/sm90-sparse.md, The proxy fence on the
// consumers' side). NOTE: deadlock-free with the seesaw kernel's coupled consumers: block it - 1 is
// stored (in both CTAs) before anything waits for block it's stage, and the loads ahead wait for
// nothing. The loads of block it + 1: kPair (and per-tensor e4m3 rows), its left parts mid-block
// it and the rest at its end; unpaired fp8_ds_mla, its whole rows asked of L2 mid-block it and
// loaded at its end (one wait on the loads a block, docs/perf-notes.md, Change 104).
template <typename Traits, Elem KV, bool kPair, bool kHalfRows = kPair>
__device__ __forceinline__ void gather_ahead_blocks(const DecodeKernelParams& p, const TileWork& w,
                                                    typename Traits::SharedMemoryPlan& smem,
                                                    int tid, uint32_t used0, uint32_t used1,
                                                    uint32_t rank) {
  using G = GatherFormat<KV>;
  static_assert(G::kE4m3, "e4m3 rows");
  static_assert(kHalfRows || !kPair, "a pair's CTAs gather half the rows each");
  static_assert(kPair || !kHalfRows || kEachArrives<KV>,
                "two producer warpgroups: every thread arrives");
  static_assert(Traits::kStages == 2 && Traits::kKeys == 64 && Traits::kChunks == 9,
                "two stages of 64 keys x 9 chunks of 64 columns");
  using T16 =
      std::conditional_t<std::is_same_v<typename Traits::T, cute::half_t>, __half, __nv_bfloat16>;
  static_assert(!G::kDsMla || std::is_same_v<T16, __nv_bfloat16>, "fp8_ds_mla: bf16 GEMMs");
  constexpr int kRows = kHalfRows ? 2 : 4;  // rows of a block a lane holds
  constexpr int kKeys = Traits::kKeys;
  constexpr uint32_t kChunkBytes = kKeys * 128;  // one 16-bit chunk region
  constexpr uint32_t kStageBytes = sizeof(smem.k[0]);
  constexpr uint32_t kPeerChunkBytes = 32 * 128;  // the other CTA's rows of a chunk
  constexpr int kRopeChunk = Traits::kChunks - 1;
  const int warp = tid >> 5, lane = tid & 31;
  const int unit = lane & 7;
  int row[kRows];
  uint32_t off[kRows];  // the lane's unit of the row in a chunk region (128-byte swizzle)
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    row[k] =
        32 * (kHalfRows ? static_cast<int>(rank) : k >> 1) + 8 * warp + 4 * (k & 1) + (lane >> 3);
    off[k] = row[k] * 128 + ((unit ^ (row[k] & 7)) << 4);
  }
  const bool slot_writer = unit == 0;  // writes its rows' entries (kPair: in both CTAs)
  const int num_blocks = w.block_end - w.block_begin;
  const GatherDims dims = gather_dims(p);
  auto phase_of = [&](int it) { return (((it & 1) == 0 ? used0 : used1) + (it >> 1)) & 1; };
  uint8_t* const k_local = reinterpret_cast<uint8_t*>(smem.k[0]);
  const uint32_t k_peer = kPair ? cluster_addr(smem.k[0], rank ^ 1) : 0;
  const uint32_t full_peer = kPair ? cluster_addr(&smem.full[0][0], rank ^ 1) : 0;
  const uint32_t slot_peer = kPair ? cluster_addr(&smem.slot[0][0], rank ^ 1) : 0;
  // The other CTA's bytes that complete a chunk's full barrier here (chunk kSlotChunk: and its
  // rows' entries).
  constexpr uint32_t kPeerSlotBytes = 32 * 4;
  const bool producer_fence = !kPair && p.consumer_fence == 0;

  // The rows' pieces: a pair's producers (32 rows a CTA) keep them in L1, where a warp's next load
  // of the same 128-byte lines finds them (B128 H128 fp8_ds_mla -1%); the unpaired gathers lost
  // 0.4 to 4% with that hint and keep theirs (docs/perf-notes.md, The register gathers' load
  // hints).
  constexpr int kRowL2Bytes = kPair ? 256 : 128;
  auto ld_row_8 = [](const void* a) { return ld_global_nc_8<kPair, kRowL2Bytes>(a); };
  auto ld_rope_16 = [](const void* a) {
    if constexpr (kPair) {
      return ld_global_nc_16_keep<128>(a);
    } else {
      return ld_global_nc_16(a);
    }
  };
  // Block it's entries of this lane's rows (-1 past the run), each by one predicated load: a
  // select after the load would wait for it, and with it for every load in flight (one
  // scoreboard).
  auto own_entries = [&](int it, int(&own)[kRows]) {
    const int key0 = (w.block_begin + it) * kKeys;
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int key = key0 + row[k];
      own[k] = ld_global_nc_4_if(w.slots + key, it < num_blocks && key < w.extent, -1);
    }
  };

  uint2 left[kRows][4];   // chunks 0..3 of the next block's rows, as loaded
  uint2 right[kRows][4];  // chunks 4..7
  uint2 rope8[kRows];     // per-tensor fp8: the rope chunk, as loaded
  uint4 rope[kRows];      // fp8_ds_mla: bf16 unit `unit` of the rope
  float4 scale[kRows];    // fp8_ds_mla: the rows' group scales
  const uint2 zero = make_uint2(0u, 0u);
  // A slot's row in 16-byte units (slot_row16's value) in 32-bit arithmetic, from the strides
  // in those units: a quarter of slot_row16's instructions (no 64-bit products).
  auto row16_of = [&](int slot) {
    const uint32_t u = static_cast<uint32_t>(slot);
    return (u >> p.page_shift) * p.kv_page16 +
           (u & static_cast<uint32_t>(p.page_size - 1)) * p.kv_row16;
  };
  // Entry e's row (null for e < 0), and whether it is loaded. Unpaired: by the entry's own test,
  // so that the address is computed under that predicate alone; with a null test of the address
  // instead, ptxas zeroed the address register for e < 0 and tested it a few cycles later, and an
  // unpaired build with load_left's prefetch of the right parts (then unpaired too) loaded from
  // address 0, the null address of -1 entries. The pair keeps the null test: its loop with the
  // entry's test ran 1 to 2% slower (docs/perf-notes.md, Change 101).
  auto row_of = [&](int e) { return e >= 0 ? row_at(p, row16_of(e)) : nullptr; };
  auto has_row = [](int e, const uint8_t* base) { return kPair ? base != nullptr : e >= 0; };
  auto load_left = [&](const int(&e)[kRows]) {
    const uint8_t* base[kRows];
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      base[k] = row_of(e[k]);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        left[k][c] = has_row(e[k], base[k]) ? ld_row_8(base[k] + 64 * c + 8 * unit) : zero;
      }
    }
    // fp8_ds_mla, kPair: the rest of the rows (chunks 4..7, the scales, the rope) into L2, half a
    // block before load_right reads them (unpaired: prefetch_rows, below). Every load shares one
    // scoreboard, so the first use of any loaded value, at the next block's start, waits for
    // load_right's loads issued just before it: from L2 rather than from DRAM (docs/perf-notes.md,
    // The sparse seesaw kernels under Nsight Compute after Change 90, and Change 101; a whole
    // block ahead, from the block's start, measured slower: Change 106). The lane of unit u asks
    // for the line 256 + 128 (u % 4) bytes into row u / 4 of each two of its rows (the rows end at
    // 656 bytes). Per-tensor rows (576 bytes) measured no gain from it (Changes 93, 95).
    if constexpr (G::kDsMla && kPair) {
      const bool second = (unit & 4) != 0;
#pragma unroll
      for (int j = 0; j < kRows / 2; ++j) {
        const int e_ask = second ? e[2 * j + 1] : e[2 * j];
        if (e_ask >= 0) prefetch_l2(row_of(e_ask) + 256 + 128 * (unit & 3));
      }
    }
  };
  // Unpaired fp8_ds_mla: the whole of each of the lane's rows into L2, the lane of unit u asking
  // for the line 128 u bytes into the row (u < 6: the 656 bytes of a row start on 16 bytes, so
  // six lines 128 bytes apart hold them), half a block before load_left and load_right read them.
  auto prefetch_rows = [&](const int(&e)[kRows]) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (e[k] >= 0 && unit < 6) prefetch_l2(row_of(e[k]) + 128 * unit);
    }
  };
  auto load_right = [&](const int(&e)[kRows]) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const uint8_t* base = row_of(e[k]);
      const bool ok = has_row(e[k], base);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        right[k][c] = ok && dims.upper ? ld_row_8(base + 64 * (c + 4) + 8 * unit) : zero;
      }
      if constexpr (G::kDsMla) {
        // The row's four group scales, loaded with chunks 4..7: the previous block's chunks
        // 4..7, the last to use the previous scales, are stored by then.
        scale[k] = ok ? __ldg(reinterpret_cast<const float4*>(base + kDsMlaScaleOffset))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
        rope[k] = ok ? ld_rope_16(base + kDsMlaRopeOffset + 16 * unit) : make_uint4(0u, 0u, 0u, 0u);
      } else {
        rope8[k] = ok && dims.rope ? ld_row_8(base + dims.rope_col + 8 * unit) : zero;
      }
    }
  };
  // Stores the lane's unit of row k of chunk c of `stage` (kPair: into both CTAs; the other CTA's
  // full barrier of the chunk counts the bytes).
  auto put = [&](int stage, int c, int k, const uint4& v) {
    const uint32_t o = stage * kStageBytes + c * kChunkBytes + off[k];
    *reinterpret_cast<uint4*>(k_local + o) = v;
    if constexpr (kPair) st_async_16(k_peer + o, v, full_peer + (stage * Traits::kChunks + c) * 8);
  };
  auto put_e4m3 = [&](int stage, int c, int k, const uint2& v, float s) {
    if constexpr (G::kDsMla) {
      put(stage, c, k, widen_scaled_e4m3x8(v, s));
    } else {
      put(stage, c, k, widen_e4m3x8<T16>(v));
    }
  };
  // This thread's units of chunk c are stored. kEachArrives: it arrives on the chunk's full
  // barrier (kPair: thread 0 with the other CTA's bytes of the chunk as expected bytes, 0 for the
  // others); else the warp's lane 0 arrives after the warp's sync (which orders every lane's
  // stores before it), chunk kSlotChunk's slot writers too (kPair: warp 0's lane 0 carries the
  // other CTA's bytes).
  auto arrive = [&](int stage, int c) {
    if (producer_fence) fence_proxy_async_smem();
    const uint32_t tx = kPeerChunkBytes + (c == kSlotChunk ? kPeerSlotBytes : 0u);
    if constexpr (kEachArrives<KV>) {
      mbar_arrive_expect_tx(&smem.full[stage][c], kPair && tid == 0 ? tx : 0u);
    } else {
      __syncwarp();
      if (lane == 0 || (c == kSlotChunk && slot_writer)) {
        if (kPair && tid == 0) {
          mbar_arrive_expect_tx(&smem.full[stage][c], tx);
        } else {
          mbar_arrive(&smem.full[stage][c]);
        }
      }
    }
  };

  int own[kRows], own_next[kRows], own_far[kRows];  // blocks it, it + 1, it + 2
  own_entries(0, own);
  if (num_blocks > 0) {
    load_left(own);
    load_right(own);
  }
  own_entries(1, own_next);
#pragma unroll 1
  for (int it = 0; it < num_blocks; ++it) {
    const int stage = it & 1;
    const uint32_t phase = phase_of(it);
    mbar_wait_suspend(&smem.empty_l[stage], phase ^ 1);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        put_e4m3(stage, c, k, left[k][c], c < 2 ? scale[k].x : scale[k].y);
      }
      arrive(stage, c);
    }
    // Unpaired fp8_ds_mla: the next block's rows into L2 only, their loads after this block's
    // right parts are stored (below). Every load shares one scoreboard, so a load of the left
    // parts here made the right parts' first use wait for it (from DRAM), and it held 16 more
    // registers over the right parts (the 64-head producers, at 72 registers, spilled one of them,
    // and its reload waited for those loads as well; docs/perf-notes.md, Change 104).
    constexpr bool kLoadsAtEnd = G::kDsMla && !kPair;
    if (it + 1 < num_blocks) {
      if constexpr (kLoadsAtEnd) {
        prefetch_rows(own_next);
      } else {
        load_left(own_next);
      }
    }
    // Block it + 2's entries, half a block before the rotation below first uses them (at the
    // block's start, the first use of a loaded value would wait for them).
    own_entries(it + 2, own_far);
    mbar_wait_suspend(&smem.empty_r[stage], phase ^ 1);
    // The block's entries for the consumers (0 past the extent), from the slot writers, after
    // both releases (every consumer thread that read the stage's previous entries has arrived on
    // one of them; kPair: every consumer warp of the other CTA too); each writer's own arrive on
    // chunk kSlotChunk publishes its writes here, and (kPair) the other CTA's barrier of that
    // chunk counts the copies sent there as bytes.
    {
      const int key0 = (w.block_begin + it) * kKeys;
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (slot_writer) {
          const int v = key0 + row[k] < w.extent ? own[k] : 0;
          smem.slot[stage][row[k]] = v;
          if constexpr (kPair) {
            st_async_4(slot_peer + (stage * kKeys + row[k]) * 4, static_cast<uint32_t>(v),
                       full_peer + (stage * Traits::kChunks + kSlotChunk) * 8);
          }
        }
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        put_e4m3(stage, c + 4, k, right[k][c], c < 2 ? scale[k].z : scale[k].w);
      }
      arrive(stage, c + 4);
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if constexpr (G::kDsMla) {
        put(stage, kRopeChunk, k, rope[k]);
      } else {
        put_e4m3(stage, kRopeChunk, k, rope8[k], 0.f);
      }
    }
    arrive(stage, kRopeChunk);
    // The rotation before load_right: its moves wait for the loads in flight, which are then the
    // entries (and, but for unpaired fp8_ds_mla rows, the left parts) issued half a block ago, not
    // load_right's.
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      own[k] = own_next[k];
      own_next[k] = own_far[k];
    }
    if (it + 1 < num_blocks) {
      if constexpr (kLoadsAtEnd) load_left(own);
      load_right(own);
    }
  }
}

}  // namespace mla::sm90::tma
