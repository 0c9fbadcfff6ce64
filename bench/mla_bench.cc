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
      "  --json           print one JSON object instead of the table\n"
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

// Fills `n` elements of `t` with values of roughly unit scale.
void fill_random(std::vector<uint8_t>& buf, mla::DataType t, size_t n, std::mt19937_64& rng) {
  using namespace mla::detail::cpu;
  buf.resize(n * dtype_bytes(t));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t i = 0; i < n; ++i) {
    if (t == mla::dtype::kFloat8E4M3) {
      // Sign, exponent 4..9 (scale 2^-3 .. 2^2) and mantissa drawn directly: never NaN.
      const int code = byte(rng);
      buf[i] = static_cast<uint8_t>((code & 0x87) | ((4 + (code >> 3) % 6) << 3));
    } else if (t == mla::dtype::kBFloat16) {
      const uint16_t h = float_to_bf16(uni(rng));
      std::memcpy(&buf[2 * i], &h, 2);
    } else if (t == mla::dtype::kFloat16) {
      const uint16_t h = float_to_fp16(uni(rng));
      std::memcpy(&buf[2 * i], &h, 2);
    } else {
      const float f = uni(rng);
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
  s.max_pages = (c.seq_len + c.page_size - 1) / c.page_size;
  s.num_pages = c.batch * s.max_pages;
  fill_random(s.query, s.q_dtype, static_cast<size_t>(c.batch * c.q_len * c.heads * D), rng);
  fill_random(s.kv, s.kv_dtype, static_cast<size_t>(s.num_pages * c.page_size * D), rng);

  // Pages handed out in a random order, as an allocator would after some churn.
  std::vector<int32_t> pages(static_cast<size_t>(s.num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  s.block_tables = pages;
  s.seq_lens.assign(static_cast<size_t>(c.batch), static_cast<int32_t>(c.seq_len));
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
  p.max_seq_len = static_cast<int32_t>(c.seq_len);
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
#endif

int run(Config c) {
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
  const bool on_cpu = !gpu;
  std::string note;
  if (on_cpu) {
    note = "no Hopper GPU here: running on the cpu reference backend at a small size";
    if (c.batch < 0) c.batch = 4;
    if (c.seq_len < 0) c.seq_len = 1024;
    if (c.iters < 0) c.iters = 5;
  } else {
    if (c.batch < 0) c.batch = 128;
    if (c.seq_len < 0) c.seq_len = 8192;
    if (c.iters < 0) c.iters = 100;
  }

  Step s;
  c.backend = "cpu";  // host buffers first; the GPU path copies them to the device
  build_step(c, s);
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
  const CheckResult check = check_sample(c, s, on_cpu);

  // Work and traffic: every attended (row, key) pair costs 2*D + 2*L FLOPs; each KV row is read
  // once, the query once, the output written once.
  const int64_t D = c.kv_lora_rank + c.rope_dim;
  int64_t keys = 0;
  for (int64_t i = 0; i < c.q_len; ++i) keys += attended_keys(c.seq_len, c.q_len, i);
  const double flops =
      static_cast<double>(c.batch * keys * c.heads) * (2.0 * D + 2.0 * c.kv_lora_rank);
  const double bytes =
      static_cast<double>(c.batch) *
      (static_cast<double>(c.seq_len * D * dtype_bytes(s.kv_dtype)) +
       static_cast<double>(c.q_len * c.heads) *
           (D * dtype_bytes(s.q_dtype) + c.kv_lora_rank * dtype_bytes(s.out_dtype)));
  const double med = median(times_us);
  const double best = *std::min_element(times_us.begin(), times_us.end());
  const double tflops = flops / (med * 1e-6) / 1e12;
  const double tbps = bytes / (med * 1e-6) / 1e12;
  const char* backend = on_cpu ? "cpu" : "sm90";

  if (c.json) {
    std::printf(
        "{\"backend\": \"%s\", \"batch\": %lld, \"seq_len\": %lld, \"heads\": %lld, \"q_len\": "
        "%lld, "
        "\"page_size\": %lld, \"kv_lora_rank\": %d, \"qk_rope_head_dim\": %d, \"dtype\": \"%s\", "
        "\"iters\": %d, \"median_us\": %.3f, \"min_us\": %.3f, \"tflops\": %.6f, \"tbps\": %.6f, "
        "\"check\": {\"requests\": %d, \"max_abs_diff\": %g, \"passed\": %s}, "
        "\"note\": \"%s\"}\n",
        backend, static_cast<long long>(c.batch), static_cast<long long>(c.seq_len),
        static_cast<long long>(c.heads), static_cast<long long>(c.q_len),
        static_cast<long long>(c.page_size), c.kv_lora_rank, c.rope_dim, c.dtype.c_str(), c.iters,
        med, best, tflops, tbps, check.requests, check.max_abs_diff, check.ok ? "true" : "false",
        note.c_str());
  } else {
    if (!note.empty()) std::printf("note: %s\n", note.c_str());
    std::printf(
        "config: backend %s, batch %lld, seq_len %lld, heads %lld, q_len %lld, page %lld, "
        "L %d, R %d, dtype %s\n",
        backend, static_cast<long long>(c.batch), static_cast<long long>(c.seq_len),
        static_cast<long long>(c.heads), static_cast<long long>(c.q_len),
        static_cast<long long>(c.page_size), c.kv_lora_rank, c.rope_dim, c.dtype.c_str());
    std::printf("check:  %d sampled requests re-run alone on cpu: %s (max abs diff %g)\n",
                check.requests,
                check.ok ? (on_cpu ? "bitwise equal" : "within tolerance") : "MISMATCH",
                check.max_abs_diff);
    std::printf("time:   median %.1f us, min %.1f us over %d iterations (%s)\n", med, best, c.iters,
                on_cpu ? "wall clock" : "CUDA events around graph replays, L2 flushed");
    std::printf("rate:   %.4f TFLOP/s, %.4f TB/s\n", tflops, tbps);
  }
  return check.ok ? 0 : 1;
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
