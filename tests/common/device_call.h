// A built case (common/decode_case.h) on the sm90 backend: device copies of its tensors, the call,
// the route it takes on this device, and the sm90 kernels' rounding allowance for the comparison
// with the oracle. Shared by the GPU suites, which skip themselves without a Hopper GPU
// (common/hopper.h).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "common/decode_case.h"
#include "common/fp8_ds_mla.h"
#include "common/fp8_mma.h"
#include "common/test_util.h"
#include "host/backends.h"
#include "mla/mla.h"
#include "sm90/host/route.h"

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(expr)

namespace mla_test::gpu {

using decode_case::Built;
using decode_case::Case;

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    ADD_FAILURE() << what << ": " << cudaGetErrorString(err);
    throw std::runtime_error(what);
  }
}

// Device copies of every tensor of a Built call; `params` is the Built's params with the data
// pointers, device and backend switched to cuda:0 / sm90.
class DeviceCall {
 public:
  // `kv_bytes`: the kv_cache's host bytes where they are not b.kv's (an fp8_ds_mla cache).
  explicit DeviceCall(Built& b, const std::vector<uint8_t>* kv_bytes = nullptr)
      : params(b.params), kv_bytes_(kv_bytes) {
    params.backend = mla::Backend::kSm90;
    for (auto& [view, host, bytes] : tensors(b, kv_bytes)) {
      (void)host;
      mla::TensorView& mine = params.*view;
      if (!mine.defined()) continue;
      void* d = nullptr;
      cuda_check(cudaMalloc(&d, std::max<size_t>(bytes, 1)), "cudaMalloc");
      device_.push_back({view, d, bytes});
      mine.data = d;
    }
    set_device(mla::cuda_device(0));
    params.workspace = mla::TensorView{};
    workspace_bytes = mla::workspace_size(params);
    cuda_check(cudaMalloc(&workspace_, std::max<size_t>(workspace_bytes, 1)), "cudaMalloc");
    // NaN in every byte: a partial the combine reads without a split having written it (an
    // empty split's acc) turns the output into NaN.
    cuda_check(cudaMemset(workspace_, 0xff, std::max<size_t>(workspace_bytes, 1)), "memset");
    params.workspace =
        mla::TensorView::contiguous(workspace_, mla::dtype::kUInt8,
                                    {static_cast<int64_t>(workspace_bytes)}, mla::cuda_device(0));
    upload(b);
  }
  ~DeviceCall() {
    for (auto& t : device_) cudaFree(t.ptr);
    cudaFree(workspace_);
  }
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;

  // Copies every input and the (poisoned) outputs of `b` into the device buffers; `b` must have
  // the shapes this call was made for.
  void upload(Built& b, cudaStream_t stream = nullptr) { upload(b, stream, kv_bytes_); }
  // The same for a call whose kv_cache's host bytes are `kv_bytes` (an fp8_ds_mla cache other
  // than the constructor's; nullptr: b.kv's).
  void upload(Built& b, cudaStream_t stream, const std::vector<uint8_t>* kv_bytes) {
    auto host = tensors(b, kv_bytes);
    for (size_t i = 0, k = 0; i < host.size(); ++i) {
      if (!(params.*host[i].view).defined()) continue;
      const Device& d = device_[k++];
      if (host[i].bytes != d.bytes) throw std::runtime_error("upload: shapes differ");
      cuda_check(cudaMemcpyAsync(d.ptr, host[i].host, d.bytes, cudaMemcpyHostToDevice, stream),
                 "upload");
    }
    cuda_check(cudaStreamSynchronize(stream), "upload sync");
  }

  // Copies out and lse back into `b`'s host buffers.
  void download(Built& b) {
    cuda_check(cudaDeviceSynchronize(), "decode");
    auto host = tensors(b, nullptr);  // the kv_cache's bytes are not read
    for (size_t i = 0, k = 0; i < host.size(); ++i) {
      if (!(params.*host[i].view).defined()) continue;
      const Device& d = device_[k++];
      if (d.view == &mla::DecodeParams::out || d.view == &mla::DecodeParams::lse) {
        cuda_check(
            cudaMemcpy(const_cast<void*>(host[i].host), d.ptr, d.bytes, cudaMemcpyDeviceToHost),
            "download");
      }
    }
  }

  mla::DecodeParams params;
  size_t workspace_bytes = 0;

 private:
  struct Host {
    mla::TensorView mla::DecodeParams::*view;
    const void* host;
    size_t bytes;
  };
  struct Device {
    mla::TensorView mla::DecodeParams::*view;
    void* ptr;
    size_t bytes;
  };

  template <typename T>
  static size_t vec_bytes(const std::vector<T>& v) {
    return v.size() * sizeof(T);
  }
  static std::vector<Host> tensors(Built& b, const std::vector<uint8_t>* kv_bytes) {
    using P = mla::DecodeParams;
    return {
        {&P::query, b.query.data(), b.query.bytes().size()},
        kv_bytes != nullptr ? Host{&P::kv_cache, kv_bytes->data(), kv_bytes->size()}
                            : Host{&P::kv_cache, b.kv.data(), b.kv.bytes().size()},
        {&P::block_tables, b.block_tables.data(), vec_bytes(b.block_tables)},
        {&P::seq_lens, b.seq_lens.data(), vec_bytes(b.seq_lens)},
        {&P::cum_seq_lens_q, b.cum_seq_lens_q.data(), vec_bytes(b.cum_seq_lens_q)},
        {&P::sinks, b.sinks.data(), vec_bytes(b.sinks)},
        {&P::mask, b.mask.data(), vec_bytes(b.mask)},
        {&P::sparse_indices, b.sparse_indices.data(), vec_bytes(b.sparse_indices)},
        {&P::sparse_topk_lens, b.topk_lens.data(), vec_bytes(b.topk_lens)},
        {&P::bmm1_scale_tensor, &b.bmm1_value, sizeof(float)},
        {&P::bmm2_scale_tensor, &b.bmm2_value, sizeof(float)},
        {&P::out, b.out.data(), b.out.bytes().size()},
        {&P::lse, b.lse.data(), b.lse.bytes().size()},
    };
  }
  void set_device(mla::Device device) {
    for (auto& t : device_) (params.*t.view).device = device;
    params.query.device = device;
  }

  const std::vector<uint8_t>* kv_bytes_ = nullptr;
  std::vector<Device> device_;
  void* workspace_ = nullptr;
};

inline ::testing::AssertionResult run_on_gpu(const mla::DecodeParams& params) {
  try {
    mla::decode(params);
  } catch (const mla::Error& e) {
    return ::testing::AssertionFailure()
           << "mla::Error (" << mla::error_code_name(e.code()) << "): " << e.what();
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(err);
  return ::testing::AssertionSuccess();
}

// The route a call takes on this device (its kernel, splits and layout), as the entry points
// compute it. The run may still leave a TMA route for the SIMT kernel where the data addresses
// are not 16-byte aligned (never for DeviceCall's cudaMalloc'd buffers).
inline mla::detail::sm90::Route route_on_device(const mla::DecodeParams& params) {
  return mla::detail::sm90::route_of(mla::detail::validate(params));
}

// The DeepSeek head dims, which every sm90 kernel takes.
inline Case deepseek(Case c) {
  c.L = 512;
  c.R = 64;
  return c;
}

// The out allowance for values rounded to 16 bits (mla_test::OutTolerance::p_rel): the wgmma
// kernels round P to the type of their GEMMs for the P V product (the kv_cache type; bf16 for a
// bf16 query over an fp8 cache, fp16 for fp8/fp8: docs/sm90-fp8.md; the SIMT kernel keeps fp32
// P), and every kernel rounds a split's partial o to the out type (params.h); each adds at most
// its half ulp times ref_abs, and p_rounding_rel allows twice that per rounding. For a row that is
// not split, or on the SIMT kernel, the allowance is only an upper bound.
// An e4m3 cache read as it lands on the few-rows kernel (route.fp8_direct): with an e4m3 query on
// the FP8 tensor cores, which round P to e4m3 and accumulate in a narrower format; with a bf16
// query in fp16 GEMMs over the query scaled into fp16's range, P in fp16. sm90_allowance adds
// those routes' per-row terms (tests/common/fp8_mma.h).
inline bool sm90_fp8_direct(const Built& b) {
  return b.c.kv_dtype == mla::dtype::kFloat8E4M3 && route_on_device(b.params).fp8_direct;
}
inline bool sm90_fp8_mma(const Built& b) {
  return b.c.q_dtype == mla::dtype::kFloat8E4M3 && sm90_fp8_direct(b);
}
// A bf16 query over an e4m3 cache in fp16 GEMMs, the query scaled per row into fp16's range: the
// few-rows kernel's direct route and sparse calls, the seesaw kernel's calls (docs/sm90-fp8.md);
// not the few-rows kernel's dense calls widened in shared memory (MLA_SM90_FP8_DIRECT=0).
inline bool sm90_scaled_query(const Built& b) {
  using mla::detail::sm90::Kernel;
  if (b.c.q_dtype != mla::dtype::kBFloat16 || b.c.kv_dtype != mla::dtype::kFloat8E4M3) return false;
  const mla::detail::sm90::Route r = route_on_device(b.params);
  return r.fp8_direct || r.kernel == Kernel::kSeesaw || (r.kernel == Kernel::kFewRows && r.sparse);
}
// The type the call's route rounds P to for its P V product.
inline mla::DataType sm90_p_dtype(const Built& b) {
  namespace dt = mla::dtype;
  mla::DataType p_dtype = b.c.kv_dtype;
  if (b.c.kv_dtype == dt::kFloat8E4M3) {
    p_dtype = b.c.q_dtype == dt::kBFloat16 ? (sm90_scaled_query(b) ? dt::kFloat16 : dt::kBFloat16)
              : sm90_fp8_direct(b)         ? dt::kFloat8E4M3
                                           : dt::kFloat16;
  }
  if (p_dtype != dt::kBFloat16 && p_dtype != dt::kFloat16 && p_dtype != dt::kFloat8E4M3) {
    p_dtype = dt::kFloat32;
  }
  return p_dtype;
}
inline double sm90_p_rel(const Built& b) {
  return mla_test::p_rounding_rel(sm90_p_dtype(b)) + mla_test::p_rounding_rel(b.c.out_dtype);
}
// P rounded to fp16 relative to the running max (P <= 1): below 2^-14 it is subnormal, which
// decode_case::with_fp16_p allows for (the e4m3 routes' allowances carry their own such term).
inline bool sm90_fp16_p(const Built& b) { return sm90_p_dtype(b) == mla::dtype::kFloat16; }
// The per-row allowances of the call's route beyond sm90_p_rel (none but on the e4m3-cache routes
// above).
inline RowAllowance sm90_allowance(const Built& b) {
  if (sm90_fp8_mma(b)) {
    return fp8_mma::allowance(b.in, route_on_device(b.params).fp8_three ? fp8_mma::kScoreStepsWhole
                                                                        : fp8_mma::kScoreSteps);
  }
  if (sm90_scaled_query(b)) return fp8_mma::scaled_query_allowance(b.in);
  return RowAllowance{};
}
inline void check_sm90(const Built& b) {
  const RowAllowance extra = sm90_allowance(b);
  decode_case::check_against_oracle(b, sm90_p_rel(b), &extra, sm90_fp16_p(b));
}

// The sum of two sets of per-row allowances (first-order errors add).
inline RowAllowance sum_of(const RowAllowance& x, const RowAllowance& y, size_t rows) {
  RowAllowance a;
  a.out_rel.assign(rows, 0.0);
  a.out_abs.assign(rows, 0.0);
  a.lse_abs.assign(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    a.out_rel[r] = x.out(r) + y.out(r);
    a.out_abs[r] = x.out_add(r) + y.out_add(r);
    a.lse_abs[r] = x.lse(r) + y.lse(r);
  }
  return a;
}

// A sparse call over an fp8_ds_mla cache on the few-rows kernel's direct route (its rows read as
// they land: route.fp8_direct; docs/sm90-sparse.md).
inline bool sm90_ds_direct(const mla::detail::sm90::Route& route) {
  return route.kernel == mla::detail::sm90::Kernel::kFewRows && route.sparse && route.fp8_direct;
}
// The allowances of that route against the exact oracle: the query scaled into fp16's range
// (fp8_mma::scaled_query_allowance; every product and the scales' products are exact or fp32) and
// P's fp16 rounding below 2^-14 (fp8_ds_mla::direct_p_allowance); P's relative rounding is the
// caller's p_rel.
inline RowAllowance ds_direct_allowance(const Built& b, const std::vector<uint8_t>& storage) {
  return sum_of(fp8_mma::scaled_query_allowance(b.in), fp8_ds_mla::direct_p_allowance(b, storage),
                static_cast<size_t>(b.in.num_tokens()) * b.in.num_heads);
}

// check_sm90 for a call over an fp8_ds_mla cache (fp8_ds_mla::use_fp8_ds_mla, b.c.kv_dtype bf16,
// its bytes in `storage`) that took `route`. The gather kernels (any route but SIMT) round each
// dequantized latent value to bf16 and P to bf16 for their bf16 GEMMs: sm90_p_rel plus
// fp8_ds_mla::dequant_rounding_allowance; the direct route (sm90_ds_direct) keeps the latent values
// exact and adds ds_direct_allowance instead. The SIMT kernel dequantizes in fp32 and keeps P in
// fp32: only the partials' rounding to the out type.
inline void check_sm90_ds_mla(const Built& b, const mla::detail::sm90::Route& route,
                              const std::vector<uint8_t>& storage) {
  if (sm90_ds_direct(route)) {
    const RowAllowance extra = ds_direct_allowance(b, storage);
    decode_case::check_against_oracle(b, sm90_p_rel(b), &extra);
  } else if (route.kernel != mla::detail::sm90::Kernel::kSimt) {  // the gather kernels
    const RowAllowance rounding = fp8_ds_mla::dequant_rounding_allowance(b.in);
    decode_case::check_against_oracle(b, sm90_p_rel(b), &rounding);
  } else {
    decode_case::check_against_oracle(b, mla_test::p_rounding_rel(b.c.out_dtype));
  }
}

}  // namespace mla_test::gpu
