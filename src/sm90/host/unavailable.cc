// The sm90 entry points of a build without CUDA (MLA_ENABLE_CUDA=OFF): every call says so.
#include "host/backends.h"
#include "host/check.h"

namespace mla::detail::sm90 {

namespace {
[[noreturn]] void unavailable() {
  MLA_FAIL(ErrorCode::kUnsupported,
           "backend: sm90 is not available in this build (configured with MLA_ENABLE_CUDA=OFF); "
           "CUDA tensors cannot be processed. Rebuild with CUDA or use host tensors with backend "
           "cpu");
}
}  // namespace

void check_device(Device) { unavailable(); }
size_t workspace_size(const Problem&) { unavailable(); }
void plan(const Problem&, const DecodeParams&) { unavailable(); }
void run(const Problem&, const DecodeParams&) { unavailable(); }

}  // namespace mla::detail::sm90
