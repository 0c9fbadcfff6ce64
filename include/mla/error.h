// The one exception type the library throws.
#pragma once

#include <stdexcept>
#include <string>

namespace mla {

/// @brief What kind of failure an mla::Error reports.
enum class ErrorCode : int {
  kInvalidArgument = 1,  ///< a shape, rank, stride, size or value breaks the contract
  kTypeError = 2,        ///< a dtype or dtype pair is not accepted
  kDeviceError = 3,      ///< tensors on the wrong or mixed devices
  kUnsupported = 4,      ///< valid input that the chosen backend does not implement
  kBadIndex = 5,         ///< bad contents of an index tensor (checked mode and cpu backend)
  kWorkspaceTooSmall = 6,
  kRuntimeError = 7,  ///< a failure of the underlying runtime (e.g. a CUDA error)
};

/// @brief Name of an error code, e.g. "InvalidArgument".
const char* error_code_name(ErrorCode code);

/// @brief Thrown for every rejected call; what() names the argument, the expectation and the value.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace mla
