// The byte-table lookup that the sim's ONNX Runtime lookup ops run (ort_lookup.cpp), exposed for
// tests and explain().
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch_fl {

// y[i] = table[x[i]] for i < n (a 256-byte table). `portable`: the plain C++ loop even where the
// AVX512-VBMI or AVX2 (x86_64) or NEON (aarch64) form would run (tests compare the two).
void lookup_bytes(const uint8_t* table, const uint8_t* x, uint8_t* y, size_t n,
                  bool portable = false);

// lookup_bytes over `rows` rows of `n` bytes: y[r * y_stride + i] = table[x[r * x_stride + i]]
// (a concat's input into its slice of the output: ort_concat.cpp).
void lookup_byte_rows(const uint8_t* table, const uint8_t* x, size_t x_stride, uint8_t* y,
                      size_t y_stride, size_t n, size_t rows, bool portable = false);

// y[i] = table[x[i]] for i < n, a table of 256 floats; `portable` as for lookup_bytes.
void lookup_floats(const float* table, const uint8_t* x, float* y, size_t n,
                   bool portable = false);

// The order in which mean_floats adds a column's rows, each ONNX Runtime's ReduceMean order for
// one form of reduction (ort_mean.cpp):
//   kRowOrder     0.0 + row 0 + row 1 + ... in turn ([1, R, C] over R: its "RK" form);
//   kGroupsOfFour the rows in groups of 4, then one of 2, then 1 (as many as are left), each
//                 group added left to right and then to the sum so far, which starts at 0.0
//                 ([N, R, C] over R: its "KRK" form, a 1-row matrix product per item, whose x86
//                 kernel MlasSgemmKernelM1Avx adds so).
enum class MeanOrder { kRowOrder = 0, kGroupsOfFour = 1 };

// y[k] = (table[x[k]] + table[x[stride + k]] + ... + table[x[(rows - 1) stride + k]]) / rows
// for k < cols, a table of 256 floats, the additions in `order` (ort_mean.cpp: `cols` of a row
// of `stride`, so that threads can take column ranges); `portable` as for lookup_bytes (the
// AVX512-VBMI or AVX2 form, or the plain loop).
void mean_floats(const float* table, const uint8_t* x, size_t rows, size_t cols, size_t stride,
                 float* y, MeanOrder order = MeanOrder::kRowOrder, bool portable = false);

// A 256-byte table that clamps its byte: table[b] == min(max(b, lo), hi) for every byte b, the
// bytes compared as unsigned or (`is_signed`) as int8. The ReLUs that
// conversion/integer_form.py moves after their quantization (Max(q, zero point), a ReLU6's
// Clip) become such tables (conversion/lookups.py).
struct ByteClamp {
  bool is_signed = false;
  uint8_t lo = 0, hi = 255;
};

// Whether `table` is a clamp (unsigned tried first), and if so its bounds in *clamp.
bool clamp_of(const uint8_t* table, ByteClamp* clamp);

// y[i] = x[i] clamped, for i < n: what lookup_bytes returns with a table clamp_of takes, as a
// max and a min (one instruction each per 64 bytes with AVX-512BW, per 16 with NEON, against
// the lookup's five). x may be y. `portable` as for lookup_bytes (the plain loop).
void clamp_bytes(const ByteClamp& clamp, const uint8_t* x, uint8_t* y, size_t n,
                 bool portable = false);

// How many runs of a product pair (Lookup2Mul) computed its running operand's floats as a
// DequantizeLinear instead of gathering them from its table, in this process (the AVX2 form).
uint64_t affine_products();

// Whether the 256 floats of `table` are a DequantizeLinear of the bytes (as uint8, or int8 where
// `signed_bytes`): float(v - zp) * scale bit for bit; if so its scale and zero point.
bool dequant_of(const float* table, bool signed_bytes, float* scale, int* zp);

// How many times a byte lookup op has run with its output over its input, in this process.
uint64_t lookups_in_place();

// Which form lookup_bytes uses here: "avx512vbmi", "avx2", "neon" or "portable" (lookup_floats
// and mean_floats: the AVX512-VBMI or AVX2 form, or the plain loop).
const char* lookup_kernel();

}  // namespace torch_fl
