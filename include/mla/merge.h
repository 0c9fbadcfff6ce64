// Merging partial attention states: the (out, lse) pairs that context-parallel ranks (or any split
// of a row's keys) computed over disjoint key sets. The contract is docs/contract.md section 7;
// docs/context-parallel.md has the design and the error bound.
#pragma once

#include "mla/decode.h"
#include "mla/error.h"
#include "mla/tensor.h"

namespace mla {

/// @brief Every argument of one merge call. N is the number of partial states (ranks), T the query
/// tokens (B * q_len for dense queries: flatten them), H the heads, L the value width.
///
/// For each token t and head h, with lse_r = lse_parts[r, t, h] and M = max_r lse_r:
///   lse = M + log(sum_r exp(lse_r - M))
///   out = sum_r exp(lse_r - lse) * out_parts[r, t, h, :]
/// A part with lse_r = -inf (no key on that rank) contributes nothing: its out values are not
/// used (they may hold anything, NaN included; the sm90 kernel loads them before it knows). A
/// row whose parts are all -inf gets out = 0, lse = -inf. A NaN (or +inf) lse_r turns the row's out
/// and lse NaN; a NaN in a read out_parts element turns that out element NaN. With sinks, out is
/// then multiplied by 1 / (1 + exp(sink_h - lse)) (the sink applied once, after the merge); lse
/// stays as it is (it never includes the sink).
struct MergeParams {
  // Inputs.
  TensorView out_parts;  // [N, T, H, L] bf16 or fp16; last dim contiguous, other strides free
  TensorView lse_parts;  // [N, T, H] fp32, natural log (the decode's lse); strides free
  TensorView sinks;      // [H] fp32, bf16 or fp16, optional: per-head sink logits (natural log)

  // Outputs.
  TensorView out;  // [T, H, L], out_parts' dtype; last dim contiguous
  TensorView lse;  // [T, H] fp32, optional

  // Execution.
  Backend backend = Backend::kAuto;
  bool enable_pdl = false;  // launch as a programmatic dependent of the previous kernel (sm90)
  void* stream = nullptr;   // cudaStream_t for GPU backends; ignored by the cpu backend
};

/// @brief Validates every argument (nothing is written on error), then merges the N partial states
/// into out (and lse). On the sm90 backend: one kernel on params.stream, no allocation and no host
/// sync, so it can be captured in a CUDA graph.
void merge_states(const MergeParams& params);

}  // namespace mla
