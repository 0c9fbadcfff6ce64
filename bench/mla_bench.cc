// mla-bench: runs one DeepSeek-V3-shaped MLA decode step on the best available backend, checks a
// sample of it, and reports time, TFLOP/s and TB/s. Never asserts timing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/numeric.h"
#include "mla/mla.h"

#ifdef MLA_BENCH_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

namespace {

struct Config {
  int64_t batch = -1;    // -1: backend default
  int64_t seq_len = -1;  // -1: backend default
  int64_t heads = 128;
  int64_t q_len = 1;
  int64_t page_size = 64;
  int32_t kv_lora_rank = 512;
  int32_t rope_dim = 64;
  std::string dtype = "bf16";  // bf16, fp16, fp8, bf16-fp8 (query bf16, cache fp8), fp32
  std::string backend = "auto";
  int iters = -1;  // -1: backend default
  int warmup = 1;
  uint64_t seed = 1;
  bool json = false;
  int64_t seq_sd = 0;     // > 0: seq lens drawn from N(seq_len, seq_sd), at least q_len ("varlen")
  std::string suite;      // "goals": the Hopper goal table; empty: one configuration
  std::string json_out;   // --json-out FILE: one JSON object per configuration
  std::string times_out;  // --times-out FILE: every timed iteration, one line each
  bool ceilings = false;  // measure device copy bandwidth and bf16 matmul rate first
  bool pdl = false;       // enable_pdl: programmatic dependent launch between the kernels
};

void usage() {
  std::puts(
      "usage: mla-bench [options]\n"
      "  --batch N        requests in the batch (default: 128 on sm90, 4 on cpu)\n"
      "  --seq-len N      cached tokens per request, query tokens included (default: 8192 on\n"
      "                   sm90, 1024 on cpu)\n"
      "  --heads N        query heads (default 128)\n"
      "  --q-len N        query tokens per request (default 1)\n"
      "  --page-size N    tokens per KV page (default 64)\n"
      "  --dtype T        bf16 | fp16 | fp8 | bf16-fp8 (query bf16, cache fp8) | fp32 (cpu only)\n"
      "  --backend B      auto | sm90 | cpu (default auto: the best available)\n"
      "  --iters N        timed iterations (default: 100 on sm90, 5 on cpu)\n"
      "  --warmup N       untimed iterations first (default 1)\n"
      "  --seed N         input seed (default 1)\n"
      "  --seq-sd N       varlen: seq lens drawn from a normal distribution with mean --seq-len\n"
      "                   and this standard deviation, at least q_len (default 0: fixed)\n"
      "  --suite goals    run the Hopper goal table (10 configurations) and print a summary\n"
      "  --ceilings       measure the device copy bandwidth and bf16 matmul rate first (GPU)\n"
      "  --pdl            launch the kernels of a call with programmatic dependent launch\n"
      "  --json           print one JSON object per configuration instead of the table\n"
      "  --json-out FILE  also write one JSON object per configuration to FILE\n"
      "  --times-out FILE also write every timed iteration to FILE (configuration index, us)\n"
      "Shape: D = kv_lora_rank 512 + rope 64; FLOPs = rows x keys x (2*576 + 2*512).");
}

bool parse_args(int argc, char** argv, Config& c) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mla-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto integer = [&]() -> int64_t {
      const char* v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v, &end, 10);
      if (*v == '\0' || *end != '\0') {
        std::fprintf(stderr, "mla-bench: %s expects an integer, got '%s'\n", a.c_str(), v);
        std::exit(2);
      }
      return n;
    };
    if (a == "--batch")
      c.batch = integer();
    else if (a == "--seq-len")
      c.seq_len = integer();
    else if (a == "--heads")
      c.heads = integer();
    else if (a == "--q-len")
      c.q_len = integer();
    else if (a == "--page-size")
      c.page_size = integer();
    else if (a == "--dtype")
      c.dtype = value();
    else if (a == "--backend")
      c.backend = value();
    else if (a == "--iters")
      c.iters = static_cast<int>(integer());
    else if (a == "--warmup")
      c.warmup = static_cast<int>(integer());
    else if (a == "--seed")
      c.seed = static_cast<uint64_t>(integer());
    else if (a == "--json")
      c.json = true;
    else if (a == "--seq-sd")
      c.seq_sd = integer();
    else if (a == "--suite")
      c.suite = value();
    else if (a == "--json-out")
      c.json_out = value();
    else if (a == "--times-out")
      c.times_out = value();
    else if (a == "--ceilings")
      c.ceilings = true;
    else if (a == "--pdl")
      c.pdl = true;
    else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "mla-bench: unknown option '%s' (see --help)\n", a.c_str());
      return false;
    }
  }
  return true;
}

// Host buffers of one decode step, plus the DecodeParams that view them.
struct Step {
  mla::DataType q_dtype, kv_dtype, out_dtype;
  std::vector<uint8_t> query, kv, out, workspace;
  std::vector<float> lse;
  std::vector<int32_t> block_tables, seq_lens;
  int64_t num_pages = 0, max_pages = 0;
  mla::DecodeParams params;
};

size_t dtype_bytes(mla::DataType t) { return t.bits / 8; }

// xorshift64*: fast enough to fill gigabytes of inputs in seconds.
struct FastRng {
  uint64_t state;
  explicit FastRng(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-23f - 1.0f; }  // [-1, 1)
};

// Fills `n` elements of `t` with values of roughly unit scale.
void fill_random(std::vector<uint8_t>& buf, mla::DataType t, size_t n, FastRng& rng) {
  using namespace mla::detail::cpu;
  buf.resize(n * dtype_bytes(t));
  for (size_t i = 0; i < n; ++i) {
    if (t == mla::dtype::kFloat8E4M3) {
      // Sign, exponent 4..9 (scale 2^-3 .. 2^2) and mantissa drawn directly: never NaN.
      const uint32_t code = static_cast<uint32_t>(rng.next() >> 56);
      buf[i] = static_cast<uint8_t>((code & 0x87) | ((4 + (code >> 3) % 6) << 3));
    } else if (t == mla::dtype::kBFloat16) {
      const uint16_t h = float_to_bf16(rng.uniform());
      std::memcpy(&buf[2 * i], &h, 2);
    } else if (t == mla::dtype::kFloat16) {
      const uint16_t h = float_to_fp16(rng.uniform());
      std::memcpy(&buf[2 * i], &h, 2);
    } else {
      const float f = rng.uniform();
      std::memcpy(&buf[4 * i], &f, 4);
    }
  }
}

void build_step(const Config& c, Step& s) {
  if (c.dtype == "bf16")
    s.q_dtype = s.kv_dtype = mla::dtype::kBFloat16;
  else if (c.dtype == "fp16")
    s.q_dtype = s.kv_dtype = mla::dtype::kFloat16;
  else if (c.dtype == "fp8")
    s.q_dtype = s.kv_dtype = mla::dtype::kFloat8E4M3;
  else if (c.dtype == "fp32")
    s.q_dtype = s.kv_dtype = mla::dtype::kFloat32;
  else if (c.dtype == "bf16-fp8") {
    s.q_dtype = mla::dtype::kBFloat16;
    s.kv_dtype = mla::dtype::kFloat8E4M3;
  } else {
    throw mla::Error(mla::ErrorCode::kTypeError,
                     "--dtype: expected bf16, fp16, fp8, bf16-fp8 or fp32, got '" + c.dtype + "'");
  }
  s.out_dtype = s.q_dtype == mla::dtype::kFloat16 ? mla::dtype::kFloat16 : mla::dtype::kBFloat16;

  const int64_t D = c.kv_lora_rank + c.rope_dim;
  std::mt19937_64 rng(c.seed);
  s.seq_lens.assign(static_cast<size_t>(c.batch), static_cast<int32_t>(c.seq_len));
  if (c.seq_sd > 0) {
    std::normal_distribution<double> normal(static_cast<double>(c.seq_len),
                                            static_cast<double>(c.seq_sd));
    for (int32_t& len : s.seq_lens) {
      len = static_cast<int32_t>(
          std::max<double>(static_cast<double>(c.q_len), std::min(std::round(normal(rng)), 1e9)));
    }
  }
  const int64_t max_len =
      s.seq_lens.empty() ? 0 : *std::max_element(s.seq_lens.begin(), s.seq_lens.end());
  s.max_pages = (max_len + c.page_size - 1) / c.page_size;
  // Each request owns exactly the pages it needs, handed out in a random order as an allocator
  // would after some churn; unused block_tables slots hold an invalid id.
  int64_t needed = 0;
  for (int32_t len : s.seq_lens) needed += (len + c.page_size - 1) / c.page_size;
  s.num_pages = std::max<int64_t>(needed, 1);
  FastRng fast(c.seed);
  fill_random(s.query, s.q_dtype, static_cast<size_t>(c.batch * c.q_len * c.heads * D), fast);
  fill_random(s.kv, s.kv_dtype, static_cast<size_t>(s.num_pages * c.page_size * D), fast);
  std::vector<int32_t> pages(static_cast<size_t>(s.num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  s.block_tables.assign(static_cast<size_t>(c.batch * s.max_pages), -1);
  size_t next = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = (s.seq_lens[b] + c.page_size - 1) / c.page_size;
    for (int64_t i = 0; i < n; ++i) s.block_tables[b * s.max_pages + i] = pages[next++];
  }
  s.out.assign(
      static_cast<size_t>(c.batch * c.q_len * c.heads * c.kv_lora_rank) * dtype_bytes(s.out_dtype),
      0);
  s.lse.assign(static_cast<size_t>(c.batch * c.q_len * c.heads), 0.0f);

  mla::DecodeParams& p = s.params;
  p.query = mla::TensorView::contiguous(s.query.data(), s.q_dtype, {c.batch, c.q_len, c.heads, D});
  p.kv_cache = mla::TensorView::contiguous(s.kv.data(), s.kv_dtype, {s.num_pages, c.page_size, D});
  p.block_tables = mla::TensorView::contiguous(s.block_tables.data(), mla::dtype::kInt32,
                                               {c.batch, s.max_pages});
  p.seq_lens = mla::TensorView::contiguous(s.seq_lens.data(), mla::dtype::kInt32, {c.batch});
  p.out = mla::TensorView::contiguous(s.out.data(), s.out_dtype,
                                      {c.batch, c.q_len, c.heads, c.kv_lora_rank});
  p.lse =
      mla::TensorView::contiguous(s.lse.data(), mla::dtype::kFloat32, {c.batch, c.q_len, c.heads});
  p.kv_lora_rank = c.kv_lora_rank;
  p.qk_rope_head_dim = c.rope_dim;
  p.qk_nope_head_dim = 128;
  p.max_seq_len = static_cast<int32_t>(max_len);
  p.bmm1_scale = 1.0f / std::sqrt(192.0f);  // 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
  p.backend = mla::parse_backend(c.backend);
  s.workspace.assign(mla::workspace_size(p), 0);
  p.workspace = mla::TensorView::contiguous(s.workspace.data(), mla::dtype::kUInt8,
                                            {static_cast<int64_t>(s.workspace.size())});
}

// Keys attended by query token i of a request with `seq_len` tokens and `n` query tokens (causal).
int64_t attended_keys(int64_t seq_len, int64_t n, int64_t i) {
  return std::max<int64_t>(0, std::min(seq_len, seq_len - n + i + 1));
}

// Re-runs a few requests alone on the cpu backend and compares their rows bitwise: a request's
// result must not depend on the rest of the batch.
struct CheckResult {
  int requests = 0;
  double max_abs_diff = 0.0;
  bool ok = true;
};

// With `bitwise` false (a GPU run against the cpu backend: another summation order), a value
// passes within 2^-7 relative + 1e-3 absolute.
CheckResult check_sample(const Config& c, const Step& s, bool bitwise) {
  using mla::detail::cpu::bf16_to_float;
  using mla::detail::cpu::fp16_to_float;
  CheckResult r;
  const int64_t D = c.kv_lora_rank + c.rope_dim;
  const size_t q_row_bytes = static_cast<size_t>(c.q_len * c.heads * D) * dtype_bytes(s.q_dtype);
  const size_t out_elems = static_cast<size_t>(c.q_len * c.heads * c.kv_lora_rank);
  const int64_t samples[] = {0, c.batch / 2, c.batch - 1};
  int64_t last = -1;
  for (int64_t b : samples) {
    if (b < 0 || b == last) continue;
    last = b;
    mla::DecodeParams p = s.params;
    std::vector<uint8_t> out(out_elems * dtype_bytes(s.out_dtype));
    std::vector<uint8_t> ws;
    p.backend = mla::Backend::kCpu;
    p.query = mla::TensorView::contiguous(const_cast<uint8_t*>(s.query.data()) + b * q_row_bytes,
                                          s.q_dtype, {1, c.q_len, c.heads, D});
    p.block_tables =
        mla::TensorView::contiguous(const_cast<int32_t*>(s.block_tables.data()) + b * s.max_pages,
                                    mla::dtype::kInt32, {1, s.max_pages});
    p.seq_lens = mla::TensorView::contiguous(const_cast<int32_t*>(s.seq_lens.data()) + b,
                                             mla::dtype::kInt32, {1});
    p.out =
        mla::TensorView::contiguous(out.data(), s.out_dtype, {1, c.q_len, c.heads, c.kv_lora_rank});
    p.lse = mla::TensorView();
    ws.resize(mla::workspace_size(p));
    p.workspace = mla::TensorView::contiguous(ws.data(), mla::dtype::kUInt8,
                                              {static_cast<int64_t>(ws.size())});
    mla::decode(p);
    const uint8_t* got = s.out.data() + b * out.size();
    for (size_t e = 0; e < out_elems; ++e) {
      uint16_t x, y;
      std::memcpy(&x, got + 2 * e, 2);
      std::memcpy(&y, out.data() + 2 * e, 2);
      const bool bf = s.out_dtype == mla::dtype::kBFloat16;
      const double fx = bf ? bf16_to_float(x) : fp16_to_float(x);
      const double fy = bf ? bf16_to_float(y) : fp16_to_float(y);
      const double diff = std::fabs(fx - fy);
      if (std::isnan(diff) || diff > r.max_abs_diff) r.max_abs_diff = diff;
      if (bitwise ? x != y : !(diff <= std::fabs(fy) / 128 + 1e-3)) r.ok = false;
    }
    ++r.requests;
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The q-th quantile (0..1) of v, the nearest rank at or above it.
double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

#ifdef MLA_BENCH_WITH_CUDA
bool hopper_present() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major == 9 && minor == 0;
}

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw mla::Error(mla::ErrorCode::kRuntimeError,
                     std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// Copies `bytes` of host memory to a new device buffer; records it in `owned`.
void* to_device(const void* host, size_t bytes, std::vector<void*>& owned) {
  void* d = nullptr;
  cuda_ok(cudaMalloc(&d, std::max<size_t>(bytes, 1)), "cudaMalloc");
  owned.push_back(d);
  if (host != nullptr) cuda_ok(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "upload");
  return d;
}

// One step on the GPU: device copies of the inputs, plan + run captured in a CUDA graph, L2 flushed
// (256 MB written) before each replay, each replay timed with events. out comes back into `s`.
std::vector<double> time_on_gpu(const Config& c, Step& s) {
  std::vector<void*> owned;
  mla::DecodeParams p = s.params;
  const mla::Device dev = mla::cuda_device(0);
  auto move = [&](mla::TensorView& t, const void* host, size_t bytes) {
    t.data = to_device(host, bytes, owned);
    t.device = dev;
  };
  move(p.query, s.query.data(), s.query.size());
  move(p.kv_cache, s.kv.data(), s.kv.size());
  move(p.block_tables, s.block_tables.data(), s.block_tables.size() * 4);
  move(p.seq_lens, s.seq_lens.data(), s.seq_lens.size() * 4);
  move(p.out, nullptr, s.out.size());
  move(p.lse, nullptr, s.lse.size() * 4);
  p.backend = mla::Backend::kSm90;
  p.enable_pdl = c.pdl;
  p.workspace = mla::TensorView();
  const size_t ws_bytes = mla::workspace_size(p);
  p.workspace = mla::TensorView::contiguous(to_device(nullptr, ws_bytes, owned), mla::dtype::kUInt8,
                                            {static_cast<int64_t>(ws_bytes)}, dev);
  const size_t flush_bytes = size_t{256} << 20;
  void* flush = to_device(nullptr, flush_bytes, owned);

  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  p.stream = stream;
  for (int i = 0; i < std::max(1, c.warmup); ++i) mla::decode(p);
  cuda_ok(cudaStreamSynchronize(stream), "warm-up");

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  mla::run(mla::plan(p), p);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "event");
  cuda_ok(cudaEventCreate(&stop), "event");
  std::vector<double> times_us;
  for (int i = 0; i < std::max(1, c.iters); ++i) {
    cuda_ok(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream), "flush");
    cuda_ok(cudaEventRecord(start, stream), "record");
    cuda_ok(cudaGraphLaunch(exec, stream), "replay");
    cuda_ok(cudaEventRecord(stop, stream), "record");
    cuda_ok(cudaEventSynchronize(stop), "replay");
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times_us.push_back(1000.0 * ms);
  }
  cuda_ok(cudaMemcpy(s.out.data(), p.out.data, s.out.size(), cudaMemcpyDeviceToHost), "download");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  for (void* d : owned) cudaFree(d);
  return times_us;
}

// Physical ceilings measured on this device: a 4 GiB device-to-device copy (bytes read + written)
// and an 8192^3 bf16 matmul through cuBLAS, each the median of 10 after a warm-up.
struct Ceilings {
  bool measured = false;
  double copy_tbps = 0, matmul_tflops = 0;
};

Ceilings measure_ceilings() {
  Ceilings c;
  if (!hopper_present()) return c;
  std::vector<void*> owned;
  const size_t copy_bytes = size_t{2} << 30;
  void* a = to_device(nullptr, copy_bytes, owned);
  void* b = to_device(nullptr, copy_bytes, owned);
  cuda_ok(cudaMemset(a, 1, copy_bytes), "memset");
  const int n = 8192;
  const size_t mat_bytes = size_t{n} * n * 2;
  std::vector<uint16_t> host(size_t{n} * n);
  FastRng rng(7);
  for (uint16_t& h : host) h = mla::detail::cpu::float_to_bf16(rng.uniform());
  void* x = to_device(host.data(), mat_bytes, owned);
  void* y = to_device(host.data(), mat_bytes, owned);
  void* z = to_device(nullptr, mat_bytes, owned);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    throw mla::Error(mla::ErrorCode::kRuntimeError, "cublasCreate failed");
  }
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "event");
  cuda_ok(cudaEventCreate(&stop), "event");
  auto time_ms = [&](auto&& body) {
    std::vector<double> ms;
    body();
    for (int i = 0; i < 10; ++i) {
      cuda_ok(cudaEventRecord(start), "record");
      body();
      cuda_ok(cudaEventRecord(stop), "record");
      cuda_ok(cudaEventSynchronize(stop), "sync");
      float t = 0;
      cuda_ok(cudaEventElapsedTime(&t, start, stop), "elapsed");
      ms.push_back(t);
    }
    return median(ms);
  };
  const double copy_ms = time_ms(
      [&] { cuda_ok(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice), "copy"); });
  const float alpha = 1.0f, beta = 0.0f;
  const double mm_ms = time_ms([&] {
    if (cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, x, CUDA_R_16BF, n, y,
                     CUDA_R_16BF, n, &beta, z, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      throw mla::Error(mla::ErrorCode::kRuntimeError, "cublasGemmEx failed");
    }
  });
  c.copy_tbps = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e-3) / 1e12;
  c.matmul_tflops = 2.0 * n * static_cast<double>(n) * n / (mm_ms * 1e-3) / 1e12;
  c.measured = true;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasDestroy(handle);
  for (void* d : owned) cudaFree(d);
  return c;
}
#else
struct Ceilings {
  bool measured = false;
  double copy_tbps = 0, matmul_tflops = 0;
};
Ceilings measure_ceilings() { return {}; }
#endif

struct Result {
  Config config;  // with the defaults resolved
  const char* backend = "cpu";
  std::string note;
  int64_t mean_seq_len = 0, max_seq_len = 0;
  double median_us = 0, min_us = 0, p90_us = 0, tflops = 0, tbps = 0;
  std::vector<double> times_us;  // every timed iteration, in order
  CheckResult check;
};

Result measure(Config c) {
  const mla::Backend requested = mla::parse_backend(c.backend);
#ifdef MLA_BENCH_WITH_CUDA
  const bool gpu = requested != mla::Backend::kCpu && hopper_present();
#else
  const bool gpu = false;
#endif
  if (requested == mla::Backend::kSm90 && !gpu) {
    throw mla::Error(mla::ErrorCode::kUnsupported,
                     "--backend: sm90 needs a CUDA build and a compute capability 9.0 GPU; none "
                     "is available here");
  }
  Result r;
  const bool on_cpu = !gpu;
  if (on_cpu) {
    r.note = "no Hopper GPU here: running on the cpu reference backend at a small size";
    if (c.batch < 0) c.batch = 4;
    if (c.seq_len < 0) c.seq_len = 1024;
    if (c.iters < 0) c.iters = 5;
  } else {
    if (c.batch < 0) c.batch = 128;
    if (c.seq_len < 0) c.seq_len = 8192;
    if (c.iters < 0) c.iters = 100;
  }

  Step s;
  Config host = c;
  host.backend = "cpu";  // host buffers first; the GPU path copies them to the device
  build_step(host, s);
  std::vector<double> times_us;
  if (on_cpu) {
    for (int i = 0; i < c.warmup; ++i) mla::decode(s.params);
    for (int i = 0; i < std::max(1, c.iters); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      mla::decode(s.params);
      const auto t1 = std::chrono::steady_clock::now();
      times_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  } else {
#ifdef MLA_BENCH_WITH_CUDA
    times_us = time_on_gpu(c, s);
#endif
  }
  r.check = check_sample(c, s, on_cpu);

  // Work and traffic: every attended (row, key) pair costs 2*D + 2*L FLOPs; each KV row is read
  // once, the query once, the output written once.
  const int64_t D = c.kv_lora_rank + c.rope_dim;
  double pairs = 0, kv_rows = 0;
  for (int32_t len : s.seq_lens) {
    for (int64_t i = 0; i < c.q_len; ++i) pairs += attended_keys(len, c.q_len, i);
    kv_rows += len;
    r.max_seq_len = std::max<int64_t>(r.max_seq_len, len);
  }
  r.mean_seq_len = c.batch > 0 ? static_cast<int64_t>(kv_rows / c.batch) : 0;
  const double flops = pairs * c.heads * (2.0 * D + 2.0 * c.kv_lora_rank);
  const double bytes = kv_rows * D * dtype_bytes(s.kv_dtype) +
                       static_cast<double>(c.batch * c.q_len * c.heads) *
                           (D * dtype_bytes(s.q_dtype) + c.kv_lora_rank * dtype_bytes(s.out_dtype));
  r.median_us = median(times_us);
  r.min_us = *std::min_element(times_us.begin(), times_us.end());
  r.p90_us = percentile(times_us, 0.9);
  r.tflops = flops / (r.median_us * 1e-6) / 1e12;
  r.tbps = bytes / (r.median_us * 1e-6) / 1e12;
  r.backend = on_cpu ? "cpu" : "sm90";
  r.config = c;
  r.times_us = std::move(times_us);
  return r;
}

std::string to_json(const Result& r) {
  const Config& c = r.config;
  char buf[1024];
  std::snprintf(
      buf, sizeof(buf),
      "{\"backend\": \"%s\", \"batch\": %lld, \"seq_len\": %lld, \"seq_sd\": %lld, "
      "\"mean_seq_len\": %lld, \"max_seq_len\": %lld, \"heads\": %lld, \"q_len\": %lld, "
      "\"page_size\": %lld, \"kv_lora_rank\": %d, \"qk_rope_head_dim\": %d, \"dtype\": \"%s\", "
      "\"iters\": %d, \"median_us\": %.3f, \"min_us\": %.3f, \"p90_us\": %.3f, \"tflops\": %.6f, "
      "\"tbps\": %.6f, "
      "\"check\": {\"requests\": %d, \"max_abs_diff\": %g, \"passed\": %s}, \"note\": \"%s\"}",
      r.backend, static_cast<long long>(c.batch), static_cast<long long>(c.seq_len),
      static_cast<long long>(c.seq_sd), static_cast<long long>(r.mean_seq_len),
      static_cast<long long>(r.max_seq_len), static_cast<long long>(c.heads),
      static_cast<long long>(c.q_len), static_cast<long long>(c.page_size), c.kv_lora_rank,
      c.rope_dim, c.dtype.c_str(), c.iters, r.median_us, r.min_us, r.p90_us, r.tflops, r.tbps,
      r.check.requests, r.check.max_abs_diff, r.check.ok ? "true" : "false", r.note.c_str());
  return buf;
}

void print_text(const Result& r) {
  const Config& c = r.config;
  const bool on_cpu = std::string(r.backend) == "cpu";
  if (!r.note.empty()) std::printf("note: %s\n", r.note.c_str());
  std::printf(
      "config: backend %s, batch %lld, seq_len %lld%s, heads %lld, q_len %lld, page %lld, "
      "L %d, R %d, dtype %s\n",
      r.backend, static_cast<long long>(c.batch), static_cast<long long>(c.seq_len),
      c.seq_sd > 0 ? (" (varlen, sd " + std::to_string(c.seq_sd) + ", drawn mean " +
                      std::to_string(r.mean_seq_len) + ")")
                         .c_str()
                   : "",
      static_cast<long long>(c.heads), static_cast<long long>(c.q_len),
      static_cast<long long>(c.page_size), c.kv_lora_rank, c.rope_dim, c.dtype.c_str());
  std::printf("check:  %d sampled requests re-run alone on cpu: %s (max abs diff %g)\n",
              r.check.requests,
              r.check.ok ? (on_cpu ? "bitwise equal" : "within tolerance") : "MISMATCH",
              r.check.max_abs_diff);
  std::printf(
      "time:   median %.1f us, min %.1f us, 90th percentile %.1f us over %d iterations (%s)\n",
      r.median_us, r.min_us, r.p90_us, c.iters,
      on_cpu ? "wall clock" : "CUDA events around graph replays, L2 flushed");
  std::printf("rate:   %.4f TFLOP/s, %.4f TB/s\n", r.tflops, r.tbps);
}

// The Hopper goal table: DeepSeek-V3 shapes (page 64, bf16); seq_sd > 0 is the varlen row.
std::vector<Config> goal_suite(const Config& base) {
  struct Row {
    int64_t batch, q_len, seq_len, seq_sd, heads;
  };
  const Row rows[] = {{128, 1, 8192, 0, 128},   {128, 2, 8192, 0, 128}, {128, 4, 8192, 0, 128},
                      {64, 2, 8192, 4096, 128}, {8, 1, 32768, 0, 128},  {128, 1, 8192, 0, 64},
                      {128, 1, 8192, 0, 16},    {1, 1, 8192, 0, 128},   {1, 1, 65536, 0, 128},
                      {1, 1, 8192, 0, 16}};
  std::vector<Config> out;
  for (const Row& row : rows) {
    Config c = base;
    c.batch = row.batch;
    c.q_len = row.q_len;
    c.seq_len = row.seq_len;
    c.seq_sd = row.seq_sd;
    c.heads = row.heads;
    out.push_back(c);
  }
  return out;
}

int run(const Config& c) {
  FILE* json_file = nullptr;
  if (!c.json_out.empty()) {
    json_file = std::fopen(c.json_out.c_str(), "w");
    if (json_file == nullptr) {
      throw mla::Error(mla::ErrorCode::kInvalidArgument,
                       "--json-out: cannot open '" + c.json_out + "' for writing");
    }
  }
  FILE* times_file = nullptr;
  if (!c.times_out.empty()) {
    times_file = std::fopen(c.times_out.c_str(), "w");
    if (times_file == nullptr) {
      if (json_file != nullptr) std::fclose(json_file);
      throw mla::Error(mla::ErrorCode::kInvalidArgument,
                       "--times-out: cannot open '" + c.times_out + "' for writing");
    }
  }
  Ceilings ceilings;
  if (c.ceilings || c.suite == "goals") ceilings = measure_ceilings();
  if (!c.suite.empty() && c.suite != "goals") {
    throw mla::Error(mla::ErrorCode::kInvalidArgument,
                     "--suite: expected 'goals', got '" + c.suite + "'");
  }
  const std::vector<Config> configs = c.suite.empty() ? std::vector<Config>{c} : goal_suite(c);
  std::vector<Result> results;
  bool ok = true;
  for (const Config& config : configs) {
    results.push_back(measure(config));
    const Result& r = results.back();
    ok = ok && r.check.ok;
    if (json_file != nullptr) std::fprintf(json_file, "%s\n", to_json(r).c_str());
    if (times_file != nullptr) {
      for (double t : r.times_us) std::fprintf(times_file, "%zu %.3f\n", results.size() - 1, t);
    }
    if (c.json) {
      std::printf("%s\n", to_json(r).c_str());
    } else if (c.suite.empty()) {
      print_text(r);
    }
    std::fflush(stdout);
  }
  if (json_file != nullptr) std::fclose(json_file);
  if (times_file != nullptr) std::fclose(times_file);
  if (ceilings.measured) {
    std::printf(
        "ceilings: device copy %.2f TB/s (bytes read + written), bf16 matmul %.0f TFLOP/s "
        "(8192^3, cuBLAS)\n",
        ceilings.copy_tbps, ceilings.matmul_tflops);
  }
  if (!c.suite.empty() && !c.json) {
    std::printf("| batch | q_len | seq_len | heads | median us | TFLOP/s | TB/s | check |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const Result& r : results) {
      const Config& k = r.config;
      // NOTE: a varlen row's drawn lengths have their own mean (the work measured), shown too.
      const std::string varlen =
          k.seq_sd > 0 ? " varlen (drawn mean " + std::to_string(r.mean_seq_len) + ")" : "";
      std::printf("| %lld | %lld | %lld%s | %lld | %.1f | %.1f | %.2f | %s |\n",
                  static_cast<long long>(k.batch), static_cast<long long>(k.q_len),
                  static_cast<long long>(k.seq_len), varlen.c_str(),
                  static_cast<long long>(k.heads), r.median_us, r.tflops, r.tbps,
                  r.check.ok ? "ok" : "MISMATCH");
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (!parse_args(argc, argv, c)) return 2;
  try {
    return run(c);
  } catch (const mla::Error& e) {
    std::fprintf(stderr, "mla-bench: error (%s): %s\n", mla::error_code_name(e.code()), e.what());
    return 1;
  }
}
