// What the sm90 host code asks of the CUDA runtime: the current-device guard, the per-device SM
// count, and the error check of runtime calls.
#pragma once

#include <cuda_runtime_api.h>

#include "host/check.h"

// Throws mla::Error (RuntimeError) naming `what` where a CUDA runtime call fails.
#define MLA_CUDA_CHECK(expr, what)                                                                \
  do {                                                                                            \
    const cudaError_t mla_cuda_err_ = (expr);                                                     \
    if (mla_cuda_err_ != cudaSuccess) {                                                           \
      MLA_FAIL(ErrorCode::kRuntimeError,                                                          \
               "backend sm90: " << what << " failed: " << cudaGetErrorName(mla_cuda_err_) << " (" \
                                << cudaGetErrorString(mla_cuda_err_) << ")");                     \
    }                                                                                             \
  } while (0)

namespace mla::detail::sm90 {

// Makes `device` current for the scope; restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device)
      MLA_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice(" << device << ")");
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      cudaSetDevice(previous_);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The SM count of `device`, read once per device.
int sm_count(int device);

}  // namespace mla::detail::sm90
