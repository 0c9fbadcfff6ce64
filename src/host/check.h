// Host-side check macros and the formatting that error messages share.
#pragma once

#include <sstream>
#include <string>

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
  if (t == dtype::kBFloat16) return "bfloat16";
  if (t == dtype::kFloat16) return "float16";
  if (t == dtype::kFloat32) return "float32";
  if (t == dtype::kFloat8E4M3) return "float8_e4m3fn";
  if (t == dtype::kInt32) return "int32";
  if (t == dtype::kUInt32) return "uint32";
  if (t == dtype::kUInt16) return "uint16";
  if (t == dtype::kUInt8) return "uint8";
  return "dtype(code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) + ", lanes " +
         std::to_string(t.lanes) + ")";
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

}  // namespace mla::detail
