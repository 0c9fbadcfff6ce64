// PTX wrappers of the TMA kernels: mbarriers, bulk tensor copies (TMA), cp.async copies, named
// barriers, proxy fences and register reallocation. Hopper (sm_90a) only.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mla::sm90::tma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Makes the mbarrier initializations visible to the async proxy (the copy engine).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

// The same with a suspend-time hint (10 ms, as CUTLASS's barriers): the thread sleeps until the
// phase completes (or the hint passes, then tries again) instead of spinning. For waits that are
// long and off the critical path: the producer's waits for a stage to be released, whose spinning
// took ~700 issue slots per block from its scheduler's consumer warps (docs/perf-notes.md, Tiles
// of the seesaw kernel's calls).
__device__ __forceinline__ void mbar_wait_suspend(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  constexpr uint32_t kSuspendNs = 0x989680;
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity), "r"(kSuspendNs)
        : "memory");
  } while (!done);
}

// Whether the phase of parity `parity` of the barrier has completed (does not wait).
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// ---- clusters (the seesaw kernel's paired tiles: docs/sm90-seesaw.md, Pairs) ----

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster: arrives, then waits for all the others. The arrive is
// relaxed: what it publishes is mbarrier initializations, which fence_mbar_init orders (with
// .release, ptxas put MEMBAR.ALL.GPU before it).
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile(
      "barrier.cluster.arrive.relaxed.aligned;\n"
      "barrier.cluster.wait.aligned;\n" ::
          : "memory");
}

// Arrives on the barrier at `bar`'s offset in the shared memory of cluster CTA `cta`.
// NOTE: the default semantics (release at CTA scope), as CUTLASS's cluster barriers: with
// .release.cluster ptxas put MEMBAR.ALL.GPU before every arrive.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

// The same with release semantics at cluster scope: the arriving thread's memory operations, and
// those ordered before them (the CTA barrier and fences before it), are visible to a thread of
// the cluster whose mbar_wait_cluster observes the phase (global stores included). Once per CTA:
// ptxas puts a MEMBAR.ALL.GPU before it.
__device__ __forceinline__ void mbar_arrive_cluster_release(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

// Waits until the phase of parity `parity` of this CTA's barrier has completed, with acquire
// semantics at cluster scope (pairs with mbar_arrive_cluster_release of another CTA).
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

// The shared::cluster address of `p`'s offset in the shared memory of cluster CTA `cta`.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(cta));
  return remote;
}

// Copies `bytes` (a multiple of 16) of this CTA's shared memory at `src` to shared::cluster address
// `remote` (another CTA's shared memory) with the bulk copy engine, completing those bytes on the
// barrier at shared::cluster address `remote_bar` in that CTA. The source must have been written
// before a proxy fence (the copy reads it through the async proxy) and stay unchanged until the
// other CTA's barrier has seen the bytes.
__device__ __forceinline__ void bulk_copy_to_cluster(uint32_t remote, const void* src,
                                                     uint32_t bytes, uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];" ::"r"(remote),
      "r"(smem_addr(src)), "r"(bytes), "r"(remote_bar)
      : "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory into this
// CTA's shared memory at `dst` with the bulk copy engine, completing them on `bar` (transaction
// bytes): one row of a gathered block (gather.cuh, gather_rows_bulk).
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Stores 16 bytes at shared::cluster address `remote` (another CTA's shared memory) and completes
// 16 transaction bytes on the barrier at shared::cluster address `remote_bar` in the same CTA.
// Nothing waits: the barrier's phase completes once every such store has landed.
__device__ __forceinline__ void st_async_16(uint32_t remote, const uint4& v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(remote),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

// The same for 4 bytes.
__device__ __forceinline__ void st_async_4(uint32_t remote, uint32_t v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote),
      "r"(v), "r"(remote_bar)
      : "memory");
}

// ---- bulk tensor copy ----

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// 16 bytes of read-only global memory, not kept in L1 (each byte is read once).
__device__ __forceinline__ uint4 ld_global_nc_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 16 bytes of read-only global memory kept in L1 until evicted last: a gathered row's pieces share
// 128-byte lines across a warp's successive loads, which L1 then serves. kL2Bytes: the L2
// prefetch size of a miss (128 or 256).
template <int kL2Bytes>
__device__ __forceinline__ uint4 ld_global_nc_16_keep(const void* p) {
  static_assert(kL2Bytes == 128 || kL2Bytes == 256, "L2 prefetch of 128 or 256 bytes");
  uint4 v;
  if constexpr (kL2Bytes == 256) {
    asm volatile("ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::evict_last.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  }
  return v;
}

// 8 bytes of read-only global memory: kKeep as ld_global_nc_16_keep<kL2Bytes> (kept in L1 until
// evicted last), else as ld_global_nc_16 (not kept in L1, a 128-byte L2 prefetch).
template <bool kKeep, int kL2Bytes = 128>
__device__ __forceinline__ uint2 ld_global_nc_8(const void* p) {
  static_assert(kL2Bytes == 128 || kL2Bytes == 256, "L2 prefetch of 128 or 256 bytes");
  static_assert(kKeep || kL2Bytes == 128, "no_allocate loads prefetch 128 bytes");
  uint2 v;
  if constexpr (!kKeep) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
  } else if constexpr (kL2Bytes == 256) {
    asm volatile("ld.global.nc.L1::evict_last.L2::256B.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::evict_last.L2::128B.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
  }
  return v;
}

// The 4 bytes at `p` if `pred`, else `otherwise`: one predicated load into the result's register
// (no select after it, so nothing waits for the load until the value is used).
__device__ __forceinline__ int ld_global_nc_4_if(const int* p, bool pred, int otherwise) {
  int v = otherwise;
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.b32 %0, [%1];\n}"
               : "+r"(v)
               : "l"(p), "r"(static_cast<int>(pred))
               : "memory");
  return v;
}

// Brings the line of `p` into L2.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p) : "memory");
}
// Brings the line of `p` into L2, kept past evict-first traffic (the KV stream).
__device__ __forceinline__ void prefetch_l2_keep(const void* p) {
  asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p) : "memory");
}

// Copies the box at coordinates (c0, c1, c2) of a 3-D tensor map into shared memory; completion
// is signalled on `bar` as transaction bytes.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Copies the box at coordinates (c0, c1, c2, c3) of a 4-D tensor map into shared memory; completion
// is signalled on `bar` as transaction bytes.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// tma_load_3d with an L2 eviction policy (`policy`, from l2_evict_first_policy).
__device__ __forceinline__ void tma_load_3d_hint(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                 int32_t c0, int32_t c1, int32_t c2,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "l"(policy)
      : "memory");
}

// tma_load_3d into the same shared-memory offset of every CTA of the cluster in `cta_mask`; each
// completes its own barrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int32_t c0, int32_t c1,
                                                      int32_t c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "h"(cta_mask)
      : "memory");
}

// An L2 cache policy that marks every line it touches evict-first.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// ---- barriers and fences ----

// Named barrier `id` over `count` threads (a multiple of 32). kAligned: every thread that takes
// part runs this same instruction (`bar.sync`); else warps may reach the barrier from different
// code (`barrier.sync`, as two copies of a loop that sync with each other do).
template <bool kAligned = true>
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t count) {
  if constexpr (kAligned) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
  } else {
    asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
  }
}

// Arrives at named barrier `id` over `count` threads without waiting (the other side syncs);
// kAligned as for named_barrier_sync.
template <bool kAligned = true>
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t count) {
  if constexpr (kAligned) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
  } else {
    asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
  }
}

// Named barrier that also returns the AND of `pred` over its `count` threads.
__device__ __forceinline__ bool named_barrier_and(uint32_t id, uint32_t count, bool pred) {
  uint32_t result;
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "bar.red.and.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n"
      "}\n"
      : "=r"(result)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(count)
      : "memory");
  return result != 0;
}

// Orders this thread's ordinary shared-memory stores before later async-proxy reads (wgmma
// operands, bulk copies).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Four 8x8 matrices of 16-bit values from a warp's registers into shared memory (stmatrix .x4):
// lane l gives the address of row l % 8 of matrix l / 8; register i is this thread's pair of
// matrix i (row lane / 4, columns 2 (lane % 4) and the next).
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1,
                                            uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The same four matrices stored transposed (stmatrix .x4 .trans): lane l gives the address of row
// l % 8 of the transpose of matrix l / 8, whose row j is column j of the matrix (8 values, 16
// contiguous bytes).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t smem_addr, uint32_t r0, uint32_t r1,
                                                  uint32_t r2, uint32_t r3) {
  asm volatile(
      "stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr),
      "r"(r0), "r"(r1), "r"(r2), "r"(r3)
      : "memory");
}

// ---- cp.async (16-byte and 4-byte copies, no registers; the gather producer: gather.cuh) ----

// `bytes` (16 or 0) of src into dst, the rest zero-filled: 0 reads nothing and writes 16 zeros.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}

// `bytes` (4 or 0) of src into dst, the rest zero-filled.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}

// One arrival on `bar` once every cp.async this thread has issued so far has landed (counted in
// the barrier's expected arrivals: no increment of its pending count).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}

// ---- math ----

// 2^x on the special function unit, subnormal results flushed to 0 (one MUFU.EX2, where exp2f
// adds the subnormal range fix-up around it).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats to e4m3 (round to nearest even, saturating to +-448; NaN stays NaN): `lo` in the low
// byte.
__device__ __forceinline__ uint16_t e4m3x2(float lo, float hi) {
  uint16_t y;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(y) : "f"(hi), "f"(lo));
  return y;
}

// Bytes of {b, a} picked by `sel` (PRMT: selector nibble i names result byte i, 0..3 from a, 4..7
// from b).
__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
  return __byte_perm(a, b, sel);
}

// ---- shared-memory matrix loads ----

// Four 8 x 8 matrices of 16-bit elements: lane i gives the address of row i % 8 of matrix i / 8
// (16 bytes); register j of lane t receives elements 2 (t % 4) and 2 (t % 4) + 1 of row t / 4 of
// matrix j, the first in its low half.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// Four 8 x 8 matrices of 16-bit elements, transposed: lane i gives the address of row i % 8 of
// matrix i / 8 (16 bytes); register j of lane t receives elements (2 (t % 4), t / 4) and
// (2 (t % 4) + 1, t / 4) of matrix j (row, column), the first in its low half.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                  uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// ---- register reallocation (one branch per warpgroup role) ----

template <uint32_t kRegs>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace mla::sm90::tma
