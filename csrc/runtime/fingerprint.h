// A 128-bit content fingerprint of a byte range, to tell whether weights baked into an artifact
// changed since (torch_fl/bpu/conversion/freezing.py). Not a MAC: it detects changes, it does not
// resist someone building a collision.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch_fl {

struct Fingerprint128 {
  uint64_t lo;
  uint64_t hi;
};

// Four groups of eight 64-bit lanes, each group over its own quarter of the range, one 8-byte
// word per lane per 64-byte block; each step a bijection of both the lane and the word: any
// single changed 8-byte word always changes the result, no fixed pattern of changed bits
// cancels, and other changes leave it equal about once in 2^64. Plain C++ (little-endian word
// loads), with an AVX-512 form of the same function where the CPU has it, so x86_64 and the
// boards' aarch64 compute the same prints. `portable`: the plain C++ even where AVX-512 is
// there (to test that both agree).
Fingerprint128 fingerprint_bytes(const unsigned char* data, size_t nbytes, bool portable = false);

// fingerprint_bytes of `count` ranges into `out`, on up to `threads` threads (the caller's among
// them, 8 at most): whole ranges to threads, one thread per megabyte at most. The prints do not
// depend on the thread count.
void fingerprint_many(const unsigned char* const* data, const size_t* nbytes, size_t count,
                      Fingerprint128* out, bool portable = false, int threads = 1);

// Which form fingerprint_bytes uses here: "avx512" or "portable".
const char* fingerprint_kernel();

}  // namespace torch_fl
