// The byte-table lookup that the sim's ONNX Runtime lookup ops run (ort_lookup.cpp), exposed for
// tests and explain().
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch_fl {

// y[i] = table[x[i]] for i < n (a 256-byte table). `portable`: the plain C++ loop even where the
// AVX512-VBMI (x86_64) or NEON (aarch64) form would run (tests compare the two).
void lookup_bytes(const uint8_t* table, const uint8_t* x, uint8_t* y, size_t n,
                  bool portable = false);

// lookup_bytes over `rows` rows of `n` bytes: y[r * y_stride + i] = table[x[r * x_stride + i]]
// (a concat's input into its slice of the output: ort_concat.cpp).
void lookup_byte_rows(const uint8_t* table, const uint8_t* x, size_t x_stride, uint8_t* y,
                      size_t y_stride, size_t n, size_t rows, bool portable = false);

// y[i] = table[x[i]] for i < n, a table of 256 floats; `portable` as for lookup_bytes.
void lookup_floats(const float* table, const uint8_t* x, float* y, size_t n,
                   bool portable = false);

// y[k] = (table[x[k]] + table[x[stride + k]] + ... + table[x[(rows - 1) stride + k]]) / rows
// for k < cols, a table of 256 floats, the additions in row order (ort_mean.cpp: `cols` of a row
// of `stride`, so that threads can take column ranges); `portable` as for lookup_bytes (the
// AVX512-VBMI form or the plain loop).
void mean_floats(const float* table, const uint8_t* x, size_t rows, size_t cols, size_t stride,
                 float* y, bool portable = false);

// Which form lookup_bytes uses here: "avx512vbmi", "neon" or "portable" (lookup_floats: the
// AVX512-VBMI form or the plain loop).
const char* lookup_kernel();

}  // namespace torch_fl
