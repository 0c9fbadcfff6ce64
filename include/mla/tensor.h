// Tensor views: a non-owning description of memory that maps one-to-one onto a DLPack tensor.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace mla {

/// @brief Type codes, numerically equal to DLPack's DLDataTypeCode.
enum class TypeCode : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kBfloat = 4,
  kFloat8E4M3FN = 10,
};

/// @brief Element type, laid out like DLPack's DLDataType {code, bits, lanes}.
struct DataType {
  uint8_t code = 0;
  uint8_t bits = 0;
  uint16_t lanes = 1;

  friend bool operator==(DataType a, DataType b) {
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
  }
  friend bool operator!=(DataType a, DataType b) { return !(a == b); }
};

namespace dtype {
inline constexpr DataType kBFloat16{static_cast<uint8_t>(TypeCode::kBfloat), 16, 1};
inline constexpr DataType kFloat16{static_cast<uint8_t>(TypeCode::kFloat), 16, 1};
inline constexpr DataType kFloat32{static_cast<uint8_t>(TypeCode::kFloat), 32, 1};
inline constexpr DataType kFloat8E4M3{static_cast<uint8_t>(TypeCode::kFloat8E4M3FN), 8, 1};
inline constexpr DataType kInt32{static_cast<uint8_t>(TypeCode::kInt), 32, 1};
inline constexpr DataType kUInt32{static_cast<uint8_t>(TypeCode::kUInt), 32, 1};
inline constexpr DataType kUInt16{static_cast<uint8_t>(TypeCode::kUInt), 16, 1};
inline constexpr DataType kUInt8{static_cast<uint8_t>(TypeCode::kUInt), 8, 1};
}  // namespace dtype

/// @brief Device type codes, numerically equal to DLPack's DLDeviceType.
enum class DeviceType : int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,
  kCUDAManaged = 13,
};

/// @brief A device, laid out like DLPack's DLDevice.
struct Device {
  int32_t device_type = static_cast<int32_t>(DeviceType::kCPU);
  int32_t device_id = 0;

  friend bool operator==(Device a, Device b) {
    return a.device_type == b.device_type && a.device_id == b.device_id;
  }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};

inline constexpr Device kCPU{static_cast<int32_t>(DeviceType::kCPU), 0};
inline Device cuda_device(int32_t id) { return {static_cast<int32_t>(DeviceType::kCUDA), id}; }

/// @brief A non-owning strided tensor. Strides count elements, as in DLPack.
///
/// A default-constructed view (ndim == -1) means "not given" for optional arguments.
struct TensorView {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DataType dtype{};
  Device device = kCPU;
  int32_t ndim = -1;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  /// @brief True when the argument was given.
  bool defined() const { return ndim >= 0; }

  /// @brief Number of elements (product of the shape).
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }

  /// @brief A row-major contiguous view of `shape`.
  static TensorView contiguous(void* data, DataType dtype, std::initializer_list<int64_t> shape,
                               Device device = kCPU) {
    TensorView t;
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.ndim = static_cast<int32_t>(shape.size() > kMaxDims ? kMaxDims + 1 : shape.size());
    if (t.ndim > kMaxDims) return t;  // rejected by validation, which names the rank
    int i = 0;
    for (int64_t s : shape) t.shape[i++] = s;
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.strides[d] = stride;
      if (d > 0) stride *= t.shape[d];
    }
    return t;
  }

  /// @brief A view with explicit shape and strides (in elements).
  static TensorView strided(void* data, DataType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = kCPU) {
    TensorView t = contiguous(data, dtype, shape, device);
    if (t.ndim > kMaxDims || strides.size() != shape.size()) {
      t.ndim = kMaxDims + 1;  // malformed: rejected by validation
      return t;
    }
    int i = 0;
    for (int64_t s : strides) t.strides[i++] = s;
    return t;
  }
};

}  // namespace mla
