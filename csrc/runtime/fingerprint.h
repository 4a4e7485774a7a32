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

// Eight independent 64-bit lanes, one 8-byte word each per 64-byte block, each step a bijection
// of both the lane and the word: any single changed 8-byte word always changes the result, and
// other changes leave it equal about once in 2^64. Plain C++ (no intrinsics, little-endian
// word loads), so x86_64 and the boards' aarch64 compute the same function.
Fingerprint128 fingerprint_bytes(const unsigned char* data, size_t nbytes);

}  // namespace torch_fl
