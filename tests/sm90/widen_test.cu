// The exact widening of e4m3 values to fp16 and bf16 (src/sm90/decode/tma/widen.cuh), which the
// wgmma kernels apply to fp8 caches and queries: all 256 bytes in every position of a 16-byte
// piece, and in every position of a word widened half by half (widen_e4m3x2_half_of), against the
// oracle's decoding (docs/contract.md section 3). NaN bytes must come out NaN; every other value
// exactly, e4m3 subnormals and signed zeros included. Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/hopper.h"
#include "oracle/oracle.h"
#include "sm90/decode/tma/widen.cuh"

namespace {

// Piece i holds byte 16 (i % 16) + (k + i / 16) % 16 at position k: every byte in every position.
template <typename T>
__global__ void widen_pieces(const uint4* in, uint4* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint4 lo, hi;
  mla::sm90::tma::widen_e4m3x16<T>(in[i], lo, hi);
  out[2 * i] = lo;
  out[2 * i + 1] = hi;
}

// The same pieces as words, each half widened by widen_e4m3x2_half_of (the few-rows kernel's fp16
// fragments): word i's bytes 0..3 come out as values 4i .. 4i + 3, in order.
__global__ void widen_word_halves(const uint4* in, uint4* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t w[4] = {in[i].x, in[i].y, in[i].z, in[i].w};
  uint32_t h[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    h[2 * k] = mla::sm90::tma::widen_e4m3x2_half_of<false>(w[k]);
    h[2 * k + 1] = mla::sm90::tma::widen_e4m3x2_half_of<true>(w[k]);
  }
  out[2 * i] = make_uint4(h[0], h[1], h[2], h[3]);
  out[2 * i + 1] = make_uint4(h[4], h[5], h[6], h[7]);
}

double half_bits_to_double(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return static_cast<double>(__half2float(__half(r)));
}
double bf16_bits_to_double(uint16_t bits) {
  uint32_t f = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &f, 4);
  return v;
}

// kHalves: through widen_word_halves (fp16) instead of widen_pieces<T>.
template <typename T, bool kHalves = false>
void check_all_bytes(double (*decode16)(uint16_t)) {
  constexpr int kPieces = 256;
  std::vector<uint8_t> bytes(kPieces * 16);
  for (int i = 0; i < kPieces; ++i) {
    for (int k = 0; k < 16; ++k) {
      bytes[i * 16 + k] = static_cast<uint8_t>(16 * (i % 16) + (k + i / 16) % 16);
    }
  }
  uint4 *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, kPieces * 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, kPieces * 32), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in, bytes.data(), kPieces * 16, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0xff, kPieces * 32), cudaSuccess);
  if constexpr (kHalves) {
    widen_word_halves<<<(kPieces + 127) / 128, 128>>>(in, out, kPieces);
  } else {
    widen_pieces<T><<<(kPieces + 127) / 128, 128>>>(in, out, kPieces);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> got(kPieces * 16);
  ASSERT_EQ(cudaMemcpy(got.data(), out, kPieces * 32, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(in);
  cudaFree(out);
  int nan_values = 0;
  for (int i = 0; i < kPieces * 16; ++i) {
    const uint8_t b = bytes[i];
    const double want = oracle::fp8_e4m3fn_to_double(b);
    const double have = decode16(got[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(have)) << "byte 0x" << std::hex << int(b);
      ++nan_values;
    } else {
      EXPECT_EQ(have, want) << "byte 0x" << std::hex << int(b) << " at position " << std::dec
                            << i % 16;
      EXPECT_EQ(std::signbit(have), std::signbit(want)) << "byte 0x" << std::hex << int(b);
    }
  }
  EXPECT_EQ(nan_values, 2 * 16);  // 0x7f and 0xff once in each of the 16 positions
}

TEST(Sm90Widen, E4m3ToFp16AllBytes) {
  SKIP_WITHOUT_HOPPER();
  check_all_bytes<__half>(&half_bits_to_double);
}

TEST(Sm90Widen, E4m3ToBf16AllBytes) {
  SKIP_WITHOUT_HOPPER();
  check_all_bytes<__nv_bfloat16>(&bf16_bits_to_double);
}

TEST(Sm90Widen, E4m3HalvesOfAWordToFp16AllBytes) {
  SKIP_WITHOUT_HOPPER();
  check_all_bytes<__half, true>(&half_bits_to_double);
}

}  // namespace
