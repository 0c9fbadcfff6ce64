// Device facts of the sm90 backend (device.h) and its device check (host/backends.h).
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <string>

#include "host/backends.h"
#include "host/check.h"
#include "sm90/host/device.h"

namespace mla::detail::sm90 {
namespace {

// Per-device facts, read once: compute capability and SM count (0: not read yet).
constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> g_sm_count{};
std::array<std::atomic<int>, kMaxDevices> g_cc{};  // major * 10 + minor

}  // namespace

int sm_count(int device) {
  int count = device < kMaxDevices ? g_sm_count[device].load() : 0;
  if (count == 0) {
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
                   "cudaDeviceGetAttribute(MultiProcessorCount, " << device << ")");
    if (device < kMaxDevices) g_sm_count[device].store(count);
  }
  return count;
}

void check_device(Device device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    MLA_FAIL(ErrorCode::kUnsupported,
             "backend: sm90 is not available: no CUDA device found for "
                 << device_str(device) << " (cudaGetDeviceCount: "
                 << (err != cudaSuccess
                         ? std::string(cudaGetErrorName(err)) + ", " + cudaGetErrorString(err)
                         : std::string("0 devices"))
                 << ")");
  }
  const int id = device.device_id;
  MLA_CHECK_ARG(
      id >= 0 && id < count, ErrorCode::kDeviceError,
      "query: expected a CUDA device id in [0, " << count << "), got " << device_str(device));
  int cc = id < kMaxDevices ? g_cc[id].load() : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id),
                   "cudaDeviceGetAttribute(ComputeCapabilityMajor, " << id << ")");
    MLA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id),
                   "cudaDeviceGetAttribute(ComputeCapabilityMinor, " << id << ")");
    cc = major * 10 + minor;
    if (id < kMaxDevices) g_cc[id].store(cc);
  }
  if (cc != 90) {
    cudaDeviceProp prop{};
    std::string name = "unknown";
    if (cudaGetDeviceProperties(&prop, id) == cudaSuccess) name = prop.name;
    MLA_FAIL(ErrorCode::kUnsupported,
             "backend: sm90 needs a compute capability 9.0 (Hopper) GPU, but "
                 << device_str(device) << " is " << name << " with compute capability " << cc / 10
                 << "." << cc % 10 << "; no other GPU backend is available");
  }
}

}  // namespace mla::detail::sm90
