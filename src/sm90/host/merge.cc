// sm90 backend, host side of merge_states: the merge kernel's parameters and its launch on the
// caller's stream (no allocation, no sync: graph-safe).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "host/backends.h"
#include "host/check.h"
#include "sm90/decode/merge/launch.h"
#include "sm90/host/device.h"

namespace mla::detail::sm90 {
namespace {

namespace merge = ::mla::sm90::merge;
using ::mla::sm90::Elem;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// 16-byte vectors need L, the row strides and both base addresses in whole vectors.
int vector_width(const MergeProblem& p, const MergeParams& prm) {
  constexpr int kVec = merge::kMergeWideVec;
  const bool ok = p.L % kVec == 0 && p.part_stride % kVec == 0 && p.part_token % kVec == 0 &&
                  p.part_head % kVec == 0 && p.out_token % kVec == 0 && p.out_head % kVec == 0 &&
                  aligned16(prm.out_parts.data) && aligned16(prm.out.data);
  return ok ? kVec : 1;
}

}  // namespace

void merge_states(const MergeProblem& p, const MergeParams& prm) {
  DeviceGuard guard(p.device.device_id);
  merge::MergeKernelParams k{};
  k.out_parts = prm.out_parts.data;
  k.lse_parts = static_cast<const float*>(prm.lse_parts.data);
  k.sinks = p.has_sinks ? prm.sinks.data : nullptr;
  k.out = prm.out.data;
  k.lse = p.has_lse ? static_cast<float*>(prm.lse.data) : nullptr;
  k.num_parts = static_cast<int>(p.num_parts);
  k.num_heads = static_cast<int>(p.num_heads);
  k.L = static_cast<int>(p.L);
  k.rows = static_cast<int>(p.num_tokens * p.num_heads);
  const int vec = vector_width(p, prm);
  k.vecs_per_row = static_cast<int>((p.L + vec - 1) / vec);
  k.part_stride = p.part_stride;
  k.part_token = p.part_token;
  k.part_head = p.part_head;
  k.lse_part_stride = p.lse_part_stride;
  k.lse_part_token = p.lse_part_token;
  k.lse_part_head = p.lse_part_head;
  k.out_token = p.out_token;
  k.out_head = p.out_head;
  k.lse_token = p.lse_token;
  k.lse_head = p.lse_head;
  k.sinks_stride = p.sinks_stride;
  k.sinks_elem = p.sinks_dtype == dtype::kBFloat16 ? 1 : p.sinks_dtype == dtype::kFloat16 ? 2 : 0;
  const auto stream = static_cast<cudaStream_t>(prm.stream);
  const cudaError_t err = p.out_dtype == dtype::kFloat16
                              ? merge::launch_merge<Elem::kFp16>(k, vec, stream, prm.enable_pdl)
                              : merge::launch_merge<Elem::kBf16>(k, vec, stream, prm.enable_pdl);
  MLA_CUDA_CHECK(err, "launching the merge kernel");
}

}  // namespace mla::detail::sm90
