#include "runtime/fingerprint.h"

#include <cstring>

namespace torch_fl {
namespace {

constexpr int kFingerprintLanes = 8;
// Odd multipliers: the fractional parts of the square roots of the first primes (2..19), the
// low bit set. Odd, so multiplying is a bijection modulo 2^64.
constexpr uint64_t kLaneMul[kFingerprintLanes] = {
    0x6a09e667f3bcc909ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
constexpr uint64_t kFinalMul = 0xcbbb9d5dc1059ed9ULL;  // sqrt(23)

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t load_word(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);  // unaligned-safe; little-endian on every target we build for
  return v;
}

// xor, multiply by an odd constant, rotate: each a bijection of the lane for a fixed word and
// of the word for a fixed lane. The rotation brings the product's well-mixed high bits down,
// so that two flipped sign bits (x + 2^63 survives a multiply unchanged) cannot cancel.
inline uint64_t lane_step(uint64_t lane, uint64_t word, uint64_t mul) {
  return rotl64((lane ^ word) * mul, 29);
}

// A bijective finaliser (xor-shift / odd multiply rounds).
inline uint64_t finish_lane(uint64_t x) {
  x ^= x >> 31;
  x *= kFinalMul;
  x ^= x >> 29;
  x *= kLaneMul[0];
  x ^= x >> 32;
  return x;
}

}  // namespace

Fingerprint128 fingerprint_bytes(const unsigned char* data, size_t nbytes) {
  uint64_t lane[kFingerprintLanes];
  for (int i = 0; i < kFingerprintLanes; ++i) lane[i] = kLaneMul[(i + 3) % kFingerprintLanes];
  constexpr size_t kBlock = 8 * kFingerprintLanes;
  size_t offset = 0;
  {
    // The lanes as locals, each step written out: eight independent chains the compiler keeps
    // in registers, so the multiplies overlap (an array indexed in a loop went through memory:
    // 9.6 GB/s against 29 GB/s in registers on 20 MB, 2-core EPYC, -O2, timed by hand).
    uint64_t l0 = lane[0], l1 = lane[1], l2 = lane[2], l3 = lane[3];
    uint64_t l4 = lane[4], l5 = lane[5], l6 = lane[6], l7 = lane[7];
    for (; offset + kBlock <= nbytes; offset += kBlock) {
      const unsigned char* block = data + offset;
      l0 = lane_step(l0, load_word(block + 0), kLaneMul[0]);
      l1 = lane_step(l1, load_word(block + 8), kLaneMul[1]);
      l2 = lane_step(l2, load_word(block + 16), kLaneMul[2]);
      l3 = lane_step(l3, load_word(block + 24), kLaneMul[3]);
      l4 = lane_step(l4, load_word(block + 32), kLaneMul[4]);
      l5 = lane_step(l5, load_word(block + 40), kLaneMul[5]);
      l6 = lane_step(l6, load_word(block + 48), kLaneMul[6]);
      l7 = lane_step(l7, load_word(block + 56), kLaneMul[7]);
    }
    lane[0] = l0, lane[1] = l1, lane[2] = l2, lane[3] = l3;
    lane[4] = l4, lane[5] = l5, lane[6] = l6, lane[7] = l7;
  }
  // The tail: whole words into the first lanes, then the last bytes zero-padded. The length is
  // mixed in below, so a tail of zeros differs from a shorter range.
  int i = 0;
  for (; offset + 8 <= nbytes; offset += 8, ++i) {
    lane[i] = lane_step(lane[i], load_word(data + offset), kLaneMul[i]);
  }
  if (offset < nbytes) {
    unsigned char last[8] = {0};
    std::memcpy(last, data + offset, nbytes - offset);
    lane[i] = lane_step(lane[i], load_word(last), kLaneMul[i]);
  }
  // Each half: four lanes combined by xor after distinct rotations (a bijection of each lane
  // for the others fixed), with the length, then finished.
  const uint64_t length = static_cast<uint64_t>(nbytes);
  uint64_t lo = length;
  uint64_t hi = rotl64(length, 32) ^ kFinalMul;
  for (int k = 0; k < 4; ++k) {
    lo ^= rotl64(lane[k], 16 * k);
    hi ^= rotl64(lane[k + 4], 16 * k + 8);
  }
  return Fingerprint128{finish_lane(lo), finish_lane(hi ^ lo)};
}

}  // namespace torch_fl
