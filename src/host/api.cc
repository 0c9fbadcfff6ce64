// Public API: validation, backend dispatch, workspace checks, plan/run.
#include <string>

#include "host/backends.h"
#include "host/check.h"
#include "mla/decode.h"

namespace mla {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "InvalidArgument";
    case ErrorCode::kTypeError:
      return "TypeError";
    case ErrorCode::kDeviceError:
      return "DeviceError";
    case ErrorCode::kUnsupported:
      return "Unsupported";
    case ErrorCode::kBadIndex:
      return "BadIndex";
    case ErrorCode::kWorkspaceTooSmall:
      return "WorkspaceTooSmall";
    case ErrorCode::kRuntimeError:
      return "RuntimeError";
  }
  return "Unknown";
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kSm90:
      return "sm90";
    case Backend::kCpu:
      return "cpu";
  }
  return "unknown";
}

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "sm90") return Backend::kSm90;
  if (name == "cpu") return Backend::kCpu;
  MLA_FAIL(ErrorCode::kInvalidArgument,
           "backend: expected one of auto, sm90, cpu, got '" << name << "'");
}

namespace {

size_t backend_workspace_size(const detail::Problem& problem) {
  switch (problem.backend) {
    case Backend::kCpu:
      return detail::cpu::workspace_size(problem);
    case Backend::kSm90:
      return detail::sm90::workspace_size(problem);
    default:
      // validate() rejects every backend this build does not implement.
      MLA_FAIL(ErrorCode::kUnsupported,
               "backend: " << backend_name(problem.backend) << " is not available in this build");
  }
}

void check_workspace(const DecodeParams& params, size_t required) {
  const TensorView& ws = params.workspace;
  if (!ws.defined()) {
    MLA_CHECK_ARG(
        required == 0, ErrorCode::kWorkspaceTooSmall,
        "workspace: expected a uint8 tensor of at least " << required << " bytes, got none");
    return;
  }
  detail::check_tensor(ws, "workspace", params.query.device);
  MLA_CHECK_ARG(ws.ndim == 1, ErrorCode::kInvalidArgument,
                "workspace: expected rank 1 [bytes], got rank " << ws.ndim);
  MLA_CHECK_ARG(ws.dtype == dtype::kUInt8, ErrorCode::kTypeError,
                "workspace: expected dtype uint8, got " << detail::dtype_str(ws.dtype));
  MLA_CHECK_ARG(ws.shape[0] <= 1 || ws.strides[0] == 1, ErrorCode::kInvalidArgument,
                "workspace: expected a contiguous buffer (stride 1), got stride " << ws.strides[0]);
  MLA_CHECK_ARG(static_cast<size_t>(ws.shape[0]) >= required, ErrorCode::kWorkspaceTooSmall,
                "workspace: expected at least " << required << " bytes (workspace_size), got "
                                                << ws.shape[0]);
}

Plan make_plan(const detail::Problem& problem, const DecodeParams& params, size_t ws_bytes) {
  Plan plan;
  plan.backend = problem.backend;
  plan.device = params.query.device;
  plan.batch = problem.batch;
  plan.num_tokens = problem.num_tokens;
  plan.num_heads = problem.num_heads;
  plan.q_len = problem.q_len;
  plan.workspace_bytes = static_cast<int64_t>(ws_bytes);
  plan.sparse_top_k = static_cast<int32_t>(problem.top_k);
  plan.planned = true;
  return plan;
}

void check_plan_matches(const Plan& plan, const Plan& now) {
  MLA_CHECK_ARG(plan.planned, ErrorCode::kInvalidArgument,
                "plan: expected a plan made by mla::plan(), got an empty Plan");
  auto same = [&](const char* what, int64_t planned, int64_t given) {
    MLA_CHECK_ARG(planned == given, ErrorCode::kInvalidArgument,
                  "plan: made for " << what << " " << planned << ", got " << what << " " << given
                                    << "; call mla::plan() again for this step");
  };
  MLA_CHECK_ARG(plan.backend == now.backend && plan.device == now.device,
                ErrorCode::kInvalidArgument,
                "plan: made for backend " << backend_name(plan.backend) << " on "
                                          << detail::device_str(plan.device) << ", got "
                                          << backend_name(now.backend) << " on "
                                          << detail::device_str(now.device));
  same("batch", plan.batch, now.batch);
  same("query tokens", plan.num_tokens, now.num_tokens);
  same("heads", plan.num_heads, now.num_heads);
  same("q_len", plan.q_len, now.q_len);
  same("sparse_top_k", plan.sparse_top_k, now.sparse_top_k);
  same("workspace bytes", plan.workspace_bytes, now.workspace_bytes);
}

}  // namespace

size_t workspace_size(const DecodeParams& params) {
  return backend_workspace_size(detail::validate(params));
}

Plan plan(const DecodeParams& params) {
  const detail::Problem problem = detail::validate(params);
  const size_t ws_bytes = backend_workspace_size(problem);
  check_workspace(params, ws_bytes);
  // The cpu backend splits work per query token at run time; it writes no schedule.
  if (problem.backend == Backend::kSm90) detail::sm90::plan(problem, params);
  return make_plan(problem, params, ws_bytes);
}

void run(const Plan& plan, const DecodeParams& params) {
  const detail::Problem problem = detail::validate(params);
  const size_t ws_bytes = backend_workspace_size(problem);
  check_plan_matches(plan, make_plan(problem, params, ws_bytes));
  check_workspace(params, ws_bytes);
  detail::check_outputs_apart(params);
  switch (problem.backend) {
    case Backend::kCpu:
      detail::cpu::run(problem, params);
      return;
    case Backend::kSm90:
      detail::sm90::run(problem, params);
      return;
    default:
      MLA_FAIL(ErrorCode::kUnsupported,
               "backend: " << backend_name(problem.backend) << " is not available in this build");
  }
}

void decode(const DecodeParams& params) { run(plan(params), params); }

}  // namespace mla
