// Public API of the peer exchange (include/mla/exchange.h): validation and backend dispatch.
// Every rule is checked before anything is launched or written.
#include <cstdint>

#include "host/backends.h"
#include "host/check.h"
#include "mla/exchange.h"

namespace mla {
namespace detail {
namespace {

void check_ranks(int num_ranks, int rank) {
  MLA_CHECK_ARG(num_ranks >= 1 && num_ranks <= kMaxPeerRanks, ErrorCode::kInvalidArgument,
                "num_ranks: expected 1 to " << kMaxPeerRanks << ", got " << num_ranks);
  MLA_CHECK_ARG(rank >= 0 && rank < num_ranks, ErrorCode::kInvalidArgument,
                "rank: expected 0 <= rank < num_ranks (" << num_ranks << "), got " << rank);
}

void check_slot_bytes(int64_t slot_bytes) {
  MLA_CHECK_ARG(
      slot_bytes > 0 && slot_bytes % 16 == 0 && slot_bytes <= (int64_t{1} << 36),
      ErrorCode::kInvalidArgument,
      "slot_bytes: expected a positive multiple of 16 (at most 2^36), got " << slot_bytes);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace
}  // namespace detail

int64_t peer_exchange_buffer_bytes(int num_ranks, int64_t slot_bytes) {
  MLA_CHECK_ARG(num_ranks >= 1 && num_ranks <= kMaxPeerRanks, ErrorCode::kInvalidArgument,
                "num_ranks: expected 1 to " << kMaxPeerRanks << ", got " << num_ranks);
  detail::check_slot_bytes(slot_bytes);
  return (1 + detail::kPeerExchangeLandingSlots) * num_ranks * slot_bytes +
         detail::kPeerExchangeControlBytes;
}

void peer_exchange(const PeerExchangeParams& params) {
  using detail::aligned16;
  detail::check_ranks(params.num_ranks, params.rank);
  detail::check_slot_bytes(params.slot_bytes);
  const TensorView& buffer = params.buffer;
  MLA_CHECK_ARG(buffer.defined(), ErrorCode::kInvalidArgument,
                "buffer: expected a tensor (uint8 [bytes]), got none");
  const Device device = buffer.device;
  MLA_CHECK_ARG(device.device_type == static_cast<int32_t>(DeviceType::kCUDA),
                ErrorCode::kUnsupported,
                "buffer: the peer exchange moves bytes between GPUs and takes a CUDA tensor, got "
                "device "
                    << detail::device_str(device));
  MLA_CHECK_ARG(params.backend == Backend::kAuto || params.backend == Backend::kSm90,
                ErrorCode::kUnsupported,
                "backend: the peer exchange runs on sm90 only (auto or sm90), got "
                    << backend_name(params.backend));
  MLA_CHECK_ARG(buffer.ndim == 1 && buffer.dtype == dtype::kUInt8, ErrorCode::kInvalidArgument,
                "buffer: expected a 1-D uint8 tensor, got dtype "
                    << detail::dtype_str(buffer.dtype) << " shape " << detail::shape_str(buffer));
  MLA_CHECK_ARG(
      buffer.shape[0] <= 1 || buffer.strides[0] == 1, ErrorCode::kInvalidArgument,
      "buffer: expected a contiguous tensor, got strides " << detail::strides_str(buffer));
  const int64_t needed = peer_exchange_buffer_bytes(params.num_ranks, params.slot_bytes);
  MLA_CHECK_ARG(buffer.shape[0] >= needed, ErrorCode::kInvalidArgument,
                "buffer: expected at least "
                    << needed << " bytes (" << params.num_ranks << " slots of " << params.slot_bytes
                    << ", the landing area and the step counters), got " << buffer.shape[0]);
  MLA_CHECK_ARG(aligned16(buffer.data), ErrorCode::kInvalidArgument,
                "buffer: expected a 16-byte aligned address");
  for (int r = 0; r < params.num_ranks; ++r) {
    const void* peer = params.peer_buffers[r];
    MLA_CHECK_ARG(
        peer != nullptr && aligned16(peer), ErrorCode::kInvalidArgument,
        "peer_buffers[" << r << "]: expected a 16-byte aligned device address, got " << peer);
    for (int s = 0; s < r; ++s) {
      MLA_CHECK_ARG(params.peer_buffers[s] != peer, ErrorCode::kInvalidArgument,
                    "peer_buffers[" << r << "]: the same address as peer_buffers[" << s
                                    << "]; expected one buffer per rank");
    }
  }
  MLA_CHECK_ARG(params.peer_buffers[params.rank] == buffer.data, ErrorCode::kInvalidArgument,
                "peer_buffers[" << params.rank << "]: expected this rank's own buffer ("
                                << buffer.data << "), got " << params.peer_buffers[params.rank]);
  detail::sm90::check_device(device);
  if (params.num_ranks == 1) return;  // nothing to move
  detail::sm90::peer_exchange(params);
}

}  // namespace mla
