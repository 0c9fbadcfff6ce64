// mla-bench: runs one DeepSeek-V3-shaped MLA decode step (dense, or DeepSeek-V3.2's sparse top-k
// with a plain or fp8_ds_mla cache) on the best available backend, checks a sample of it, and
// reports time, TFLOP/s and TB/s. Never asserts timing.
//
// Exit status: 0 done (the check passed); 1 the check found a mismatch, or the runtime failed (a
// CUDA error, out of memory); 2 a usage error: a bad flag or value, or a combination of flags that
// this machine or the chosen backend cannot run (the message names the flag or quotes the
// library's).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/numeric.h"
#include "mla/mla.h"

#ifdef MLA_BENCH_WITH_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

// bench/read_floor.cu: a plain read of `bytes` at `data` on `stream`.
cudaError_t mla_bench_enqueue_read(const void* data, size_t bytes, uint32_t* sink, int sms,
                                   cudaStream_t stream);
#endif

namespace {

// A bad command line, or flags this machine cannot run: printed, then exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
  int64_t seq_sd = 0;      // > 0: seq lens drawn from N(seq_len, seq_sd), at least q_len ("varlen")
  std::string suite;       // "goals" or "sweep" (suite_of); empty: one configuration
  bool list = false;       // --list: print the suite's configurations, run nothing
  std::string json_out;    // --json-out FILE: one JSON object per configuration
  std::string times_out;   // --times-out FILE: every timed iteration, one line each
  bool ceilings = false;   // measure device copy bandwidth and bf16 and fp8 matmul rates first
  bool pdl = false;        // enable_pdl: programmatic dependent launch between the kernels
  bool layer = false;      // --layer: the plan made before the capture; the graph holds run() alone
  bool allow_cpu = false;  // let a suite run on the cpu backend
  std::string kv_format = "plain";  // plain (the cache in --dtype's type) or fp8_ds_mla
  std::string ds_scales = "amax";   // fp8_ds_mla group scales: amax / 448, or that as ue8m0
  int64_t top_k = 0;                // --sparse-top-k: > 0 selects sparse mode
  int64_t topk_len_mean = 0;        // > 0: per-request sparse_topk_lens with this mean
  bool dtype_given = false;         // --dtype was given (the sparse suite's rows set their own)
  bool kv_format_given = false;     // --kv-format was given (likewise)
  bool ds_scales_given = false;     // --ds-scales was given
};

constexpr uint64_t kInt32Max = 2147483647;
constexpr uint64_t kMaxIters = 1000000;
constexpr uint64_t kMaxPageSize = uint64_t{1} << 30;  // the largest power of two in int32

void usage() {
  std::puts(
      "usage: mla-bench [options]\n"
      "  --batch N        requests in the batch, 0..2147483647 (default: 128 on sm90, 4 on cpu;\n"
      "                   0 is a no-op call: validated, nothing written)\n"
      "  --seq-len N      cached tokens per request, query tokens included, 0..2147483647\n"
      "                   (default: 8192 on sm90, 1024 on cpu)\n"
      "  --heads N        query heads, 1..2147483647 (default 128; sm90: 1..128)\n"
      "  --q-len N        query tokens per request, 0..2147483647 (default 1; 0 is a no-op call;\n"
      "                   sm90: up to 16)\n"
      "  --head-dims L,R  kv_lora_rank and qk_rope_head_dim: 512,64 | 256,64 | 512,0 (default\n"
      "                   512,64, DeepSeek's)\n"
      "  --page-size N    tokens per KV page, a power of two 1..1073741824 (default 64; sm90:\n"
      "                   up to 256)\n"
      "  --dtype T        bf16 | fp16 | fp8 | bf16-fp8 (query bf16, cache fp8) | fp32 (cpu only)\n"
      "  --kv-format F    plain | fp8_ds_mla (default plain: the cache in --dtype's cache type;\n"
      "                   fp8_ds_mla: DeepSeek-V3.2's uint8 [P, page_size, 656] rows, 512 e4m3\n"
      "                   values quantized per 128 with fp32 scales + 64 bf16 rope; --dtype bf16)\n"
      "  --ds-scales S    amax | ue8m0: fp8_ds_mla's group scales, amax / 448 as vLLM writes them\n"
      "                   (default) or that rounded up to a power of two as DeepSeek's and\n"
      "                   FlashMLA's quantizers write them (with --kv-format fp8_ds_mla, or\n"
      "                   --suite sparse for its fp8_ds_mla rows)\n"
      "  --sparse-top-k K sparse top-k mode, 0..2147483647 (default 0: dense): each query token\n"
      "                   gets K flat slots (page * page_size + offset) of distinct tokens drawn\n"
      "                   from its request's own pages, among those it sees causally; -1 pads a\n"
      "                   row whose token sees fewer than K\n"
      "  --topk-len-mean N\n"
      "                   with --sparse-top-k K: per-request sparse_topk_lens drawn uniformly\n"
      "                   from [max(0, 2N - K), min(K, 2N)], mean N, 1..K (default: none, every\n"
      "                   entry counted; e.g. K 2048, N 1024: lens 0..2048)\n"
      "  --backend B      auto | sm90 | cpu (default auto: the best available)\n"
      "  --iters N        timed iterations, 1..1000000 (default: 100 on sm90, 5 on cpu)\n"
      "  --warmup N       untimed iterations first, 0..1000000 (default 1; sm90 runs at least 1)\n"
      "  --seed N         input seed, 0..18446744073709551615 (default 1)\n"
      "  --seq-sd N       varlen: seq lens drawn from a normal distribution with mean --seq-len\n"
      "                   and this standard deviation, at least q_len, 0..2147483647 (default 0:\n"
      "                   fixed)\n"
      "  --suite goals    run the Hopper goal table (10 configurations) and print a summary\n"
      "                   (on the cpu backend only with --allow-cpu)\n"
      "  --suite sweep    run the dense sweep (50 configurations: batch 1..1024, seq_len\n"
      "                   512..262144 fixed and varlen, heads 8..128, q_len 1..4, pages 32 and\n"
      "                   64) in --dtype (default bf16) and print a summary (cpu: --allow-cpu)\n"
      "  --suite sparse   run the sparse table (9 DeepSeek-V3.2 configurations: seq_len 8192,\n"
      "                   top_k 2048, each row's own cache format: bf16, bf16-fp8 or fp8_ds_mla)\n"
      "                   and print a summary (cpu: --allow-cpu; --dtype, --kv-format,\n"
      "                   --sparse-top-k and --topk-len-mean are refused with it)\n"
      "  --list           with --suite: print the suite's configurations and run nothing\n"
      "  --allow-cpu      let a suite run on the cpu backend (GPU-sized shapes: minutes to\n"
      "                   hours)\n"
      "  --ceilings       measure the device copy bandwidth and bf16 and fp8 matmul rates first "
      "(GPU)\n"
      "  --pdl            launch the kernels of a call with programmatic dependent launch\n"
      "  --layer          time one layer's call: plan() runs once before the graph is captured\n"
      "                   (one plan serves every layer of a step) and the graph holds run()\n"
      "                   alone (default: plan() and run(), a step's first layer)\n"
      "  --json           print one JSON object per configuration instead of the table\n"
      "  --json-out FILE  also write one JSON object per configuration to FILE\n"
      "  --times-out FILE also write every timed iteration to FILE (configuration index, us)\n"
      "Shape: D = kv_lora_rank L + rope R (--head-dims); FLOPs = rows x keys x (2 D + 2 L), where "
      "a\n"
      "sparse token's keys are its counted entries other than -1 (each a gathered row: 656\n"
      "bytes in fp8_ds_mla, D x the cache element size otherwise).\n"
      "Progress goes to stderr, one line as each configuration starts and one as it finishes.\n"
      "Exit status: 0 done; 1 the check found a mismatch, or a runtime failure (CUDA, memory);\n"
      "2 a bad flag or value, or flags this machine or backend cannot run (the message says why).");
}

// All of `text` as a decimal integer (digits only: no sign, no spaces) that fits in 64 bits.
bool parse_decimal(const std::string& text, uint64_t& n) {
  n = 0;
  for (const char ch : text) {
    if (ch < '0' || ch > '9') return false;
    const uint64_t d = static_cast<uint64_t>(ch - '0');
    if (n > (UINT64_MAX - d) / 10) return false;
    n = n * 10 + d;
  }
  return !text.empty();
}

// `text` as an integer in [lo, hi]; otherwise a UsageError naming the flag, what it takes and the
// text.
uint64_t parse_uint(const std::string& flag, const std::string& text, uint64_t lo, uint64_t hi) {
  uint64_t n = 0;
  if (!parse_decimal(text, n) || n < lo || n > hi) {
    throw UsageError(flag + ": expected an integer from " + std::to_string(lo) + " to " +
                     std::to_string(hi) + ", got '" + text + "'");
  }
  return n;
}

std::string one_of(const std::string& flag, const std::string& text,
                   const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), text) != allowed.end()) return text;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
  }
  throw UsageError(flag + ": expected " + list + ", got '" + text + "'");
}

// Refuses (UsageError) flags that cannot go together, whatever their order on the command line.
void check_combinations(const Config& c) {
  if (c.suite == "sparse") {
    const char* flag = c.dtype_given                               ? "--dtype"
                       : c.kv_format_given                         ? "--kv-format"
                       : c.top_k > 0                               ? "--sparse-top-k"
                       : c.topk_len_mean > 0                       ? "--topk-len-mean"
                       : c.kv_lora_rank != 512 || c.rope_dim != 64 ? "--head-dims"
                                                                   : nullptr;
    if (flag != nullptr) {
      throw UsageError(std::string("--suite sparse: each row sets its own dtype, cache format, "
                                   "top_k and topk lens (fp8_ds_mla rows: head dims 512,64); "
                                   "drop ") +
                       flag);
    }
  }
  if (c.topk_len_mean > 0 && c.top_k == 0) {
    throw UsageError("--topk-len-mean " + std::to_string(c.topk_len_mean) +
                     ": needs sparse mode (--sparse-top-k K, K > 0)");
  }
  if (c.topk_len_mean > c.top_k) {
    throw UsageError("--topk-len-mean: expected a mean from 1 to --sparse-top-k " +
                     std::to_string(c.top_k) + ", got '" + std::to_string(c.topk_len_mean) + "'");
  }
  if (c.kv_format == "fp8_ds_mla" && c.dtype != "bf16") {
    throw UsageError(
        "--kv-format fp8_ds_mla: needs --dtype bf16 (the query's type; the cache holds its own "
        "e4m3 values, fp32 scales and bf16 rope), got --dtype " +
        c.dtype);
  }
  if (c.ds_scales_given && c.kv_format != "fp8_ds_mla" && c.suite != "sparse") {
    throw UsageError("--ds-scales " + c.ds_scales +
                     ": needs --kv-format fp8_ds_mla (or --suite sparse, whose fp8_ds_mla rows "
                     "take it)");
  }
  if (c.kv_format == "fp8_ds_mla" && (c.kv_lora_rank != 512 || c.rope_dim != 64)) {
    throw UsageError("--kv-format fp8_ds_mla: needs --head-dims 512,64 (its rows hold 512 + 64)");
  }
}

// Fills `c` from the command line; false for --help (printed). Throws UsageError.
bool parse_args(int argc, char** argv, Config& c) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + ": needs a value (see --help)");
      return argv[++i];
    };
    auto count = [&](uint64_t lo, uint64_t hi) { return parse_uint(a, value(), lo, hi); };
    auto file = [&]() {
      const std::string v = value();
      if (v.empty() || v.rfind("--", 0) == 0) {
        throw UsageError(a + ": expected a file name, got '" + v + "'");
      }
      return v;
    };
    if (a == "--batch") {
      c.batch = static_cast<int64_t>(count(0, kInt32Max));
    } else if (a == "--seq-len") {
      c.seq_len = static_cast<int64_t>(count(0, kInt32Max));
    } else if (a == "--heads") {
      c.heads = static_cast<int64_t>(count(1, kInt32Max));
    } else if (a == "--q-len") {
      c.q_len = static_cast<int64_t>(count(0, kInt32Max));
    } else if (a == "--head-dims") {
      const std::string v = one_of(a, value(), {"512,64", "256,64", "512,0"});
      c.kv_lora_rank = v == "256,64" ? 256 : 512;
      c.rope_dim = v == "512,0" ? 0 : 64;
    } else if (a == "--page-size") {
      const std::string v = value();
      uint64_t n = 0;
      if (!parse_decimal(v, n) || n < 1 || n > kMaxPageSize || (n & (n - 1)) != 0) {
        throw UsageError(a + ": expected a power of two from 1 to " + std::to_string(kMaxPageSize) +
                         ", got '" + v + "'");
      }
      c.page_size = static_cast<int64_t>(n);
    } else if (a == "--dtype") {
      c.dtype = one_of(a, value(), {"bf16", "fp16", "fp8", "bf16-fp8", "fp32"});
      c.dtype_given = true;
    } else if (a == "--kv-format") {
      c.kv_format = one_of(a, value(), {"plain", "fp8_ds_mla"});
      c.kv_format_given = true;
    } else if (a == "--ds-scales") {
      c.ds_scales = one_of(a, value(), {"amax", "ue8m0"});
      c.ds_scales_given = true;
    } else if (a == "--sparse-top-k") {
      c.top_k = static_cast<int64_t>(count(0, kInt32Max));
    } else if (a == "--topk-len-mean") {
      c.topk_len_mean = static_cast<int64_t>(count(1, kInt32Max));
    } else if (a == "--backend") {
      c.backend = one_of(a, value(), {"auto", "sm90", "cpu"});
    } else if (a == "--iters") {
      c.iters = static_cast<int>(count(1, kMaxIters));
    } else if (a == "--warmup") {
      c.warmup = static_cast<int>(count(0, kMaxIters));
    } else if (a == "--seed") {
      c.seed = count(0, UINT64_MAX);
    } else if (a == "--json") {
      c.json = true;
    } else if (a == "--seq-sd") {
      c.seq_sd = static_cast<int64_t>(count(0, kInt32Max));
    } else if (a == "--suite") {
      c.suite = one_of(a, value(), {"goals", "sweep", "sparse"});
    } else if (a == "--list") {
      c.list = true;
    } else if (a == "--allow-cpu") {
      c.allow_cpu = true;
    } else if (a == "--json-out") {
      c.json_out = file();
    } else if (a == "--times-out") {
      c.times_out = file();
    } else if (a == "--ceilings") {
      c.ceilings = true;
    } else if (a == "--pdl") {
      c.pdl = true;
    } else if (a == "--layer") {
      c.layer = true;
    } else if (a == "--help" || a == "-h") {
      usage();
      return false;
    } else if (a.rfind("-", 0) == 0) {
      throw UsageError("unknown option '" + a + "' (see --help)");
    } else {
      throw UsageError("unexpected argument '" + a + "' (options start with --; see --help)");
    }
  }
  check_combinations(c);
  return true;
}

// The fp8_ds_mla cache format (docs/contract.md section 1.4): per token, 512 e4m3 latent values,
// 4 fp32 scales (one per 128 values), 64 bf16 rope values.
constexpr int64_t kDsMlaRowBytes = 656;
constexpr int64_t kDsMlaLatent = 512;
constexpr int64_t kDsMlaGroup = 128;
constexpr int64_t kDsMlaRope = 64;

// Host buffers of one decode step, plus the DecodeParams that view them.
struct Step {
  mla::DataType q_dtype, kv_dtype, out_dtype;  // kv_dtype: uint8 for fp8_ds_mla
  bool ds_mla = false;                         // the cache is fp8_ds_mla
  int64_t kv_row_bytes = 0;                    // bytes of one cached token
  std::vector<uint8_t> query, kv, out, workspace;
  std::vector<float> lse;
  // block_tables [B, max_pages]: the pages each request owns; passed to the library in dense
  // mode only (sparse mode addresses the pool through sparse_indices).
  std::vector<int32_t> block_tables, seq_lens;
  std::vector<int32_t> sparse_indices;  // [B, q_len, top_k] flat slots, -1 for none; sparse mode
  std::vector<int32_t> topk_lens;       // [B]; with --topk-len-mean
  int64_t num_pages = 0, max_pages = 0;
  mla::DecodeParams params;
};

size_t dtype_bytes(mla::DataType t) { return t.bits / 8; }

// The query, cache and output dtypes of --dtype and --kv-format (already accepted names).
void resolve_dtypes(const Config& c, Step& s) {
  const std::string& name = c.dtype;
  if (name == "bf16") {
    s.q_dtype = s.kv_dtype = mla::dtype::kBFloat16;
  } else if (name == "fp16") {
    s.q_dtype = s.kv_dtype = mla::dtype::kFloat16;
  } else if (name == "fp8") {
    s.q_dtype = s.kv_dtype = mla::dtype::kFloat8E4M3;
  } else if (name == "fp32") {
    s.q_dtype = s.kv_dtype = mla::dtype::kFloat32;
  } else if (name == "bf16-fp8") {
    s.q_dtype = mla::dtype::kBFloat16;
    s.kv_dtype = mla::dtype::kFloat8E4M3;
  } else {
    throw UsageError("--dtype: expected bf16, fp16, fp8, bf16-fp8 or fp32, got '" + name + "'");
  }
  s.out_dtype = s.q_dtype == mla::dtype::kFloat16 ? mla::dtype::kFloat16 : mla::dtype::kBFloat16;
  s.ds_mla = c.kv_format == "fp8_ds_mla";
  if (s.ds_mla) s.kv_dtype = mla::dtype::kUInt8;
  s.kv_row_bytes =
      s.ds_mla ? kDsMlaRowBytes
               : (c.kv_lora_rank + c.rope_dim) * static_cast<int64_t>(dtype_bytes(s.kv_dtype));
}

// Memory this process may still take: MemAvailable, else the physical memory, else unbounded.
double available_host_bytes() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), f) != nullptr) {
      found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    }
    std::fclose(f);
    if (found) return 1024.0 * static_cast<double>(kib);
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : HUGE_VAL;
}

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1u << 30));
  return buf;
}

// Bytes of one step's buffers (query, cache, output, lse, block tables, seq lens, sparse indices
// and lens), in doubles so that no flag combination overflows. `cache_pages`: pages of the cache;
// `max_pages`: per request.
double step_bytes(const Config& c, const Step& s, double cache_pages, double max_pages) {
  const double D = c.kv_lora_rank + c.rope_dim;
  const double tokens = static_cast<double>(c.batch) * static_cast<double>(c.q_len);
  const double rows = tokens * static_cast<double>(c.heads);
  return rows * (D * dtype_bytes(s.q_dtype) + c.kv_lora_rank * dtype_bytes(s.out_dtype) + 4.0) +
         cache_pages * static_cast<double>(c.page_size) * static_cast<double>(s.kv_row_bytes) +
         static_cast<double>(c.batch) * (max_pages + 2.0) * 4.0 +
         tokens * static_cast<double>(c.top_k) * 4.0;
}

// ", cache fp8_ds_mla, sparse top_k 2048 (topk lens mean 1024)": what a configuration adds to
// its dtype; empty for a dense plain one.
std::string mode_text(const Config& c) {
  std::string t = c.kv_format == "plain" ? "" : ", cache " + c.kv_format;
  if (c.kv_format == "fp8_ds_mla" && c.ds_scales != "amax") t += " (" + c.ds_scales + " scales)";
  if (c.top_k > 0) t += ", sparse top_k " + std::to_string(c.top_k);
  if (c.topk_len_mean > 0) t += " (topk lens mean " + std::to_string(c.topk_len_mean) + ")";
  return t;
}

// Refuses (UsageError) a step whose host buffers do not fit in the memory available here.
void check_host_memory(const Config& c, const Step& s, double cache_pages, double max_pages) {
  const double need = step_bytes(c, s, cache_pages, max_pages);
  const double have = available_host_bytes();
  if (need > have) {
    throw UsageError(
        "batch " + std::to_string(c.batch) + ", seq_len " + std::to_string(c.seq_len) +
        (c.seq_sd > 0 ? " (varlen)" : "") + ", heads " + std::to_string(c.heads) + ", q_len " +
        std::to_string(c.q_len) + ", page " + std::to_string(c.page_size) + ", dtype " + c.dtype +
        mode_text(c) + ": the inputs and outputs need " + gib(need) + " of host memory, " +
        gib(have) +
        " is available here; lower --batch, --seq-len, --heads, --q-len or --sparse-top-k");
  }
}

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

// Runs work(state, i) for every i in [0, n) on every hardware thread (at most n threads), each
// taking the next index as it finishes one; `state` is the thread's own make_state() (scratch
// kept across its indices).
template <typename MakeState, typename Work>
void for_each_on_all_threads(int64_t n, const MakeState& make_state, const Work& work) {
  std::atomic<int64_t> next{0};
  auto run = [&] {
    auto state = make_state();
    for (int64_t i = next++; i < n; i = next++) work(state, i);
  };
  const int64_t workers = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
}

// The same without per-thread state: work(i).
template <typename Work>
void for_each_on_all_threads(int64_t n, const Work& work) {
  for_each_on_all_threads(
      n, [] { return 0; }, [&](int, int64_t i) { work(i); });
}

// Fills `n` elements of `t` with values of roughly unit scale, in blocks of 2^20 elements on every
// hardware thread, each block from its own seed, so the values depend on `seed` alone (a cache of
// a GiB fills in a fraction of a second instead of seconds).
void fill_random(std::vector<uint8_t>& buf, mla::DataType t, size_t n, uint64_t seed) {
  using namespace mla::detail::cpu;
  constexpr size_t kBlock = size_t{1} << 20;
  buf.resize(n * dtype_bytes(t));
  for_each_on_all_threads(static_cast<int64_t>((n + kBlock - 1) / kBlock), [&](int64_t blk) {
    FastRng rng(seed ^ (0x3C6EF372ull + static_cast<uint64_t>(blk) * 0x100000001B3ull));
    const size_t end = std::min(n, (static_cast<size_t>(blk) + 1) * kBlock);
    for (size_t i = static_cast<size_t>(blk) * kBlock; i < end; ++i) {
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
  });
}

// `x` (|x| <= 448) as float8 e4m3fn, rounded to the nearest value (ties to even).
uint8_t to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  // Subnormals are multiples of 2^-9; 8 of them is the smallest normal, code 0x08.
  if (a < 0x1.0p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  uint32_t bits = mla::detail::cpu::float_bits(a);
  bits += 0x7FFFFu + ((bits >> 20) & 1u);  // round the 23-bit mantissa to 3 bits
  const uint32_t code = (((bits >> 23) - 127 + 7) << 3) | ((bits >> 20) & 7u);
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7E));  // 0x7E: 448
}

// Fills `rows` fp8_ds_mla rows of `buf` from values of roughly unit scale, quantized as
// DeepSeek-V3.2 does: each group of 128 latent values gets the fp32 scale amax / 448 (`ue8m0`:
// that rounded up to a power of two, as DeepSeek's and FlashMLA's quantizers round it) and stores
// value / scale in e4m3; the 64 rope values are stored in bf16. Blocks of rows are filled on every
// hardware thread, each from its own seed, so the cache depends on --seed alone.
void fill_ds_mla(std::vector<uint8_t>& buf, int64_t rows, uint64_t seed, bool ue8m0) {
  constexpr int64_t kBlock = 4096;  // rows per seed
  buf.assign(static_cast<size_t>(rows * kDsMlaRowBytes), 0);
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  for_each_on_all_threads(blocks, [&](int64_t blk) {
    float x[kDsMlaLatent];
    FastRng rng(seed ^ (0xD5A1ull + static_cast<uint64_t>(blk) * 0x100000001B3ull));
    for (int64_t r = blk * kBlock; r < std::min(rows, (blk + 1) * kBlock); ++r) {
      uint8_t* row = buf.data() + r * kDsMlaRowBytes;
      for (float& v : x) v = rng.uniform();
      for (int64_t g = 0; g < kDsMlaLatent / kDsMlaGroup; ++g) {
        float amax = 0.0f;
        for (int64_t k = g * kDsMlaGroup; k < (g + 1) * kDsMlaGroup; ++k) {
          amax = std::max(amax, std::fabs(x[k]));
        }
        float scale = std::max(amax, 1e-4f) / 448.0f;
        if (ue8m0) scale = std::exp2(std::ceil(std::log2(scale)));
        std::memcpy(row + kDsMlaLatent + 4 * g, &scale, 4);
        for (int64_t k = g * kDsMlaGroup; k < (g + 1) * kDsMlaGroup; ++k) {
          row[k] = to_e4m3(std::clamp(x[k] / scale, -448.0f, 448.0f));
        }
      }
      for (int64_t k = 0; k < kDsMlaRope; ++k) {
        const uint16_t h = mla::detail::cpu::float_to_bf16(rng.uniform());
        std::memcpy(row + kDsMlaLatent + 16 + 2 * k, &h, 2);
      }
    }
  });
}

// Keys attended by query token i of a request with `seq_len` tokens and `n` query tokens (causal).
int64_t attended_keys(int64_t seq_len, int64_t n, int64_t i) {
  return std::max<int64_t>(0, std::min(seq_len, seq_len - n + i + 1));
}

// Sparse mode: every query token's top_k entries, flat slots (page * page_size + offset,
// docs/contract.md section 2.2) of distinct tokens drawn uniformly from the tokens the query token
// sees causally (positions 0 .. seq_len - q_len + i) in its request's own pages, in the order
// drawn; -1 past them where it sees fewer than top_k. With --topk-len-mean N, per-request lens
// drawn uniformly from [max(0, 2N - K), min(K, 2N)].
void draw_sparse(const Config& c, Step& s, int64_t max_len) {
  FastRng rng(c.seed ^ 0x5BA25E5ull);
  const int64_t K = c.top_k;
  if (c.topk_len_mean > 0) {
    const int64_t hi = std::min(K, 2 * c.topk_len_mean), lo = 2 * c.topk_len_mean - hi;
    s.topk_lens.resize(static_cast<size_t>(c.batch));
    for (int32_t& len : s.topk_lens) {
      len = static_cast<int32_t>(lo + static_cast<int64_t>(rng.next() % (hi - lo + 1)));
    }
  }
  s.sparse_indices.assign(static_cast<size_t>(c.batch * c.q_len * K), -1);
  // A partial Fisher-Yates shuffle per row, its swaps undone afterwards: O(top_k) per row.
  std::vector<int32_t> positions(static_cast<size_t>(max_len));
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<int64_t> swaps;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int32_t* pages = s.block_tables.data() + b * s.max_pages;
    for (int64_t i = 0; i < c.q_len; ++i) {
      const int64_t visible = attended_keys(s.seq_lens[static_cast<size_t>(b)], c.q_len, i);
      const int64_t n = std::min(K, visible);
      int32_t* row = s.sparse_indices.data() + (b * c.q_len + i) * K;
      swaps.resize(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) {
        const int64_t j = k + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(visible - k));
        std::swap(positions[k], positions[j]);
        swaps[k] = j;
        const int64_t t = positions[k];
        row[k] = static_cast<int32_t>(pages[t / c.page_size] * c.page_size + t % c.page_size);
      }
      for (int64_t k = n - 1; k >= 0; --k) std::swap(positions[k], positions[swaps[k]]);
    }
  }
}

void build_step(const Config& c, Step& s) {
  resolve_dtypes(c, s);
  const int64_t D = c.kv_lora_rank + c.rope_dim;
  // Before anything is allocated: the expected size (a varlen draw is checked again below).
  const double pages_per_request =
      std::ceil(static_cast<double>(c.seq_len) / static_cast<double>(c.page_size));
  check_host_memory(c, s, std::max(1.0, static_cast<double>(c.batch) * pages_per_request),
                    pages_per_request);

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
  if (c.seq_sd > 0) {
    check_host_memory(c, s, static_cast<double>(s.num_pages), static_cast<double>(s.max_pages));
  }
  fill_random(s.query, s.q_dtype, static_cast<size_t>(c.batch * c.q_len * c.heads * D), c.seed);
  if (s.ds_mla) {
    fill_ds_mla(s.kv, s.num_pages * c.page_size, c.seed, c.ds_scales == "ue8m0");
  } else {
    fill_random(s.kv, s.kv_dtype, static_cast<size_t>(s.num_pages * c.page_size * D),
                c.seed ^ 0x9B05688Cull);
  }
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
  p.kv_cache = mla::TensorView::contiguous(
      s.kv.data(), s.kv_dtype, {s.num_pages, c.page_size, s.ds_mla ? kDsMlaRowBytes : D});
  if (c.top_k > 0) {
    draw_sparse(c, s, max_len);
    p.sparse_top_k = static_cast<int32_t>(c.top_k);
    p.sparse_indices = mla::TensorView::contiguous(s.sparse_indices.data(), mla::dtype::kInt32,
                                                   {c.batch, c.q_len, c.top_k});
    if (!s.topk_lens.empty()) {
      p.sparse_topk_lens =
          mla::TensorView::contiguous(s.topk_lens.data(), mla::dtype::kInt32, {c.batch});
    }
  } else {
    p.block_tables = mla::TensorView::contiguous(s.block_tables.data(), mla::dtype::kInt32,
                                                 {c.batch, s.max_pages});
  }
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

// The first n elements at `data`, of type `t` (a query or cache dtype of --dtype), as floats.
void decode_values(const uint8_t* data, mla::DataType t, int64_t n, float* dst) {
  using namespace mla::detail::cpu;
  if (t == mla::dtype::kFloat8E4M3) {
    const std::array<float, 256>& table = fp8_e4m3_table();
    for (int64_t e = 0; e < n; ++e) dst[e] = table[data[e]];
  } else if (t == mla::dtype::kFloat32) {
    std::memcpy(dst, data, static_cast<size_t>(n) * 4);
  } else {
    const bool bf = t == mla::dtype::kBFloat16;
    for (int64_t e = 0; e < n; ++e) {
      uint16_t h;
      std::memcpy(&h, data + 2 * e, 2);
      dst[e] = bf ? bf16_to_float(h) : fp16_to_float(h);
    }
  }
}

// The first n values (n <= 576) of the cached token at flat slot `slot` (page * page_size +
// offset), as floats: decoded from the cache's dtype, or from an fp8_ds_mla row (latent value k
// is e4m3[k] times scale[k / 128], then the bf16 rope).
void decode_kv_row(const Step& s, int64_t slot, int64_t n, float* dst) {
  const uint8_t* row = s.kv.data() + static_cast<size_t>(slot * s.kv_row_bytes);
  if (!s.ds_mla) return decode_values(row, s.kv_dtype, n, dst);
  const std::array<float, 256>& table = mla::detail::cpu::fp8_e4m3_table();
  for (int64_t k = 0; k < std::min(n, kDsMlaLatent); ++k) {
    float scale;
    std::memcpy(&scale, row + kDsMlaLatent + 4 * (k / kDsMlaGroup), 4);
    dst[k] = table[row[k]] * scale;
  }
  if (n > kDsMlaLatent) {
    decode_values(row + kDsMlaLatent + 16, mla::dtype::kBFloat16, n - kDsMlaLatent,
                  dst + kDsMlaLatent);
  }
}

// The keys that query token i of request b attends, as flat slots (a key listed twice appears
// twice): dense, its causal positions through the request's pages; sparse, its counted entries
// (min(top_k, topk_len, seq_len - q_len + i + 1), docs/contract.md section 2.2) other than -1.
void attended_slots(const Config& c, const Step& s, int64_t b, int64_t i,
                    std::vector<int64_t>& slots) {
  slots.clear();
  const int64_t len = s.seq_lens[static_cast<size_t>(b)];
  const int64_t visible = attended_keys(len, c.q_len, i);
  if (c.top_k > 0) {
    int64_t counted = std::min(c.top_k, visible);
    if (!s.topk_lens.empty()) {
      counted = std::min<int64_t>(counted, s.topk_lens[static_cast<size_t>(b)]);
    }
    const int32_t* row = s.sparse_indices.data() + (b * c.q_len + i) * c.top_k;
    for (int64_t k = 0; k < counted; ++k) {
      if (row[k] != -1) slots.push_back(row[k]);
    }
    return;
  }
  const int32_t* pages = s.block_tables.data() + b * s.max_pages;
  for (int64_t j = 0; j < visible; ++j) {
    slots.push_back(pages[j / c.page_size] * c.page_size + j % c.page_size);
  }
}

// What the fp8 check's allowance of one (token, head) row is made of, in float64: abs_sum[l] =
// sum_j p_j |v_jl| / Z over the row's attended keys j (p_j = exp(s_j - max s), Z = sum_j p_j, v_j
// the first L values of key j), and score_err, the probable fp32 error of one score:
// 4 sqrt(D) 2^-24 x max_j bmm1_scale sum_d |q_d k_jd| (Higham and Mary's sqrt(n) estimate of a
// length-D fp32 dot product, with a factor 4 of margin). For an e4m3 query (the FP8 tensor
// cores) also score_err8 = 6 2^-13 x the same maximum, a score summed in their narrower format
// (check_sample), and tail[l] = sum_j min(p_j, 2^-18) |v_jl| / Z, what e4m3 P's subnormal range can
// move out_l by.
struct RowMagnitudes {
  std::vector<double> abs_sum;  // [L]
  std::vector<double> tail;     // [L]
  double score_err = 0.0;
  double score_err8 = 0.0;
};

// The magnitudes of request b's q_len x heads rows, on every hardware thread.
std::vector<RowMagnitudes> row_magnitudes(const Config& c, const Step& s, int64_t b) {
  const int64_t D = c.kv_lora_rank + c.rope_dim, L = c.kv_lora_rank;
  const int64_t rows = c.q_len * c.heads;
  const double scale = s.params.bmm1_scale;
  std::vector<RowMagnitudes> out(static_cast<size_t>(rows));
  struct Scratch {
    std::vector<float> q, k;
    std::vector<double> scores;
    std::vector<int64_t> slots;
  };
  auto make_scratch = [&] {
    Scratch sc;
    sc.q.resize(static_cast<size_t>(D));
    sc.k.resize(static_cast<size_t>(D));
    return sc;
  };
  for_each_on_all_threads(rows, make_scratch, [&](Scratch& sc, int64_t r) {
    std::vector<float>& q = sc.q;
    std::vector<float>& k = sc.k;
    std::vector<double>& scores = sc.scores;
    std::vector<int64_t>& slots = sc.slots;
    const int64_t i = r / c.heads;  // query token; head r % c.heads
    decode_values(s.query.data() +
                      static_cast<size_t>((b * c.q_len * c.heads + r) * D) * dtype_bytes(s.q_dtype),
                  s.q_dtype, D, q.data());
    attended_slots(c, s, b, i, slots);
    const int64_t n = static_cast<int64_t>(slots.size());
    scores.assign(static_cast<size_t>(n), 0.0);
    double max_score = -HUGE_VAL, max_magnitude = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      decode_kv_row(s, slots[j], D, k.data());
      double dot = 0.0, magnitude = 0.0;
      for (int64_t d = 0; d < D; ++d) {
        const double term = static_cast<double>(q[d]) * k[d];
        dot += term;
        magnitude += std::fabs(term);
      }
      scores[j] = scale * dot;
      max_score = std::max(max_score, scores[j]);
      max_magnitude = std::max(max_magnitude, scale * magnitude);
    }
    RowMagnitudes& m = out[static_cast<size_t>(r)];
    m.abs_sum.assign(static_cast<size_t>(L), 0.0);
    m.tail.assign(static_cast<size_t>(L), 0.0);
    m.score_err = 4.0 * std::sqrt(static_cast<double>(D)) * 0x1.0p-24 * max_magnitude;
    m.score_err8 = 6.0 * 0x1.0p-13 * max_magnitude;
    double z = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double p = std::exp(scores[j] - max_score);
      const double p_tail = std::min(p, 0x1.0p-18);
      z += p;
      decode_kv_row(s, slots[j], L, k.data());
      for (int64_t l = 0; l < L; ++l) {
        m.abs_sum[l] += p * std::fabs(k[l]);
        m.tail[l] += p_tail * std::fabs(k[l]);
      }
    }
    if (z > 0.0) {
      for (double& a : m.abs_sum) a /= z;
      for (double& a : m.tail) a /= z;
    }
  });
  return out;
}

// Re-runs a few requests alone on the cpu backend and compares their rows: bitwise on the cpu
// backend (a request's result must not depend on the rest of the batch), within a tolerance on
// the GPU (check_sample).
struct CheckResult {
  int requests = 0;
  double max_abs_diff = 0.0;
  double worst = 0.0;  // the largest |diff| / allowed over the checked values (GPU runs)
  bool ok = true;
};

// With `bitwise` false (a GPU run against the cpu backend: another summation order):
// - 16-bit caches: a value passes within 2^-7 relative + 1e-3 absolute.
// - fp8 caches (per-tensor and fp8_ds_mla): a per-tensor fp8 cache holds values up to 7.5
//   (fill_random), whose softmax-weighted terms p_j v_jl cancel in many outputs, and there a
//   per-value relative tolerance is no bound on the GPU's rounding. The bound is scaled by the row
//   instead, by A_l = sum_j p_j |v_jl| / Z (row_magnitudes), the sum of the magnitudes of the terms
//   of out_l; |out_l| <= A_l. With u the largest relative error of rounding to a 16-bit type (2^-8
//   for bf16, 2^-11 for fp16):
//     - P: a kernel that enters PV with p_j rounded to 16 bits (the TMA kernels, docs/sm90-tma.md,
//       "Precision") moves each weight p_j / Z by at most u_P relatively in numerator and sum:
//       2 u_P A_l. u_P = 2^-8 (bf16 P, the looser); the SIMT kernel (fp32 P) needs none of it.
//     - the partials: each split's o_s is rounded to the out type and merged in fp32 with weights
//       w_s (sum_s w_s = Z), so out moves by u_out sum_s w_s |o_s| / Z <= u_out A_l.
//     - the final rounding of out to the out type, on the GPU and on the cpu: 2 u_out |out_l|
//       <= 2 u_out A_l.
//     - fp32 arithmetic on both sides: a score error e_j moves out_l by sum_j p_j e_j
//       |v_jl - out_l| / Z <= e (A_l + |out_l|) <= 2 e A_l per side, e the score error of
//       row_magnitudes; exponentials, rescaling and the sums over up to 2^18 keys err by well
//       under 2^-12 of A_l per side (sqrt(n) estimate, n keys or blocks).
//   allowed_l = (2 u_P + 3 u_out + 2^-11 + 4 e) A_l + 2^-22, the last term for fp16's subnormal
//   spacing. For bf16 out: about 0.02 A_l. A lost split, key or row is off by a weight times |v|
//   (values up to 7.5), far above it wherever the missing weight is more than a few percent.
//   An fp8_ds_mla cache's decoded values (e4m3 x its group's scale) are bounded like a 16-bit
//   cache's, but the bound above holds for any cache, and it is the one used for both fp8 kinds.
// - an e4m3 query over an e4m3 cache: the FP8 tensor cores (docs/sm90-fp8.md) round P to e4m3
//   (half an ulp: 2^-4 relative, so 2 u_P = 2^-3; below its normal range p_j moves by at most
//   min(p_j, 2^-18), twice tail_l in numerator and sum) and sum each score (six k steps a partial,
//   three partials) and each block's P V partial (two k steps) in a narrower format than fp32.
//   The tests bound each k step by 2^-11 of the magnitude it aligns to (tests/common/fp8_mma.h, a
//   worst case); on this data (values up to 7.5, sum_d |q_d k_jd| in the thousands) that bound
//   exceeds the outputs themselves and a check built on it could not fail. The check takes the
//   about 14 bits that DeepSeek-V3's report measured Hopper's FP8 sums to keep: 2^-13 a step, so
//   a score within E = score_err8 and a P V partial within 2^-12 relative: allowed_l = (2^-3 +
//   3 u_out + 2^-11 + 2^-12 + (e^(2E) - 1) + 4 e) A_l + 2 tail_l + 2^-22, about 0.4 A_l here,
//   which an out of zeros (|out_l| near A_l where one key dominates) or a lost dominant key
//   exceeds. The kernels that keep P in 16 or 32 bits on this pair (page sizes below 16, the
//   direct split's short runs) are within it too.
// Sparse calls re-run the request with its own rows of sparse_indices and sparse_topk_lens against
// the whole pool, and the sums run over its counted entries (attended_slots).
// A no-op step (no query tokens) has nothing to check; NaN never passes.
CheckResult check_sample(const Config& c, const Step& s, bool bitwise) {
  using mla::detail::cpu::bf16_to_float;
  using mla::detail::cpu::fp16_to_float;
  CheckResult r;
  if (c.batch == 0 || c.q_len == 0) return r;
  const int64_t D = c.kv_lora_rank + c.rope_dim;
  const size_t q_row_bytes = static_cast<size_t>(c.q_len * c.heads * D) * dtype_bytes(s.q_dtype);
  const size_t out_elems = static_cast<size_t>(c.q_len * c.heads * c.kv_lora_rank);
  const bool fp8_cache = s.kv_dtype == mla::dtype::kFloat8E4M3 || s.ds_mla;
  const bool fp8_mma = fp8_cache && s.q_dtype == mla::dtype::kFloat8E4M3;
  const bool bf = s.out_dtype == mla::dtype::kBFloat16;
  const double u_out = bf ? 0x1.0p-8 : 0x1.0p-11, u_p = 0x1.0p-8;
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
    if (c.top_k > 0) {
      p.sparse_indices = mla::TensorView::contiguous(
          const_cast<int32_t*>(s.sparse_indices.data()) + b * c.q_len * c.top_k, mla::dtype::kInt32,
          {1, c.q_len, c.top_k});
      if (!s.topk_lens.empty()) {
        p.sparse_topk_lens = mla::TensorView::contiguous(
            const_cast<int32_t*>(s.topk_lens.data()) + b, mla::dtype::kInt32, {1});
      }
    } else {
      p.block_tables =
          mla::TensorView::contiguous(const_cast<int32_t*>(s.block_tables.data()) + b * s.max_pages,
                                      mla::dtype::kInt32, {1, s.max_pages});
    }
    p.seq_lens = mla::TensorView::contiguous(const_cast<int32_t*>(s.seq_lens.data()) + b,
                                             mla::dtype::kInt32, {1});
    p.out =
        mla::TensorView::contiguous(out.data(), s.out_dtype, {1, c.q_len, c.heads, c.kv_lora_rank});
    p.lse = mla::TensorView();
    ws.resize(mla::workspace_size(p));
    p.workspace = mla::TensorView::contiguous(ws.data(), mla::dtype::kUInt8,
                                              {static_cast<int64_t>(ws.size())});
    mla::decode(p);
    std::vector<RowMagnitudes> rows;
    if (!bitwise && fp8_cache) rows = row_magnitudes(c, s, b);
    const uint8_t* got = s.out.data() + b * out.size();
    for (size_t e = 0; e < out_elems; ++e) {
      uint16_t x, y;
      std::memcpy(&x, got + 2 * e, 2);
      std::memcpy(&y, out.data() + 2 * e, 2);
      const double fx = bf ? bf16_to_float(x) : fp16_to_float(x);
      const double fy = bf ? bf16_to_float(y) : fp16_to_float(y);
      const double diff = std::fabs(fx - fy);
      if (std::isnan(diff) || diff > r.max_abs_diff) r.max_abs_diff = diff;
      if (bitwise) {
        if (x != y) r.ok = false;
        continue;
      }
      double allowed = std::fabs(fy) / 128 + 1e-3;
      if (fp8_cache) {
        const RowMagnitudes& m = rows[e / static_cast<size_t>(c.kv_lora_rank)];
        const size_t l = e % static_cast<size_t>(c.kv_lora_rank);
        const double a = m.abs_sum[l];
        allowed = (2 * u_p + 3 * u_out + 0x1.0p-11 + 4 * m.score_err) * a + 0x1.0p-22;
        if (fp8_mma) {
          allowed = (0x1.0p-3 + 3 * u_out + 0x1.0p-11 + 0x1.0p-12 + std::expm1(2 * m.score_err8) +
                     4 * m.score_err) *
                        a +
                    2 * m.tail[l] + 0x1.0p-22;
        }
      }
      if (!(diff <= allowed)) r.ok = false;
      r.worst = std::isnan(diff) ? HUGE_VAL : std::max(r.worst, diff / allowed);
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

// Replays `exec` on `stream` `warmup` times untimed, then `iters` times each timed with events
// (microseconds), the L2 flushed (`flush_bytes` written at `flush`) before every replay.
std::vector<double> timed_replays(cudaGraphExec_t exec, cudaStream_t stream, void* flush,
                                  size_t flush_bytes, int warmup, int iters) {
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "event");
  cuda_ok(cudaEventCreate(&stop), "event");
  std::vector<double> times_us;
  for (int i = -warmup; i < iters; ++i) {
    cuda_ok(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream), "flush");
    cuda_ok(cudaEventRecord(start, stream), "record");
    cuda_ok(cudaGraphLaunch(exec, stream), "replay");
    cuda_ok(cudaEventRecord(stop, stream), "record");
    cuda_ok(cudaEventSynchronize(stop), "replay");
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (i >= 0) times_us.push_back(1000.0 * ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times_us;
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
  // Refuse (exit 2) a step that cannot fit, rather than fail in the middle of the copies.
  const size_t flush_bytes = size_t{256} << 20;
  const double need =
      static_cast<double>(s.query.size() + s.kv.size() + s.out.size() +
                          4 * (s.block_tables.size() + s.seq_lens.size() + s.lse.size() +
                               s.sparse_indices.size() + s.topk_lens.size()) +
                          flush_bytes);
  size_t free_bytes = 0, total_bytes = 0;
  cuda_ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (need > static_cast<double>(free_bytes)) {
    throw UsageError("batch " + std::to_string(c.batch) + ", seq_len " + std::to_string(c.seq_len) +
                     ", heads " + std::to_string(c.heads) + ", q_len " + std::to_string(c.q_len) +
                     mode_text(c) + ": the step needs " + gib(need) +
                     " of GPU memory (inputs, outputs and the 256 MB L2 flush buffer), " +
                     gib(static_cast<double>(free_bytes)) +
                     " is free on this GPU; lower --batch, --seq-len, --heads or --q-len");
  }
  move(p.query, s.query.data(), s.query.size());
  move(p.kv_cache, s.kv.data(), s.kv.size());
  if (c.top_k > 0) {
    move(p.sparse_indices, s.sparse_indices.data(), s.sparse_indices.size() * 4);
    if (p.sparse_topk_lens.defined()) {
      move(p.sparse_topk_lens, s.topk_lens.data(), s.topk_lens.size() * 4);
    }
  } else {
    move(p.block_tables, s.block_tables.data(), s.block_tables.size() * 4);
  }
  move(p.seq_lens, s.seq_lens.data(), s.seq_lens.size() * 4);
  move(p.out, nullptr, s.out.size());
  move(p.lse, nullptr, s.lse.size() * 4);
  p.backend = mla::Backend::kSm90;
  p.enable_pdl = c.pdl;
  p.workspace = mla::TensorView();
  const size_t ws_bytes = mla::workspace_size(p);
  p.workspace = mla::TensorView::contiguous(to_device(nullptr, ws_bytes, owned), mla::dtype::kUInt8,
                                            {static_cast<int64_t>(ws_bytes)}, dev);
  void* flush = to_device(nullptr, flush_bytes, owned);

  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  p.stream = stream;
  for (int i = 0; i < std::max(1, c.warmup); ++i) mla::decode(p);
  cuda_ok(cudaStreamSynchronize(stream), "warm-up");

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // --layer: the plan is made once, outside the graph, as an engine reuses one plan across the
  // layers of a step; each replay is then one layer's run().
  std::optional<mla::Plan> layer_plan;
  if (c.layer) {
    layer_plan = mla::plan(p);
    cuda_ok(cudaStreamSynchronize(stream), "plan");
  }
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  mla::run(layer_plan ? *layer_plan : mla::plan(p), p);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const std::vector<double> times_us = timed_replays(exec, stream, flush, flush_bytes, 0, c.iters);
  cuda_ok(cudaMemcpy(s.out.data(), p.out.data, s.out.size(), cudaMemcpyDeviceToHost), "download");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  for (void* d : owned) cudaFree(d);
  return times_us;
}

// The median time of a plain read of `bytes` (bench/read_floor.cu) in time_on_gpu's harness: the
// read captured in a CUDA graph, the L2 flushed (256 MB written) before each of `iters` replays.
// A kernel that moves those bytes once takes at least that long; 0 where the buffer does not fit.
double time_read_on_gpu(double bytes, int iters) {
  const size_t read_bytes = static_cast<size_t>(bytes) / 16 * 16;
  if (read_bytes == 0) return 0.0;
  const size_t flush_bytes = size_t{256} << 20;
  void* data = nullptr;
  void* flush = nullptr;
  void* sink = nullptr;
  if (cudaMalloc(&data, read_bytes) != cudaSuccess ||
      cudaMalloc(&flush, flush_bytes) != cudaSuccess ||
      cudaMalloc(&sink, sizeof(uint32_t)) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(data);
    cudaFree(flush);
    return 0.0;
  }
  int sms = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  cuda_ok(cudaMemset(data, 1, read_bytes), "memset");
  cudaStream_t stream;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  cuda_ok(mla_bench_enqueue_read(data, read_bytes, static_cast<uint32_t*>(sink), sms, stream),
          "read");
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const std::vector<double> times_us = timed_replays(exec, stream, flush, flush_bytes, 1, iters);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(data);
  cudaFree(flush);
  cudaFree(sink);
  return median(times_us);
}

// Physical ceilings measured on this device: a 4 GiB device-to-device copy (bytes read + written),
// an 8192^3 bf16 matmul through cuBLAS and the same matmul on the FP8 tensor cores through
// cuBLASLt (e4m3 x e4m3 -> bf16), each the median of 10 after a warm-up.
struct Ceilings {
  bool measured = false;
  double copy_tbps = 0, matmul_tflops = 0;
  double fp8_matmul_tflops = 0;  // 0: cuBLASLt offered no FP8 algorithm (or failed)
};

// The median time (ms) of an n^3 e4m3 x e4m3 -> bf16 matmul through cuBLASLt, fp32 accumulation
// (FP8 GEMMs take A transposed: "TN"), timed by `time_ms`; 0 where any cuBLASLt call fails.
template <typename TimeMs>
double fp8_matmul_ms(int n, std::vector<void*>& owned, TimeMs time_ms) {
  const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(n);
  const size_t ws_bytes = size_t{32} << 20;
  void* x = to_device(nullptr, bytes, owned);
  void* y = to_device(nullptr, bytes, owned);
  void* z = to_device(nullptr, 2 * bytes, owned);
  void* ws = to_device(nullptr, ws_bytes, owned);
  cuda_ok(cudaMemset(x, 0x38, bytes), "memset");  // e4m3 1.0
  cuda_ok(cudaMemset(y, 0x30, bytes), "memset");  // e4m3 0.5
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const float alpha = 1.0f, beta = 0.0f;
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  bool ok =
      cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &ws_bytes, sizeof(ws_bytes)) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heuristic, &found) ==
          CUBLAS_STATUS_SUCCESS &&
      found > 0;
  auto run = [&] {
    return cublasLtMatmul(lt, op, &alpha, x, la, y, lb, &beta, z, ld, z, ld, &heuristic.algo, ws,
                          ws_bytes, nullptr) == CUBLAS_STATUS_SUCCESS;
  };
  ok = ok && run() && cudaDeviceSynchronize() == cudaSuccess;
  const double ms = ok ? time_ms([&] { run(); }) : 0.0;
  cudaGetLastError();
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (ld != nullptr) cublasLtMatrixLayoutDestroy(ld);
  if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
  if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
  if (op != nullptr) cublasLtMatmulDescDestroy(op);
  if (lt != nullptr) cublasLtDestroy(lt);
  return ms;
}

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
  const double fp8_ms = fp8_matmul_ms(n, owned, time_ms);
  c.fp8_matmul_tflops =
      fp8_ms > 0 ? 2.0 * n * static_cast<double>(n) * n / (fp8_ms * 1e-3) / 1e12 : 0.0;
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
  double fp8_matmul_tflops = 0;
};
Ceilings measure_ceilings() { return {}; }
#endif

struct Result {
  Config config;  // with the defaults resolved
  const char* backend = "cpu";
  std::string note;
  bool no_op = false;  // no query tokens (batch or q_len 0): arguments validated, nothing written
  int64_t mean_seq_len = 0, max_seq_len = 0;
  double mean_counted = 0;  // sparse: keys per query token (counted entries other than -1)
  double median_us = 0, min_us = 0, p90_us = 0, tflops = 0, tbps = 0;
  // GPU: a plain read of the bytes counted in tbps, timed the same way (time_read_on_gpu); 0 on
  // the cpu backend, for a no-op, or where its buffer did not fit.
  double read_floor_us = 0;
  std::vector<double> times_us;  // every timed iteration, in order
  CheckResult check;
};

// Whether `c` runs on the sm90 backend. Refuses (UsageError) --backend sm90 where it cannot run,
// and --dtype fp32 on the GPU.
bool runs_on_gpu(const Config& c) {
#ifdef MLA_BENCH_WITH_CUDA
  const bool gpu = c.backend != "cpu" && hopper_present();
  const char* why = "no compute capability 9.0 GPU is visible here";
#else
  const bool gpu = false;
  const char* why = "this mla-bench was built without CUDA (MLA_ENABLE_CUDA=OFF)";
#endif
  if (c.backend == "sm90" && !gpu) {
    throw UsageError(std::string("--backend sm90: ") + why + "; use --backend auto or cpu");
  }
  if (gpu && c.dtype == "fp32") {
    throw UsageError(
        "--dtype fp32: the sm90 backend takes bf16, fp16, fp8 or bf16-fp8; fp32 runs on the cpu "
        "backend (--backend cpu)");
  }
  return gpu;
}

// "sm90: batch 128, q_len 1, seq_len 8192, heads 128, page 64, bf16, 100 iterations", with the
// cache format and top_k of a sparse or fp8_ds_mla configuration after the dtype
std::string describe(const Config& c, const char* backend) {
  return std::string(backend) + ": batch " + std::to_string(c.batch) + ", q_len " +
         std::to_string(c.q_len) + ", seq_len " + std::to_string(c.seq_len) +
         (c.seq_sd > 0 ? " (varlen, sd " + std::to_string(c.seq_sd) + ")" : "") + ", heads " +
         std::to_string(c.heads) + ", page " + std::to_string(c.page_size) + ", " + c.dtype +
         mode_text(c) + ", " + std::to_string(c.iters) + " iterations";
}

// Runs one configuration; `tag` ("[3/10] " in a suite) prefixes its progress lines on stderr.
Result measure(Config c, bool gpu, const std::string& tag) {
  Result r;
  const bool on_cpu = !gpu;
  if (on_cpu) {
    if (c.backend != "cpu") {
      r.note = std::string("no Hopper GPU here: running on the cpu reference backend") +
               (c.batch < 0 || c.seq_len < 0 ? " at a small size" : "");
    }
    if (c.batch < 0) c.batch = 4;
    if (c.seq_len < 0) c.seq_len = 1024;
    if (c.iters < 0) c.iters = 5;
  } else {
    if (c.batch < 0) c.batch = 128;
    if (c.seq_len < 0) c.seq_len = 8192;
    if (c.iters < 0) c.iters = 100;
  }
  r.backend = on_cpu ? "cpu" : "sm90";
  r.no_op = c.batch == 0 || c.q_len == 0;
  if (r.no_op) {
    r.note += std::string(r.note.empty() ? "" : "; ") +
              "a no-op call: " + (c.batch == 0 ? "batch 0" : "q_len 0") +
              " has no query tokens, so the library validates its arguments and writes nothing";
  }
  std::fprintf(stderr, "mla-bench: %s%s: started\n", tag.c_str(), describe(c, r.backend).c_str());
  const auto started = std::chrono::steady_clock::now();

  Step s;
  Config host = c;
  host.backend = "cpu";  // host buffers first; the GPU path copies them to the device
  build_step(host, s);
  std::vector<double> times_us;
  if (on_cpu) {
    for (int i = 0; i < c.warmup; ++i) mla::decode(s.params);
    for (int i = 0; i < c.iters; ++i) {
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
  // once, the query once, the output written once. A sparse token's keys are its counted entries
  // other than -1 (not the top_k padding), and each is a row gathered for that token (so tokens
  // of one request that name one slot read it once each); the indices themselves are not counted.
  // A no-op reads and writes nothing.
  const int64_t D = c.kv_lora_rank + c.rope_dim;
  double pairs = 0, kv_rows = 0, cached = 0;
  std::vector<int64_t> slots;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int32_t len = s.seq_lens[static_cast<size_t>(b)];
    for (int64_t i = 0; i < c.q_len; ++i) {
      if (c.top_k > 0) {
        attended_slots(c, s, b, i, slots);
        pairs += static_cast<double>(slots.size());
        kv_rows += static_cast<double>(slots.size());
      } else {
        pairs += attended_keys(len, c.q_len, i);
      }
    }
    if (c.top_k == 0) kv_rows += len;
    cached += len;
    r.max_seq_len = std::max<int64_t>(r.max_seq_len, len);
  }
  r.mean_seq_len = c.batch > 0 ? static_cast<int64_t>(cached / c.batch) : 0;
  if (c.top_k > 0 && c.batch * c.q_len > 0) {
    r.mean_counted = pairs / static_cast<double>(c.batch * c.q_len);
  }
  const double flops = pairs * c.heads * (2.0 * D + 2.0 * c.kv_lora_rank);
  const double bytes =
      r.no_op ? 0.0
              : kv_rows * static_cast<double>(s.kv_row_bytes) +
                    static_cast<double>(c.batch * c.q_len * c.heads) *
                        (D * dtype_bytes(s.q_dtype) + c.kv_lora_rank * dtype_bytes(s.out_dtype));
  r.median_us = median(times_us);
  r.min_us = *std::min_element(times_us.begin(), times_us.end());
  r.p90_us = percentile(times_us, 0.9);
  r.tflops = flops / (r.median_us * 1e-6) / 1e12;
  r.tbps = bytes / (r.median_us * 1e-6) / 1e12;
#ifdef MLA_BENCH_WITH_CUDA
  if (!on_cpu && !r.no_op) r.read_floor_us = time_read_on_gpu(bytes, c.iters);
#endif
  r.config = c;
  r.times_us = std::move(times_us);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::fprintf(stderr, "mla-bench: %sfinished in %.1f s: median %.1f us, check %s\n", tag.c_str(),
               took, r.median_us,
               r.check.requests == 0 ? "none (no-op)"
               : r.check.ok          ? "ok"
                                     : "MISMATCH");
  return r;
}

std::string to_json(const Result& r) {
  const Config& c = r.config;
  char buf[2048];
  std::snprintf(
      buf, sizeof(buf),
      "{\"backend\": \"%s\", \"batch\": %lld, \"seq_len\": %lld, \"seq_sd\": %lld, "
      "\"mean_seq_len\": %lld, \"max_seq_len\": %lld, \"heads\": %lld, \"q_len\": %lld, "
      "\"page_size\": %lld, \"kv_lora_rank\": %d, \"qk_rope_head_dim\": %d, \"dtype\": \"%s\", "
      "\"kv_format\": \"%s\", \"sparse_top_k\": %lld, \"topk_len_mean\": %lld, "
      "\"mean_counted_entries\": %.3f, \"iters\": %d, \"pdl\": %s, \"layer\": %s, "
      "\"no_op\": %s, \"median_us\": %.3f, "
      "\"min_us\": %.3f, \"p90_us\": %.3f, "
      "\"tflops\": %.6f, \"tbps\": %.6f, \"read_floor_us\": %.3f, "
      "\"check\": {\"requests\": %d, \"max_abs_diff\": %g, \"max_diff_over_allowed\": %g, "
      "\"passed\": %s}, \"note\": \"%s\"}",
      r.backend, static_cast<long long>(c.batch), static_cast<long long>(c.seq_len),
      static_cast<long long>(c.seq_sd), static_cast<long long>(r.mean_seq_len),
      static_cast<long long>(r.max_seq_len), static_cast<long long>(c.heads),
      static_cast<long long>(c.q_len), static_cast<long long>(c.page_size), c.kv_lora_rank,
      c.rope_dim, c.dtype.c_str(), c.kv_format.c_str(), static_cast<long long>(c.top_k),
      static_cast<long long>(c.topk_len_mean), r.mean_counted, c.iters, c.pdl ? "true" : "false",
      c.layer ? "true" : "false", r.no_op ? "true" : "false", r.median_us, r.min_us, r.p90_us,
      r.tflops, r.tbps, r.read_floor_us, r.check.requests, r.check.max_abs_diff, r.check.worst,
      r.check.ok ? "true" : "false", r.note.c_str());
  return buf;
}

void print_text(const Result& r) {
  const Config& c = r.config;
  const bool on_cpu = std::string(r.backend) == "cpu";
  if (!r.note.empty()) std::printf("note: %s\n", r.note.c_str());
  std::printf(
      "config: backend %s, batch %lld, seq_len %lld%s, heads %lld, q_len %lld, page %lld, "
      "L %d, R %d, dtype %s%s\n",
      r.backend, static_cast<long long>(c.batch), static_cast<long long>(c.seq_len),
      c.seq_sd > 0 ? (" (varlen, sd " + std::to_string(c.seq_sd) + ", drawn mean " +
                      std::to_string(r.mean_seq_len) + ")")
                         .c_str()
                   : "",
      static_cast<long long>(c.heads), static_cast<long long>(c.q_len),
      static_cast<long long>(c.page_size), c.kv_lora_rank, c.rope_dim, c.dtype.c_str(),
      mode_text(c).c_str());
  if (c.top_k > 0 && !r.no_op) {
    std::printf("sparse: %.1f counted entries per query token on average (top_k %lld)\n",
                r.mean_counted, static_cast<long long>(c.top_k));
  }
  if (r.no_op) {
    std::printf("check:  none (a no-op call writes nothing)\n");
  } else {
    std::printf(
        "check:  %d sampled requests re-run alone on cpu: %s (max abs diff %g%s)\n",
        r.check.requests, r.check.ok ? (on_cpu ? "bitwise equal" : "within tolerance") : "MISMATCH",
        r.check.max_abs_diff,
        on_cpu ? ""
               : (", at most " + std::to_string(r.check.worst) + " of the allowed difference")
                     .c_str());
  }
  std::printf(
      "time:   median %.1f us, min %.1f us, 90th percentile %.1f us over %d iterations (%s)\n",
      r.median_us, r.min_us, r.p90_us, c.iters,
      on_cpu ? "wall clock" : "CUDA events around graph replays, L2 flushed");
  std::printf("rate:   %.4f TFLOP/s, %.4f TB/s\n", r.tflops, r.tbps);
  if (r.read_floor_us > 0) {
    std::printf(
        "read:   a plain read of the same bytes takes %.1f us in the same harness (%.0f%% of this "
        "call's median)\n",
        r.read_floor_us, 100.0 * r.read_floor_us / r.median_us);
  }
}

// One row of a suite: a dense shape; the rest (dtype, backend, seed, ...) comes from the flags.
struct SuiteRow {
  int64_t batch, q_len, seq_len;
  bool varlen;               // seq lens drawn with --seq-sd's rule, sd half the mean seq_len
  int64_t heads, page_size;  // page_size 0: --page-size's (the goal table)
};

// The rows as configurations. With `fewer_iters`, on the GPU without --iters, a row of at least
// 2^28 (query row, key) pairs (about 0.5 ms and more on an H100) runs 50 iterations instead of
// 100, which keeps a long suite's replays short.
std::vector<Config> suite_configs(const Config& base, const std::vector<SuiteRow>& rows, bool gpu,
                                  bool fewer_iters) {
  std::vector<Config> out;
  for (const SuiteRow& row : rows) {
    Config c = base;
    c.batch = row.batch;
    c.q_len = row.q_len;
    c.seq_len = row.seq_len;
    c.seq_sd = row.varlen ? row.seq_len / 2 : 0;
    c.heads = row.heads;
    if (row.page_size > 0) c.page_size = row.page_size;
    const double pairs =
        static_cast<double>(row.batch * row.q_len * row.heads) * static_cast<double>(row.seq_len);
    if (fewer_iters && gpu && base.iters < 0 && pairs >= 0x1.0p28) c.iters = 50;
    out.push_back(c);
  }
  return out;
}

// The Hopper goal table: DeepSeek-V3 shapes (page 64 and bf16 by default: --page-size, --dtype).
std::vector<SuiteRow> goal_rows() {
  return {{128, 1, 8192, false, 128, 0}, {128, 2, 8192, false, 128, 0},
          {128, 4, 8192, false, 128, 0}, {64, 2, 8192, true, 128, 0},
          {8, 1, 32768, false, 128, 0},  {128, 1, 8192, false, 64, 0},
          {128, 1, 8192, false, 16, 0},  {1, 1, 8192, false, 128, 0},
          {1, 1, 65536, false, 128, 0},  {1, 1, 8192, false, 16, 0}};
}

// The dense sweep (issue 35): batch 1..1024, seq_len 512..262144 fixed and varlen, heads 8..128,
// q_len 1..4, pages 32 and 64, in --dtype. It holds the goal table and the other shapes the
// FlashMLA comparison names (B128 H32, B32 4096, B16 varlen 16384 H16, B256 2048, B64 q2 varlen
// H16, B2 131072). The largest cache, B128 x 32768 (4.5 GiB in bf16), keeps the host's input
// fill to seconds.
std::vector<SuiteRow> sweep_rows() {
  std::vector<SuiteRow> rows = goal_rows();
  for (SuiteRow& row : rows) row.page_size = 64;
  const std::vector<SuiteRow> more = {
      // the rest of the FlashMLA comparison
      {128, 1, 8192, false, 32, 64},
      {32, 1, 4096, false, 128, 64},
      {16, 1, 16384, true, 16, 64},
      {256, 1, 2048, false, 128, 64},
      {64, 2, 8192, true, 16, 64},
      {2, 1, 131072, false, 128, 64},
      // one request: latency floor to the longest context
      {1, 1, 512, false, 128, 64},
      {1, 1, 2048, false, 8, 32},
      {1, 2, 32768, false, 128, 64},
      {1, 4, 16384, false, 64, 32},
      {1, 3, 131072, false, 32, 64},
      {1, 1, 262144, false, 128, 64},
      {1, 1, 262144, false, 16, 32},
      // a few requests, long contexts
      {4, 1, 65536, false, 128, 64},
      {4, 1, 65536, true, 32, 32},
      {8, 3, 16384, false, 64, 64},
      {8, 1, 32768, false, 8, 32},
      {16, 1, 16384, false, 128, 32},
      {16, 2, 65536, false, 64, 64},
      {32, 2, 32768, true, 128, 64},
      {32, 1, 8192, false, 8, 64},
      // mid batches
      {64, 1, 16384, false, 128, 64},
      {64, 4, 4096, false, 32, 32},
      {64, 3, 8192, false, 16, 64},
      {128, 1, 8192, false, 8, 64},
      {128, 1, 8192, false, 128, 32},
      {128, 1, 8192, true, 128, 64},
      {128, 3, 4096, false, 64, 64},
      {128, 1, 512, false, 128, 64},
      {128, 1, 32768, false, 128, 64},
      // large batches, short contexts
      {256, 1, 4096, true, 16, 64},
      {256, 2, 2048, false, 64, 32},
      {512, 1, 1024, false, 128, 64},
      {512, 1, 4096, true, 128, 64},
      {512, 1, 2048, false, 8, 64},
      {1024, 1, 512, false, 128, 64},
      {1024, 1, 1024, false, 16, 32},
      {1024, 2, 2048, true, 128, 64},
      {1024, 4, 512, false, 32, 64},
      {1024, 1, 512, false, 8, 32},
  };
  rows.insert(rows.end(), more.begin(), more.end());
  return rows;
}

// One row of the sparse table: a DeepSeek-V3.2 shape and its cache.
struct SparseRow {
  int64_t batch, q_len, heads;
  const char* dtype;      // --dtype's names: bf16 (bf16 cache) or bf16-fp8 (per-tensor fp8 cache)
  const char* kv_format;  // plain or fp8_ds_mla (with a bf16 query)
  int64_t topk_len_mean;  // 0: no sparse_topk_lens, every entry counted
};

// The sparse table (issue 33): every row has seq_len 8192 per request, so each token's 2048 indices
// are drawn from four times as many tokens, and --page-size's pages. The query is bf16 in every
// row, so the three cache formats compare alone at B64 H16.
constexpr int64_t kSparseSeqLen = 8192;
constexpr int64_t kSparseTopK = 2048;

std::vector<SparseRow> sparse_rows() {
  return {
      {128, 1, 128, "bf16", "fp8_ds_mla", 0},     // DeepSeek-V3.2 decode
      {128, 2, 128, "bf16", "fp8_ds_mla", 0},     // one MTP draft token
      {128, 1, 64, "bf16", "fp8_ds_mla", 0},      // heads split over two GPUs
      {64, 1, 16, "bf16", "plain", 0},            // heads split over eight GPUs, each cache format
      {64, 1, 16, "bf16-fp8", "plain", 0},        //
      {64, 1, 16, "bf16", "fp8_ds_mla", 0},       //
      {128, 1, 128, "bf16-fp8", "plain", 0},      // the per-tensor caches at full heads
      {128, 1, 128, "bf16", "plain", 0},          //
      {128, 1, 128, "bf16", "fp8_ds_mla", 1024},  // varied lens: mean 1024 of 2048
  };
}

std::vector<Config> sparse_configs(const Config& base) {
  std::vector<Config> out;
  for (const SparseRow& row : sparse_rows()) {
    Config c = base;
    c.batch = row.batch;
    c.q_len = row.q_len;
    c.seq_len = kSparseSeqLen;
    c.seq_sd = 0;
    c.heads = row.heads;
    c.dtype = row.dtype;
    c.kv_format = row.kv_format;
    c.top_k = kSparseTopK;
    c.topk_len_mean = row.topk_len_mean;
    out.push_back(c);
  }
  return out;
}

std::vector<Config> suite_of(const Config& c, bool gpu) {
  if (c.suite == "goals") return suite_configs(c, goal_rows(), gpu, false);
  if (c.suite == "sweep") return suite_configs(c, sweep_rows(), gpu, true);
  if (c.suite == "sparse") return sparse_configs(c);
  return {c};
}

// The header of a suite's tables: its dtype, cache format and sparsity, or, for the sparse table,
// what its rows share (each row names its own dtype and cache).
std::string suite_header(const Config& c) {
  if (c.suite == "sparse") {
    return "seq_len " + std::to_string(kSparseSeqLen) + ", sparse top_k " +
           std::to_string(kSparseTopK) + ", bf16 query, page " + std::to_string(c.page_size) +
           ", cache per row";
  }
  return "dtype " + c.dtype + mode_text(c);
}

// "fp8_ds_mla", "bf16", "fp8 (per-tensor)": a configuration's cache format.
std::string cache_name(const Config& c) {
  if (c.kv_format != "plain") return c.kv_format;
  if (c.dtype == "bf16-fp8" || c.dtype == "fp8") return "fp8 (per-tensor)";
  return c.dtype;
}

// --list: the suite's configurations, one table row each, and nothing run. Iterations are those
// of the sm90 backend (--backend cpu: the cpu backend's) unless --iters is given.
void print_suite(const Config& c) {
  const bool gpu = c.backend != "cpu";
  const std::vector<Config> configs = suite_of(c, gpu);
  // The sparse table's rows differ in dtype, cache and lens, so they get columns of their own.
  const bool sparse = c.suite == "sparse";
  std::printf("suite %s: %zu configurations, %s\n", c.suite.c_str(), configs.size(),
              suite_header(c).c_str());
  std::printf("| # | batch | q_len | seq_len | heads | page |%s cache GiB | iterations |\n",
              sparse ? " query | cache | top_k | topk lens |" : "");
  std::printf("| --- | --- | --- | --- | --- | --- |%s --- | --- |\n",
              sparse ? " --- | --- | --- | --- |" : "");
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& k = configs[i];
    Step s;
    resolve_dtypes(k, s);
    const std::string varlen = k.seq_sd > 0 ? " varlen (sd " + std::to_string(k.seq_sd) + ")" : "";
    const std::string lens =
        k.topk_len_mean > 0 ? "mean " + std::to_string(k.topk_len_mean) : "all counted";
    const std::string extra = !sparse ? ""
                                      : " " + (k.dtype == "bf16-fp8" ? "bf16" : k.dtype) + " | " +
                                            cache_name(k) + " | " + std::to_string(k.top_k) +
                                            " | " + lens + " |";
    const double cache = static_cast<double>(k.batch) * static_cast<double>(k.seq_len) *
                         static_cast<double>(s.kv_row_bytes);
    std::printf("| %zu | %lld | %lld | %lld%s | %lld | %lld |%s %.2f | %d |\n", i + 1,
                static_cast<long long>(k.batch), static_cast<long long>(k.q_len),
                static_cast<long long>(k.seq_len), varlen.c_str(), static_cast<long long>(k.heads),
                static_cast<long long>(k.page_size), extra.c_str(), cache / (1u << 30),
                k.iters > 0 ? k.iters
                : gpu       ? 100
                            : 5);
  }
}

FILE* open_for_writing(const std::string& flag, const std::string& path) {
  if (path.empty()) return nullptr;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    throw UsageError(flag + ": cannot open '" + path + "' for writing: " + std::strerror(errno));
  }
  return f;
}

int run(const Config& c) {
  if (c.list) {
    if (c.suite.empty()) {
      throw UsageError("--list: needs --suite goals, --suite sweep or --suite sparse");
    }
    print_suite(c);
    return 0;
  }
  // Everything that can be refused is refused before any file is written or any work starts.
  const bool gpu = runs_on_gpu(c);
  const std::vector<Config> configs = suite_of(c, gpu);
  if (!c.suite.empty() && !gpu && !c.allow_cpu) {
    int64_t batch = 0, seq_len = 0, heads = 0;
    for (const Config& k : configs) {
      batch = std::max(batch, k.batch);
      seq_len = std::max(seq_len, k.seq_len);
      heads = std::max(heads, k.heads);
    }
    throw UsageError("--suite " + c.suite + ": the table would run on the cpu backend (" +
                     (c.backend == "cpu" ? "--backend cpu" : "no Hopper GPU here") +
                     "), and its shapes are GPU-sized (up to batch " + std::to_string(batch) +
                     ", seq_len " + std::to_string(seq_len) + ", " + std::to_string(heads) +
                     " heads), which take minutes to hours there; pass --allow-cpu to run it on "
                     "the cpu anyway");
  }
  FILE* json_file = open_for_writing("--json-out", c.json_out);
  FILE* times_file = open_for_writing("--times-out", c.times_out);
  Ceilings ceilings;
  if (gpu && (c.ceilings || !c.suite.empty())) {
    std::fprintf(stderr,
                 "mla-bench: measuring the device copy bandwidth and bf16 and fp8 matmul rates\n");
    ceilings = measure_ceilings();
  } else if (c.ceilings) {
    std::fprintf(stderr, "mla-bench: --ceilings: not on a Hopper GPU, nothing measured\n");
  }
  std::vector<Result> results;
  bool ok = true;
  for (const Config& config : configs) {
    const std::string tag = configs.size() == 1 ? ""
                                                : "[" + std::to_string(results.size() + 1) + "/" +
                                                      std::to_string(configs.size()) + "] ";
    results.push_back(measure(config, gpu, tag));
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
        "(8192^3, cuBLAS), fp8 matmul %s\n",
        ceilings.copy_tbps, ceilings.matmul_tflops,
        ceilings.fp8_matmul_tflops > 0
            ? (std::to_string(static_cast<int>(ceilings.fp8_matmul_tflops + 0.5)) +
               " TFLOP/s (8192^3 e4m3 -> bf16, cuBLASLt)")
                  .c_str()
            : "not measured (cuBLASLt offered no FP8 algorithm)");
  }
  if (!c.suite.empty() && !c.json) {
    if (!results.empty() && !results.front().note.empty()) {
      std::printf("note: %s\n", results.front().note.c_str());
    }
    // The goal table's pages are all 64; the sweep's differ, so it has a page column.
    // The sparse table's rows share their pages and differ in cache and lens instead.
    const bool sparse = c.suite == "sparse";
    const bool pages = c.suite == "sweep";
    std::printf("suite %s, %s\n", c.suite.c_str(), suite_header(c).c_str());
    std::printf("| batch | q_len | seq_len | heads |%s median us | TFLOP/s | TB/s | check |\n",
                pages    ? " page |"
                : sparse ? " cache | keys per token |"
                         : "");
    std::printf("| --- | --- | --- | --- |%s --- | --- | --- | --- |\n", pages    ? " --- |"
                                                                         : sparse ? " --- | --- |"
                                                                                  : "");
    for (const Result& r : results) {
      const Config& k = r.config;
      // NOTE: a varlen row's drawn lengths have their own mean (the work measured), shown too.
      const std::string varlen =
          k.seq_sd > 0 ? " varlen (drawn mean " + std::to_string(r.mean_seq_len) + ")" : "";
      char keys[64];
      std::snprintf(keys, sizeof(keys), "%.0f", r.mean_counted);
      const std::string page =
          pages ? " " + std::to_string(k.page_size) + " |"
          : sparse
              ? " " + cache_name(k) + " | " + keys +
                    (k.topk_len_mean > 0 ? " (lens mean " + std::to_string(k.topk_len_mean) + ")"
                                         : "") +
                    " |"
              : "";
      std::printf("| %lld | %lld | %lld%s | %lld |%s %.1f | %.1f | %.2f | %s |\n",
                  static_cast<long long>(k.batch), static_cast<long long>(k.q_len),
                  static_cast<long long>(k.seq_len), varlen.c_str(),
                  static_cast<long long>(k.heads), page.c_str(), r.median_us, r.tflops, r.tbps,
                  r.check.ok ? "ok" : "MISMATCH");
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Config c;
    if (!parse_args(argc, argv, c)) return 0;  // --help
    return run(c);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "mla-bench: %s\n", e.what());
    return 2;
  } catch (const mla::Error& e) {
    // The library rejects only what the flags asked for (e.g. --heads 200 on sm90): a usage error,
    // unless the runtime itself failed.
    std::fprintf(stderr, "mla-bench: error (%s): %s\n", mla::error_code_name(e.code()), e.what());
    return e.code() == mla::ErrorCode::kRuntimeError ? 1 : 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "mla-bench: error: out of host memory (lower --batch, --seq-len, --heads or "
                 "--q-len)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mla-bench: error: %s\n", e.what());
    return 1;
  }
}
