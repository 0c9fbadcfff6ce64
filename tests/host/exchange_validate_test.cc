// One test (or more) per validation rule of mla::peer_exchange and peer_exchange_buffer_bytes
// (include/mla/exchange.h): each bad argument is refused with an error naming it. The buffers are
// described, never dereferenced: every rule is checked before the device is asked for.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "mla/mla.h"

namespace {

// Fake 16-byte aligned device addresses of three ranks' buffers (never dereferenced).
alignas(16) char fake_memory[3][64];

mla::PeerExchangeParams valid(int num_ranks = 2, int rank = 0, int64_t slot_bytes = 1024) {
  mla::PeerExchangeParams p;
  p.num_ranks = num_ranks;
  p.rank = rank;
  p.slot_bytes = slot_bytes;
  for (int r = 0; r < num_ranks; ++r) p.peer_buffers[r] = fake_memory[r];
  const int64_t bytes = mla::peer_exchange_buffer_bytes(num_ranks, slot_bytes);
  p.buffer = mla::TensorView::contiguous(fake_memory[rank], mla::dtype::kUInt8, {bytes},
                                         mla::cuda_device(0));
  p.backend = mla::Backend::kSm90;
  return p;
}

void expect_refused(const mla::PeerExchangeParams& p, mla::ErrorCode code,
                    const std::string& needle) {
  try {
    mla::peer_exchange(p);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const mla::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ExchangeValidate, BufferBytes) {
  EXPECT_EQ(mla::peer_exchange_buffer_bytes(2, 1024), 5 * 2 * 1024 + 256);
  EXPECT_EQ(mla::peer_exchange_buffer_bytes(8, 16), 5 * 8 * 16 + 256);
  for (int n : {0, 9, -1}) {
    EXPECT_THROW(mla::peer_exchange_buffer_bytes(n, 1024), mla::Error) << n;
  }
  for (int64_t s : {int64_t{0}, int64_t{8}, int64_t{-16}, int64_t{1000}}) {
    EXPECT_THROW(mla::peer_exchange_buffer_bytes(2, s), mla::Error) << s;
  }
}

TEST(ExchangeValidate, Ranks) {
  auto p = valid();
  p.num_ranks = 0;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "num_ranks: expected 1 to 8, got 0");
  p = valid();
  p.num_ranks = 9;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "num_ranks: expected 1 to 8, got 9");
  p = valid();
  p.rank = 2;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "rank: expected 0 <= rank < num_ranks");
  p = valid();
  p.rank = -1;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "rank: expected 0 <= rank < num_ranks");
}

TEST(ExchangeValidate, SlotBytes) {
  for (int64_t s : {int64_t{0}, int64_t{24}, int64_t{-32}}) {
    auto p = valid();
    p.slot_bytes = s;
    expect_refused(p, mla::ErrorCode::kInvalidArgument, "slot_bytes: expected a positive multiple");
  }
}

TEST(ExchangeValidate, Buffer) {
  auto p = valid();
  p.buffer = {};
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "buffer: expected a tensor");
  p = valid();
  p.buffer.device = mla::kCPU;
  expect_refused(p, mla::ErrorCode::kUnsupported, "buffer: the peer exchange moves bytes");
  p = valid();
  p.backend = mla::Backend::kCpu;
  expect_refused(p, mla::ErrorCode::kUnsupported, "backend: the peer exchange runs on sm90");
  p = valid();
  p.buffer.dtype = mla::dtype::kFloat32;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "buffer: expected a 1-D uint8 tensor");
  p = valid();
  p.buffer.strides[0] = 2;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "buffer: expected a contiguous tensor");
  p = valid();
  p.buffer.shape[0] -= 1;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "buffer: expected at least 10496 bytes");
  p = valid();
  p.buffer.data = fake_memory[0] + 8;
  p.peer_buffers[0] = p.buffer.data;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "buffer: expected a 16-byte aligned");
}

TEST(ExchangeValidate, PeerBuffers) {
  auto p = valid(3, 1);
  p.peer_buffers[2] = nullptr;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "peer_buffers[2]: expected a 16-byte");
  p = valid(3, 1);
  p.peer_buffers[0] = fake_memory[0] + 4;
  expect_refused(p, mla::ErrorCode::kInvalidArgument, "peer_buffers[0]: expected a 16-byte");
  p = valid(3, 1);
  p.peer_buffers[2] = p.peer_buffers[0];
  expect_refused(p, mla::ErrorCode::kInvalidArgument,
                 "peer_buffers[2]: the same address as peer_buffers[0]");
  p = valid(3, 1);
  p.peer_buffers[1] = fake_memory[2];
  p.peer_buffers[2] = fake_memory[1] + 16;
  expect_refused(p, mla::ErrorCode::kInvalidArgument,
                 "peer_buffers[1]: expected this rank's own buffer");
}

}  // namespace
