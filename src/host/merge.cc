// Public API of the merge of partial states (include/mla/merge.h): validation and backend
// dispatch. Every rule is checked before anything is launched or written (docs/contract.md
// section 5).
#include <climits>
#include <cstdint>
#include <string>

#include "host/backends.h"
#include "host/check.h"
#include "mla/merge.h"

namespace mla {
namespace detail {
namespace {

bool is_host(Device d) {
  return d.device_type == static_cast<int32_t>(DeviceType::kCPU) ||
         d.device_type == static_cast<int32_t>(DeviceType::kCUDAHost);
}
bool is_cuda(Device d) { return d.device_type == static_cast<int32_t>(DeviceType::kCUDA); }
bool is_16bit_float(DataType t) { return t == dtype::kBFloat16 || t == dtype::kFloat16; }

void check_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  MLA_CHECK_ARG(t.ndim == rank, ErrorCode::kInvalidArgument,
                name << ": expected rank " << rank << " " << layout << ", got rank " << t.ndim
                     << " with shape " << shape_str(t));
}

// `what` names the size and `from` where it comes from, e.g. "heads H", "out_parts' dim 2".
void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* what,
               const char* from) {
  MLA_CHECK_ARG(t.shape[dim] == expected, ErrorCode::kInvalidArgument,
                name << ": expected " << what << " " << expected << " (" << from << "), got "
                     << t.shape[dim] << " (shape " << shape_str(t) << ")");
}

void check_last_contiguous(const TensorView& t, const char* name) {
  MLA_CHECK_ARG(
      t.shape[t.ndim - 1] <= 1 || t.strides[t.ndim - 1] == 1, ErrorCode::kInvalidArgument,
      name << ": expected a contiguous last dim (stride 1), got strides " << strides_str(t));
}

// out and lse are written once per element.
void check_written_once(const TensorView& t, const char* name) {
  if (t.numel() == 0) return;
  for (int d = 0; d < t.ndim; ++d) {
    MLA_CHECK_ARG(t.shape[d] <= 1 || t.strides[d] != 0, ErrorCode::kInvalidArgument,
                  name << ": expected a non-zero stride on every dim of size > 1 (each element "
                          "written once), got strides "
                       << strides_str(t) << " for shape " << shape_str(t));
  }
}

Backend resolve_backend(Backend requested, Device device) {
  switch (requested) {
    case Backend::kAuto:
      if (is_host(device)) return Backend::kCpu;
      if (is_cuda(device)) return Backend::kSm90;
      break;
    case Backend::kCpu:
      MLA_CHECK_ARG(
          is_host(device), ErrorCode::kDeviceError,
          "out_parts: backend cpu expects host tensors, got device " << device_str(device));
      return Backend::kCpu;
    case Backend::kSm90:
      MLA_CHECK_ARG(
          is_cuda(device), ErrorCode::kDeviceError,
          "out_parts: backend sm90 expects CUDA tensors, got device " << device_str(device));
      return Backend::kSm90;
    default:
      MLA_FAIL(ErrorCode::kInvalidArgument, "backend: expected auto, sm90 or cpu, got enum value "
                                                << static_cast<int>(requested));
  }
  MLA_FAIL(ErrorCode::kDeviceError,
           "out_parts: expected a host (cpu) or CUDA tensor, got device " << device_str(device));
}

// check_tensor, with a device mismatch named against out_parts (check_tensor names the query).
void check_merge_tensor(const TensorView& t, const char* name, Device device) {
  MLA_CHECK_ARG(t.device == device, ErrorCode::kDeviceError,
                name << ": expected device " << device_str(device) << " (out_parts'), got "
                     << device_str(t.device));
  check_tensor(t, name, device);
}

struct Named {
  const char* name;
  const TensorView* tensor;
};

void check_apart(const Named& output, const Named& other) {
  std::string extents;
  MLA_CHECK_ARG(!tensors_overlap(*output.tensor, *other.tensor, extents),
                ErrorCode::kInvalidArgument,
                output.name << ": overlaps " << other.name << " (" << extents
                            << "); expected out and lse apart from every input and each other");
}

MergeProblem validate_merge(const MergeParams& prm) {
  MergeProblem p;

  // out_parts: device, backend, shape, dtype.
  const TensorView& parts = prm.out_parts;
  MLA_CHECK_ARG(parts.defined(), ErrorCode::kInvalidArgument,
                "out_parts: expected a tensor, got none");
  const Device device = parts.device;
  check_tensor(parts, "out_parts", device);
  p.backend = resolve_backend(prm.backend, device);
  p.device = device;
  check_rank(parts, "out_parts", 4, "[N, T, H, L]");
  MLA_CHECK_ARG(is_16bit_float(parts.dtype), ErrorCode::kTypeError,
                "out_parts: expected dtype bfloat16 or float16, got " << dtype_str(parts.dtype));
  check_last_contiguous(parts, "out_parts");
  p.out_dtype = parts.dtype;
  p.num_parts = parts.shape[0];
  p.num_tokens = parts.shape[1];
  p.num_heads = parts.shape[2];
  p.L = parts.shape[3];
  MLA_CHECK_ARG(p.num_parts >= 1, ErrorCode::kInvalidArgument,
                "out_parts: expected at least one part (N >= 1), got shape " << shape_str(parts));
  MLA_CHECK_ARG(p.L >= 1, ErrorCode::kInvalidArgument,
                "out_parts: expected a value width L >= 1, got shape " << shape_str(parts));
  // NOTE: rows and parts index the kernels with 32-bit counts where that is cheaper.
  MLA_CHECK_ARG(
      p.num_parts <= INT32_MAX && p.L <= INT32_MAX && p.num_tokens * p.num_heads <= INT32_MAX,
      ErrorCode::kInvalidArgument,
      "out_parts: expected N, L and T x H within int32, got shape " << shape_str(parts));
  p.part_stride = parts.strides[0];
  p.part_token = parts.strides[1];
  p.part_head = parts.strides[2];

  // lse_parts.
  const TensorView& lse_parts = prm.lse_parts;
  MLA_CHECK_ARG(lse_parts.defined(), ErrorCode::kInvalidArgument,
                "lse_parts: expected a tensor [N, T, H] float32, got none");
  check_merge_tensor(lse_parts, "lse_parts", device);
  check_rank(lse_parts, "lse_parts", 3, "[N, T, H]");
  MLA_CHECK_ARG(lse_parts.dtype == dtype::kFloat32, ErrorCode::kTypeError,
                "lse_parts: expected dtype float32, got " << dtype_str(lse_parts.dtype));
  check_dim(lse_parts, "lse_parts", 0, p.num_parts, "parts N", "out_parts' dim 0");
  check_dim(lse_parts, "lse_parts", 1, p.num_tokens, "tokens T", "out_parts' dim 1");
  check_dim(lse_parts, "lse_parts", 2, p.num_heads, "heads H", "out_parts' dim 2");
  p.lse_part_stride = lse_parts.strides[0];
  p.lse_part_token = lse_parts.strides[1];
  p.lse_part_head = lse_parts.strides[2];

  // out.
  const TensorView& out = prm.out;
  MLA_CHECK_ARG(out.defined(), ErrorCode::kInvalidArgument,
                "out: expected a tensor [T, H, L], got none");
  check_merge_tensor(out, "out", device);
  check_rank(out, "out", 3, "[T, H, L]");
  MLA_CHECK_ARG(out.dtype == parts.dtype, ErrorCode::kTypeError,
                "out: expected dtype " << dtype_str(parts.dtype) << " (out_parts'), got "
                                       << dtype_str(out.dtype));
  check_dim(out, "out", 0, p.num_tokens, "tokens T", "out_parts' dim 1");
  check_dim(out, "out", 1, p.num_heads, "heads H", "out_parts' dim 2");
  check_dim(out, "out", 2, p.L, "value width L", "out_parts' dim 3");
  check_last_contiguous(out, "out");
  check_written_once(out, "out");
  p.out_token = out.strides[0];
  p.out_head = out.strides[1];

  // lse (optional).
  if (prm.lse.defined()) {
    const TensorView& lse = prm.lse;
    check_merge_tensor(lse, "lse", device);
    check_rank(lse, "lse", 2, "[T, H]");
    MLA_CHECK_ARG(lse.dtype == dtype::kFloat32, ErrorCode::kTypeError,
                  "lse: expected dtype float32, got " << dtype_str(lse.dtype));
    check_dim(lse, "lse", 0, p.num_tokens, "tokens T", "out_parts' dim 1");
    check_dim(lse, "lse", 1, p.num_heads, "heads H", "out_parts' dim 2");
    check_written_once(lse, "lse");
    p.has_lse = true;
    p.lse_token = lse.strides[0];
    p.lse_head = lse.strides[1];
  }

  // sinks (optional).
  if (prm.sinks.defined()) {
    const TensorView& sinks = prm.sinks;
    check_merge_tensor(sinks, "sinks", device);
    check_rank(sinks, "sinks", 1, "[H]");
    MLA_CHECK_ARG(
        sinks.dtype == dtype::kFloat32 || is_16bit_float(sinks.dtype), ErrorCode::kTypeError,
        "sinks: expected dtype float32, bfloat16 or float16, got " << dtype_str(sinks.dtype));
    check_dim(sinks, "sinks", 0, p.num_heads, "heads H", "out_parts' dim 2");
    p.has_sinks = true;
    p.sinks_dtype = sinks.dtype;
    p.sinks_stride = sinks.strides[0];
  }

  if (p.backend == Backend::kSm90) sm90::check_device(device);
  return p;
}

void check_merge_outputs_apart(const MergeParams& prm) {
  const Named inputs[] = {
      {"out_parts", &prm.out_parts}, {"lse_parts", &prm.lse_parts}, {"sinks", &prm.sinks}};
  const Named out{"out", &prm.out}, lse{"lse", &prm.lse};
  for (const Named& input : inputs) check_apart(out, input);
  for (const Named& input : inputs) check_apart(lse, input);
  check_apart(lse, out);
}

}  // namespace
}  // namespace detail

void merge_states(const MergeParams& params) {
  const detail::MergeProblem problem = detail::validate_merge(params);
  detail::check_merge_outputs_apart(params);
  if (problem.num_tokens == 0 || problem.num_heads == 0) return;
  switch (problem.backend) {
    case Backend::kCpu:
      detail::cpu::merge_states(problem, params);
      return;
    case Backend::kSm90:
      detail::sm90::merge_states(problem, params);
      return;
    default:
      MLA_FAIL(ErrorCode::kUnsupported,
               "backend: " << backend_name(problem.backend) << " is not available in this build");
  }
}

}  // namespace mla
