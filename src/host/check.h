// Host-side check macros and the formatting that error messages share.
#pragma once

#include <sstream>
#include <string>

#include "mla/decode.h"
#include "mla/error.h"
#include "mla/tensor.h"

// Throws mla::Error(code, message); `message` is a stream expression: MLA_FAIL(code, "a " << b).
#define MLA_FAIL(code, message)                         \
  do {                                                  \
    std::ostringstream mla_fail_stream_;                \
    mla_fail_stream_ << message;                        \
    throw ::mla::Error((code), mla_fail_stream_.str()); \
  } while (0)

// Throws unless `cond` holds. The message names the argument, the expectation and the value given.
#define MLA_CHECK_ARG(cond, code, message) \
  do {                                     \
    if (!(cond)) MLA_FAIL(code, message);  \
  } while (0)

namespace mla::detail {

inline std::string dims_str(const int64_t* dims, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}
inline std::string shape_str(const TensorView& t) {
  return dims_str(t.shape, t.ndim < 0 ? 0 : (t.ndim > TensorView::kMaxDims ? 0 : t.ndim));
}
inline std::string strides_str(const TensorView& t) {
  return dims_str(t.strides, t.ndim < 0 ? 0 : (t.ndim > TensorView::kMaxDims ? 0 : t.ndim));
}

inline std::string dtype_str(DataType t) {
  if (t == dtype::kFloat8E4M3) return "float8_e4m3fn";
  std::string name;
  switch (t.code) {
    case static_cast<uint8_t>(TypeCode::kInt):
      name = "int";
      break;
    case static_cast<uint8_t>(TypeCode::kUInt):
      name = "uint";
      break;
    case static_cast<uint8_t>(TypeCode::kFloat):
      name = "float";
      break;
    case static_cast<uint8_t>(TypeCode::kBfloat):
      name = "bfloat";
      break;
    default:
      return "dtype(code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) +
             ", lanes " + std::to_string(t.lanes) + ")";
  }
  name += std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

inline std::string device_str(Device d) {
  switch (static_cast<DeviceType>(d.device_type)) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return "cuda:" + std::to_string(d.device_id);
    case DeviceType::kCUDAHost:
      return "cuda_host";
    case DeviceType::kCUDAManaged:
      return "cuda_managed:" + std::to_string(d.device_id);
  }
  return "device_type " + std::to_string(d.device_type) + ":" + std::to_string(d.device_id);
}

// Checks shared by every tensor argument: rank within bounds, non-negative sizes and strides,
// a data pointer when there are elements, and the call's device (validate.cc).
void check_tensor(const TensorView& t, const char* name, Device device);

// docs/contract.md section 3: out and lse overlap no input, not the workspace and not each other.
// Compares byte extents (data pointer to the last element's end, from shape, strides and element
// size) of tensors on one device; empty tensors overlap nothing. Throws InvalidArgument naming both
// arguments. Needs real memory behind out and lse, so run() checks it, not workspace_size() or
// plan(), which read only out's shape (validate.cc).
void check_outputs_apart(const DecodeParams& params);

// Whether the byte extents of `a` and `b` intersect (tensors on different devices, undefined or
// empty tensors intersect nothing); `extents` then describes both, for the message (validate.cc).
bool tensors_overlap(const TensorView& a, const TensorView& b, std::string& extents);

}  // namespace mla::detail
