// Whether this machine has the GPU the sm90 tests need, and the skip that uses it (the GPU suites
// skip themselves without one: CI runs them on machines without a GPU).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace mla_test {

// A CUDA device 0 of compute capability 9.0 (the sm_90a kernels run on nothing else); read once.
inline bool has_hopper() {
  static const bool present = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      return false;
    }
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    return major == 9 && minor == 0;
  }();
  return present;
}

}  // namespace mla_test

#define SKIP_WITHOUT_HOPPER()                                                                  \
  do {                                                                                         \
    if (!::mla_test::has_hopper()) GTEST_SKIP() << "no CUDA device of compute capability 9.0"; \
  } while (0)
