// Device helpers shared by the sm90 kernels: the architecture guard, element loads and stores,
// programmatic dependent launch, and the launch helper.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "sm90/params.h"

// Device code of this backend is written for sm_90a only: any other target fails to compile.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != 900)
#error "mla-decode sm90 kernels must be compiled for sm_90a only (CMAKE_CUDA_ARCHITECTURES 90a)"
#endif

#define MLA_DEVICE_ASSERT(cond) \
  do {                          \
    if (!(cond)) __trap();      \
  } while (0)

namespace mla::sm90 {

inline constexpr float kNegInf = -__builtin_huge_valf();
inline constexpr float kInf = __builtin_huge_valf();

// The request of global query token t: with cum_seq_lens_q the one whose range [cum[b], cum[b + 1])
// holds t (the last b with cum[b] <= t), else t / q_len.
__device__ __forceinline__ int request_of_token(const DecodeKernelParams& p, int t) {
  if (p.cum_seq_lens_q == nullptr) return t / p.q_len;
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.cum_seq_lens_q[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// max(a, b) that returns NaN when either is NaN (fmaxf returns the other operand): a NaN score
// then reaches the row's max, sum and out instead of vanishing (contract section 1).
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// The kernel's shared-memory plan at the first 1 KB boundary of its dynamic shared memory (only
// 16-byte aligned; the launch adds 1 KB of slack).
// NOTE: the plan is `raw` plus an offset, not a rounded generic address: derived from the
// __shared__ array, its accesses compile to shared loads and stores (LDS/STS). A rounded integer
// address loses the address space and every access becomes a generic LD/ST.
template <typename Plan>
__device__ __forceinline__ Plan& shared_plan(uint8_t* raw) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  return *reinterpret_cast<Plan*>(raw + ((1024u - (addr & 1023u)) & 1023u));
}

template <Elem E>
struct ElemTraits;
template <>
struct ElemTraits<Elem::kBf16> {
  using Storage = __nv_bfloat16;
  static __device__ __forceinline__ float load(const Storage* p, int64_t i) {
    return __bfloat162float(p[i]);
  }
  static __device__ __forceinline__ void store(Storage* p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
  }
};
template <>
struct ElemTraits<Elem::kFp16> {
  using Storage = __half;
  static __device__ __forceinline__ float load(const Storage* p, int64_t i) {
    return __half2float(p[i]);
  }
  static __device__ __forceinline__ void store(Storage* p, int64_t i, float v) {
    p[i] = __float2half_rn(v);
  }
};
template <>
struct ElemTraits<Elem::kFp8E4M3> {
  using Storage = __nv_fp8_e4m3;
  static __device__ __forceinline__ float load(const Storage* p, int64_t i) {
    return static_cast<float>(p[i]);
  }
};
// Value d of the key row starting at element `row`: element row + d for the plain formats.
template <Elem E>
__device__ __forceinline__ float load_key(const typename ElemTraits<E>::Storage* p, int64_t row,
                                          int d) {
  return ElemTraits<E>::load(p, row + d);
}
// fp8_ds_mla rows (bytes): values 0..511 are e4m3 bytes times scale d / 128 (fp32 at byte
// 512 + 4 (d / 128)); values 512..575 are bf16 at byte 528 + 2 (d - 512).
template <>
struct ElemTraits<Elem::kFp8DsMla> {
  using Storage = uint8_t;
  static constexpr int kScaleOffset = 512, kRopeOffset = 528;
};
template <>
__device__ __forceinline__ float load_key<Elem::kFp8DsMla>(const uint8_t* p, int64_t row, int d) {
  const uint8_t* r = p + row;
  if (d < 512) {
    const float scale = *reinterpret_cast<const float*>(
        r + ElemTraits<Elem::kFp8DsMla>::kScaleOffset + 4 * (d >> 7));
    return static_cast<float>(*reinterpret_cast<const __nv_fp8_e4m3*>(r + d)) * scale;
  }
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(
      r + ElemTraits<Elem::kFp8DsMla>::kRopeOffset + 2 * (d - 512)));
}

// Asks L1 for the line holding `p` (no registers; the later load hits L1).
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p) : "memory");
}

// Programmatic dependent launch: wait for the grids this one depends on (a no-op when launched
// without the attribute), and let the next grid start its prologue.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Launches `kernel` with cudaLaunchKernelEx in clusters of shape `cluster` (1 x 1 x 1: no
// cluster); with `pdl`, as a programmatic dependent of the previous work in the stream.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_in_cluster_shape(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                    size_t smem, cudaStream_t stream, bool pdl, dim3 cluster,
                                    Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  unsigned n = 0;
  if (pdl) {
    attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attribute[n].id = cudaLaunchAttributeClusterDimension;
    attribute[n].val.clusterDim.x = cluster.x;
    attribute[n].val.clusterDim.y = cluster.y;
    attribute[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  config.attrs = attribute;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The same in clusters of `cluster_x` CTAs along x (1: no cluster).
template <typename... KernelArgs, typename... Args>
cudaError_t launch_in_clusters(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                               cudaStream_t stream, bool pdl, unsigned cluster_x, Args&&... args) {
  return launch_in_cluster_shape(kernel, grid, block, smem, stream, pdl, dim3(cluster_x, 1, 1),
                                 std::forward<Args>(args)...);
}

// launch_in_clusters without clusters.
template <typename... KernelArgs, typename... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, bool pdl, Args&&... args) {
  return launch_in_clusters(kernel, grid, block, smem, stream, pdl, 1u,
                            std::forward<Args>(args)...);
}

}  // namespace mla::sm90
