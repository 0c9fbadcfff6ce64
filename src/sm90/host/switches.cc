// Reads the MLA_SM90_* environment switches (switches.h).
#include "sm90/host/switches.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace mla::detail::sm90 {
namespace {

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return std::string(v != nullptr ? v : "");
}

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : 0;
}

Switches read_switches() {
  Switches s;
  const std::string kernel = env_string("MLA_SM90_KERNEL");
  if (kernel == "simt" || kernel == "v0") s.kernel = Switches::Kernel::kSimt;
  if (kernel == "seesaw" || kernel == "v2") s.kernel = Switches::Kernel::kSeesaw;
  s.max_splits = env_int("MLA_SM90_MAX_SPLITS");
  const int64_t fixed = env_int("MLA_SM90_SCHEDULE_FIXED");
  if (fixed > 0) s.schedule_fixed_blocks = std::min<int64_t>(fixed, 1 << 20);
  if (std::getenv("MLA_SM90_UNIFORM_SLACK") != nullptr) {
    s.schedule_uniform_slack = std::clamp<int64_t>(env_int("MLA_SM90_UNIFORM_SLACK"), 0, 1000000);
  }
  s.direct_split = env_string("MLA_SM90_DIRECT") != "0";
  s.few_rows_schedule = env_string("MLA_SM90_FEW_ROWS_SCHEDULE") != "0";
  s.fp8_direct = env_string("MLA_SM90_FP8_DIRECT") != "0";
  s.query_tma = env_string("MLA_SM90_QUERY_TMA") != "0";
  s.hold_first_s = env_string("MLA_SM90_HOLD_FIRST_S") != "0";
  s.kv_evict_first = env_string("MLA_SM90_KV_EVICT_FIRST") != "0";
  s.consumer_fence = env_string("MLA_SM90_CONSUMER_FENCE") != "0";
  s.ds_direct = env_string("MLA_SM90_DS_DIRECT") != "0";
  s.fp8_seesaw_min_blocks = std::max<int64_t>(0, env_int("MLA_SM90_FP8_SEESAW_MIN_BLOCKS"));
  s.fp8_three = env_string("MLA_SM90_FP8_THREE") != "0";
  s.combine_one_batch = env_string("MLA_SM90_COMBINE_ONE_BATCH") != "0";
  s.sparse_pair_merge = env_string("MLA_SM90_SPARSE_PAIR_MERGE") != "0";
  if (std::getenv("MLA_SM90_SPARSE_ROWS") != nullptr) {
    s.sparse_rows = std::max<int64_t>(0, env_int("MLA_SM90_SPARSE_ROWS"));
  }
  if (std::getenv("MLA_SM90_COMBINE_ROWS") != nullptr) {
    s.combine_rows_max_splits = std::clamp<int64_t>(env_int("MLA_SM90_COMBINE_ROWS"), 0, 256);
  }
  const std::string deep = env_string("MLA_SM90_FEW_ROWS_DEEP");
  s.few_rows_deep = deep == "0" ? 0 : deep == "1" ? 1 : -1;
  const std::string three = env_string("MLA_SM90_FEW_ROWS_THREE");
  s.few_rows_three = three == "0" ? 0 : three == "1" ? 1 : -1;
  const char* pair = std::getenv("MLA_SM90_PAIR");
  if (pair != nullptr) {
    s.pair = std::string(pair) == "0" ? 0 : std::string(pair) == "1" ? 1 : -1;
  }
  return s;
}

}  // namespace

const Switches& switches() {
  static const Switches s = read_switches();
  return s;
}

}  // namespace mla::detail::sm90
