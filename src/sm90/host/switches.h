// The MLA_SM90_* environment switches of the sm90 backend, all read here, once per process (at
// the first call that routes). They exist for comparisons and timing studies: whatever they say,
// results stay correct. README.md lists them.
#pragma once

#include <cstdint>

#include "sm90/decode/combine/traits.h"
#include "sm90/decode/schedule/format.h"

namespace mla::detail::sm90 {

struct Switches {
  // MLA_SM90_KERNEL: `simt` (or `v0`) runs every call on the SIMT kernel; `seesaw` (or `v2`) runs
  // the seesaw kernel on every call the TMA kernels take, the few-rows calls too; anything else
  // (unset, `rows`) is the default routing.
  enum class Kernel { kDefault, kSimt, kSeesaw };
  Kernel kernel = Kernel::kDefault;
  // MLA_SM90_MAX_SPLITS=N (N > 0): at most N splits per query token. It enters workspace_size
  // too, so it must be set before the first call.
  int64_t max_splits = 0;  // 0: no cap
  // MLA_SM90_SCHEDULE_FIXED=N (N > 0, at most 2^20): the balanced schedule's fixed cost per
  // request, in blocks.
  int64_t schedule_fixed_blocks = ::mla::sm90::schedule::kFixedBlocks;
  // MLA_SM90_UNIFORM_SLACK=N (N >= 0, at most 10^6): how much longer (percent) the balanced
  // schedule's uniform split of equal requests may run than the even share before the even share
  // is taken instead (a large N: the uniform split wherever it applies).
  int64_t schedule_uniform_slack = ::mla::sm90::schedule::kUniformSlackPercent;
  // MLA_SM90_DIRECT=0: a call of one request runs on the balanced schedule, not the direct split.
  bool direct_split = true;
  // MLA_SM90_FEW_ROWS_SCHEDULE=0: a few-rows call of several requests runs on uniform splits, not
  // the balanced schedule.
  bool few_rows_schedule = true;
  // MLA_SM90_FP8_DIRECT=0: an e4m3 cache on the few-rows kernel is widened in shared memory, not
  // read by the GEMMs as it lands (route.h, Route::fp8_direct).
  bool fp8_direct = true;
  // MLA_SM90_QUERY_TMA=0: the seesaw kernel's consumers load each query tile through their
  // registers, not through the query tensor map (tma::make_query_tensor_map).
  bool query_tma = true;
  // MLA_SM90_HOLD_FIRST_S=0: both consumers issue a segment's first S GEMMs at once.
  bool hold_first_s = true;
  // MLA_SM90_KV_EVICT_FIRST=0: the seesaw kernel's balanced-schedule calls that would take the
  // evict-first L2 policy for a 16-bit cache load it without (route.h, Route::evict_first).
  bool kv_evict_first = true;
  // MLA_SM90_CONSUMER_FENCE=0: the few-rows sparse producer that gathers e4m3 rows a block ahead
  // fences each chunk itself before publishing it, instead of its consumers after their wait.
  bool consumer_fence = true;
  // MLA_SM90_DS_DIRECT=0: a sparse call of at most 16 heads over an fp8_ds_mla cache gathers its
  // rows a block ahead and widens them in the producer, instead of landing them as they are for
  // the GEMMs to read (route.h, Route::fp8_direct).
  bool ds_direct = true;
  // MLA_SM90_FP8_SEESAW_MIN_BLOCKS=N (N > 0): the fewest blocks per split at which a call of one
  // request with an e4m3 query over an e4m3 cache takes the FP8 seesaw kernel on the direct split
  // (route.cc, kFp8SeesawMinBlocks).
  int64_t fp8_seesaw_min_blocks = 0;  // 0: the route's own
  // MLA_SM90_FP8_THREE=0: the FP8 seesaw kernel's calls on the balanced schedule run its
  // two-consumer form instead of the three-consumer one (route.h, Route::fp8_three;
  // docs/sm90-fp8.md, Three consumers).
  bool fp8_three = true;
  // MLA_SM90_FEW_ROWS_DEEP: 0 keeps the few-rows kernel's e4m3 GEMMs on two stages, 1 takes four
  // on every such call; anything else (unset) is the route's rule (route.h, Route::few_rows_deep).
  int few_rows_deep = -1;  // -1: the rule
  // MLA_SM90_FEW_ROWS_THREE: 0 runs a few-rows call (dense or sparse) of a bf16 query over a
  // per-tensor e4m3 cache, or a sparse call's fp8_ds_mla rows, at 16 rows on two consumer
  // warpgroups, 1 on three; anything else (unset) is the route's rule (route.h,
  // Route::few_rows_three).
  int few_rows_three = -1;  // -1: the rule
  // MLA_SM90_COMBINE_ROWS=N (N >= 0, at most 256): the combine runs one warp per row (the row
  // kernel) where a call's rows have at most N splits (the typical count) and fill at least half
  // the SMs with its CTAs, else the item kernel (0: the item kernel always; 256: the row kernel
  // always).
  int64_t combine_rows_max_splits = ::mla::sm90::combine::kRowsMaxSplits;
  // MLA_SM90_SPARSE_PAIR_MERGE=0: a sparse few-rows call of two splits a token keeps them apart
  // and merges them in the combine kernel (route.h, Route::pair_merge).
  bool sparse_pair_merge = true;
  // MLA_SM90_COMBINE_ONE_BATCH=0: the row kernel's calls in the uniform layout with at most three
  // splits a row stay on the row kernel instead of its one-pass form (for comparisons).
  bool combine_one_batch = true;
  // MLA_SM90_PAIR: 0 keeps every call unpaired, 1 pairs every balanced-schedule call that allows
  // it; anything else (unset) is the default policy.
  int pair = -1;  // -1: the policy
  // MLA_SM90_SPARSE_ROWS=N (N > 0): a sparse call of one split on the seesaw kernel runs at most N
  // token rows, each CTA walking several tokens; otherwise (unset, or 0) one row per token.
  int64_t sparse_rows = -1;  // -1 (unset) or 0: one row per token
  // The workspace cap (bytes): the contract's 128 MiB; no variable sets it. Tests lift it to show
  // where the cap changes a route (tests/sm90/route_test.cc).
  int64_t workspace_cap = int64_t{128} << 20;
};

// The switches as the environment set them at the first call.
const Switches& switches();

}  // namespace mla::detail::sm90
