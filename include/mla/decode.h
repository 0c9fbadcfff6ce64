// MLA decode: parameters, planning and execution. The contract is docs/contract.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mla/error.h"
#include "mla/tensor.h"

namespace mla {

/// @brief Which implementation runs a call.
enum class Backend : int {
  kAuto = 0,  ///< sm90 for CUDA tensors on a compute-capability 9.0 GPU, cpu for host tensors
  kSm90 = 1,  ///< the Hopper GPU path
  kCpu = 2,   ///< the multi-threaded reference path; implements every feature
};

/// @brief "auto", "sm90" or "cpu".
const char* backend_name(Backend backend);

/// @brief Parses "auto", "sm90" or "cpu"; throws mla::Error (InvalidArgument) naming the others.
Backend parse_backend(const std::string& name);

/// @brief Every argument of one decode call (docs/contract.md section 3). Optional tensors are left
/// default-constructed (TensorView::defined() == false). B is the batch size, T the total number of
/// query tokens of a ragged batch, H the number of heads, D = kv_lora_rank + qk_rope_head_dim.
struct DecodeParams {
  // Inputs.
  TensorView query;     // [B, q_len, H, D], or [T, H, D] with cum_seq_lens_q; last dim contiguous
  TensorView kv_cache;  // [P, page_size, D] or [P, 1, page_size, D]; last dim contiguous; or
                        // uint8 [P, page_size, 656] (fp8_ds_mla, with a bf16 query; D = 576)
  TensorView block_tables;    // [B, max_pages] or [B, 2, max_pages] (separate K/V page tables,
                              // row 1 equal to row 0) int32; dense mode only
  TensorView seq_lens;        // [B] int32, cached tokens per request including the query tokens
  TensorView cum_seq_lens_q;  // [B + 1] int32, optional: ragged queries (0 first, T last)
  TensorView
      sinks;  // [H] fp32, bf16 or fp16, optional: per-head sink logits (natural log, unscaled)
  TensorView mask;  // [B, q_len, W] / [T, W] uint32 (or uint16 with 2W), optional custom mask
  TensorView sparse_indices;     // [B, q_len, top_k] / [T, top_k] int32; sparse mode only
  TensorView sparse_topk_lens;   // [B] or [B, q_len] / [T] int32, optional (sparse mode)
  TensorView bmm1_scale_tensor;  // [1] fp32, optional; replaces bmm1_scale, read on the device
  TensorView bmm2_scale_tensor;  // [1] fp32, optional; replaces bmm2_scale, read on the device

  // Outputs.
  TensorView out;  // like query with last dim kv_lora_rank; bf16 or fp16
  TensorView lse;  // [B, q_len, H] / [T, H] fp32, optional

  // Scratch, reusable across calls; no zero-filling required.
  TensorView workspace;  // [>= workspace_size(params)] uint8, on the tensors' device

  // Sizes and scalars.
  int32_t kv_lora_rank = 512;      // L
  int32_t qk_rope_head_dim = 64;   // R
  int32_t qk_nope_head_dim = 128;  // informational, must be positive
  int32_t max_seq_len = -1;        // host hint, upper bound of seq_lens; -1: block_tables capacity
  int32_t max_q_len = -1;          // host hint with cum_seq_lens_q, upper bound of query lengths
  int32_t sparse_top_k = 0;        // > 0 selects sparse mode
  float bmm1_scale = 1.0f;         // includes softmax scale and q/k dequant scales
  float bmm2_scale = 1.0f;         // includes v dequant and output scales
  float skip_softmax_threshold_scale_factor = 0.0f;  // f > 0 enables skip-softmax (approximate)

  // Execution.
  Backend backend = Backend::kAuto;
  bool enable_pdl = false;        // programmatic dependent launch between the kernels of a call
  bool validate_indices = false;  // check index tensor contents on the device (cpu: always)
  void* stream = nullptr;         // cudaStream_t for GPU backends; ignored by the cpu backend
};

/// @brief The work split of one decode step. Made by plan(), consumed by run(); one plan serves
/// every layer whose call has the same shapes, seq_lens and query lengths.
struct Plan {
  Backend backend = Backend::kAuto;  // the resolved backend (never kAuto once planned)
  Device device{};
  int64_t batch = 0;            // B
  int64_t num_tokens = 0;       // B * q_len, or T with cum_seq_lens_q
  int64_t num_heads = 0;        // H
  int64_t q_len = 0;            // dense queries; 0 with cum_seq_lens_q
  int64_t workspace_bytes = 0;  // the workspace_size() the plan was made for
  int32_t sparse_top_k = 0;
  bool planned = false;
};

/// @brief Bytes of workspace a call with these shapes needs (the data pointers are not read).
/// Validates the arguments it reads.
size_t workspace_size(const DecodeParams& params);

/// @brief Validates every argument and writes the work split into params.workspace (on
/// params.stream for GPU backends, without a host sync).
Plan plan(const DecodeParams& params);

/// @brief Validates every argument, checks that `plan` was made for these shapes, and computes
/// out (and lse). The workspace must still hold what plan() wrote.
void run(const Plan& plan, const DecodeParams& params);

/// @brief plan() then run().
void decode(const DecodeParams& params);

}  // namespace mla
