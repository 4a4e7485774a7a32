#include "runtime/fingerprint.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <system_error>
#include <thread>
#include <vector>

namespace torch_fl {
namespace {

constexpr int kLanes = 8;   // 64-bit lanes of a group: one 64-byte block per step
constexpr int kGroups = 4;  // groups, each over its own quarter of the range
constexpr size_t kBlock = 8 * kLanes;
// Odd multipliers: the fractional parts of the square roots of the first primes (2..19), the
// low bit set. Odd, so multiplying is a bijection modulo 2^64.
constexpr uint64_t kLaneMul[kLanes] = {
    0x6a09e667f3bcc909ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
constexpr uint64_t kMixMul = 0xcbbb9d5dc1059ed9ULL;    // sqrt(23)
constexpr uint64_t kFinalMul = 0x629a292a367cd507ULL;  // sqrt(29)
constexpr size_t kBytesPerThread = size_t{1} << 20;
// At most this many threads hash at once, whatever the caller allows: a pass reads memory at
// 20-65 GB/s a thread here, so a handful already meets the memory bandwidth of the hosts and
// boards this runs on (only 2 CPUs were there to measure: beyond that it is an estimate).
constexpr size_t kMaxThreads = 8;

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> ((64 - r) & 63)); }

inline uint64_t load_word(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);  // unaligned-safe; little-endian on every target we build for
  return v;
}

// xor in the word, multiply by an odd constant, fold the high half onto the low (x ^ x >> 32),
// multiply again, rotate: each a bijection, so the step is one of the lane for a fixed word and
// of the word for a fixed lane. Why two multiplies: a multiply carries a flipped top bit
// straight through (x + 2^63 times an odd number is the product + 2^63), and so does any linear
// mix before it for the change it maps onto the top bit; with one multiply, a step turned some
// change into a fixed one that the lane's next word could flip back (a sign flip, and one
// exponent bit 64 bytes later, gave the same print). The fold brings the top bit into the low
// half, where the second multiply spreads it into bits that depend on the data, so no fixed
// pattern of flips cancels.
inline uint64_t lane_step(uint64_t lane, uint64_t word, uint64_t mul) {
  uint64_t x = (lane ^ word) * mul;
  x ^= x >> 32;
  return rotl64(x * kMixMul, 29);
}

// One group's eight lanes over `nblocks` consecutive 64-byte blocks. The lanes as locals, each
// step written out: eight independent chains the compiler keeps in registers, so the multiplies
// overlap (an array indexed in a loop went through memory: 9.6 GB/s against 29 GB/s in registers
// on 20 MB, 2-core EPYC, -O2, timed by hand with the one-multiply step; 19 GB/s with two).
void absorb_group(uint64_t lane[kLanes], const unsigned char* data, size_t nblocks) {
  uint64_t l0 = lane[0], l1 = lane[1], l2 = lane[2], l3 = lane[3];
  uint64_t l4 = lane[4], l5 = lane[5], l6 = lane[6], l7 = lane[7];
  for (size_t b = 0; b < nblocks; ++b) {
    const unsigned char* block = data + b * kBlock;
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

void absorb_groups_portable(uint64_t lanes[kGroups][kLanes], const unsigned char* data,
                            size_t quarter) {
  for (int g = 0; g < kGroups; ++g) absorb_group(lanes[g], data + g * quarter * kBlock, quarter);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The same four groups at once, a group's eight lanes in one 512-bit register: the same
// function, computed with AVX-512's 64-bit multiply (vpmullq). The scalar chains are bound by
// one 64-bit multiply per cycle; here four independent vectors keep the multiplier busy
// (a stand-alone loop on 10 MB: 67 GB/s against 18.5 for the scalar groups, 2-core EPYC).
// AVX2 has no 64-bit multiply: its form of this loop was slower than the scalar one (13 GB/s).
typedef uint64_t U64x8 __attribute__((vector_size(64)));

__attribute__((target("avx512f,avx512dq"))) void absorb_groups_avx512(
    uint64_t lanes[kGroups][kLanes], const unsigned char* data, size_t quarter) {
  U64x8 mul, a0, a1, a2, a3;
  std::memcpy(&mul, kLaneMul, sizeof mul);
  std::memcpy(&a0, lanes[0], sizeof a0);
  std::memcpy(&a1, lanes[1], sizeof a1);
  std::memcpy(&a2, lanes[2], sizeof a2);
  std::memcpy(&a3, lanes[3], sizeof a3);
  const size_t stride = quarter * kBlock;
  for (size_t b = 0; b < quarter; ++b) {
    const unsigned char* p = data + b * kBlock;
    U64x8 w0, w1, w2, w3;
    std::memcpy(&w0, p, sizeof w0);
    std::memcpy(&w1, p + stride, sizeof w1);
    std::memcpy(&w2, p + 2 * stride, sizeof w2);
    std::memcpy(&w3, p + 3 * stride, sizeof w3);
    U64x8 x0 = (a0 ^ w0) * mul, x1 = (a1 ^ w1) * mul;
    U64x8 x2 = (a2 ^ w2) * mul, x3 = (a3 ^ w3) * mul;
    x0 ^= x0 >> 32, x1 ^= x1 >> 32, x2 ^= x2 >> 32, x3 ^= x3 >> 32;
    x0 *= kMixMul, x1 *= kMixMul, x2 *= kMixMul, x3 *= kMixMul;
    a0 = (x0 << 29) | (x0 >> 35), a1 = (x1 << 29) | (x1 >> 35);
    a2 = (x2 << 29) | (x2 >> 35), a3 = (x3 << 29) | (x3 >> 35);
  }
  std::memcpy(lanes[0], &a0, sizeof a0);
  std::memcpy(lanes[1], &a1, sizeof a1);
  std::memcpy(lanes[2], &a2, sizeof a2);
  std::memcpy(lanes[3], &a3, sizeof a3);
}

bool have_avx512() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  return have;
}
#endif

// A bijective finaliser (xor-shift / odd multiply rounds).
inline uint64_t finish(uint64_t x) {
  x ^= x >> 31;
  x *= kFinalMul;
  x ^= x >> 29;
  x *= kLaneMul[0];
  x ^= x >> 32;
  return x;
}

}  // namespace

const char* fingerprint_kernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (have_avx512()) return "avx512";
#endif
  return "portable";
}

Fingerprint128 fingerprint_bytes(const unsigned char* data, size_t nbytes, bool portable) {
  uint64_t lanes[kGroups][kLanes];
  for (int g = 0; g < kGroups; ++g) {
    for (int i = 0; i < kLanes; ++i) lanes[g][i] = rotl64(kLaneMul[(i + 3) % kLanes], 16 * g);
  }
  // Whole blocks: each group takes a quarter of them, the last group also the 0..3 left over
  // (they follow its quarter), so a group reads one contiguous run.
  const size_t nblocks = nbytes / kBlock;
  const size_t quarter = nblocks / kGroups;
  bool done = false;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!portable && quarter > 0 && have_avx512()) {
    absorb_groups_avx512(lanes, data, quarter);
    done = true;
  }
#endif
  if (!done) absorb_groups_portable(lanes, data, quarter);
  absorb_group(lanes[kGroups - 1], data + kGroups * quarter * kBlock, nblocks - kGroups * quarter);
  // The tail: whole words into the first group's lanes, then the last bytes zero-padded. The
  // length is mixed in below, so a tail of zeros differs from a shorter range.
  size_t offset = nblocks * kBlock;
  int i = 0;
  for (; offset + 8 <= nbytes; offset += 8, ++i) {
    lanes[0][i] = lane_step(lanes[0][i], load_word(data + offset), kLaneMul[i]);
  }
  if (offset < nbytes) {
    unsigned char last[8] = {0};
    std::memcpy(last, data + offset, nbytes - offset);
    lanes[0][i] = lane_step(lanes[0][i], load_word(last), kLaneMul[i]);
  }
  // Each half: sixteen lanes combined by xor after distinct rotations (a bijection of each lane
  // for the others fixed), with the length, then finished.
  const uint64_t length = static_cast<uint64_t>(nbytes);
  uint64_t lo = length;
  uint64_t hi = rotl64(length, 32) ^ kFinalMul;
  for (int g = 0; g < kGroups; ++g) {
    for (int k = 0; k < kLanes / 2; ++k) {
      const int j = g * (kLanes / 2) + k;  // 0..15
      lo ^= rotl64(lanes[g][k], 4 * j);
      hi ^= rotl64(lanes[g][k + kLanes / 2], 4 * j + 2);
    }
  }
  return Fingerprint128{finish(lo), finish(hi ^ lo)};
}

void fingerprint_many(const unsigned char* const* data, const size_t* nbytes, size_t count,
                      Fingerprint128* out, bool portable, int threads) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += nbytes[i];
  // A thread only where it has enough to hash: starting and joining one costs tens of
  // microseconds, what hashing about a megabyte takes.
  size_t bins = static_cast<size_t>(std::max(threads, 1));
  bins = std::min({bins, kMaxThreads, count, 1 + total / kBytesPerThread});
  if (bins <= 1) {
    for (size_t i = 0; i < count; ++i) out[i] = fingerprint_bytes(data[i], nbytes[i], portable);
    return;
  }
  // Whole tensors to bins, largest first to the least loaded (within 4/3 of the best split).
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return nbytes[a] > nbytes[b]; });
  std::vector<std::vector<size_t>> bin(bins);
  std::vector<size_t> load(bins, 0);
  for (size_t i : order) {
    const size_t least = std::min_element(load.begin(), load.end()) - load.begin();
    bin[least].push_back(i);
    load[least] += nbytes[i];
  }
  auto hash_bin = [&](size_t b) {
    for (size_t i : bin[b]) out[i] = fingerprint_bytes(data[i], nbytes[i], portable);
  };
  std::vector<std::thread> helpers;
  size_t started = 1;  // bin 0 is the caller's
  for (; started < bins; ++started) {
    try {
      helpers.emplace_back(hash_bin, started);
    } catch (const std::system_error&) {
      break;  // no thread to be had (a process or memory limit): the caller hashes the rest
    }
  }
  hash_bin(0);
  for (size_t b = started; b < bins; ++b) hash_bin(b);
  for (auto& t : helpers) t.join();
}

}  // namespace torch_fl
