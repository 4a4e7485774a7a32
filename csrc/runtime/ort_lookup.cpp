// Table-lookup ops for the sim executor's ONNX Runtime sessions: an elementwise function of one
// or two 8-bit tensors, evaluated by indexing a table that holds its value for every input byte
// (pair): at most 256 (65536) results, all known in advance. torch_fl/bpu/conversion/lookups.py
// builds each table by running the very chain of float ops the table replaces on every input,
// so the lookup gives the same numbers as the float path, in one pass over bytes instead of a
// dequantize, float kernels and a quantize.
//
// Ops, in domain "torch_fl.bpu", named by output type (u8 / i8 / f32):
//   Lookup<T>(table[256] of T, x)         y[i] = table[byte(x[i])]               (y shaped as x)
//   Lookup2<T>(table[65536] of T, a, b)   y[i] = table[byte(a[i]) * 256 + byte(b[i])]  (u8, i8)
// where x, a, b are uint8 or int8 (byte(): the raw byte) and a, b broadcast as in ONNX.
// ONNX Runtime finds them through RegisterCustomOps (ort_ops.cpp: this extension's shared library
// is the custom-op library: SessionOptions.register_custom_ops_library(torch_fl._C.__file__)).
#include "runtime/ort_lookup.h"

#include "runtime/ort_kernel.h"

#include <algorithm>
#include <atomic>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace torch_fl {
namespace ort_lookup {

// How many of the `left` rows mean_floats adds as its next group (ort_lookup.h, MeanOrder).
inline size_t group_size(MeanOrder order, size_t left) {
  if (order == MeanOrder::kRowOrder) {
    return 1;
  }
  return left >= 4 ? 4 : left >= 2 ? 2 : 1;
}

// ONNX Runtime's QuantizeLinear as a product pair's last step (Lookup2Mul, below): the value
// divided by `scale` (multiplied, where `divide` is false), clamped to [lo, hi] less the zero
// point, rounded to nearest even, plus the zero point.
struct ProductQuant {
  float scale;
  bool divide;
  int zp, lo, hi;
};

// The running operand's floats where its table is a DequantizeLinear (affine_table): its bytes
// widened, less the zero point, converted and scaled, the same float32 operations that made
// every entry of the table (checked on all 256), so the same floats as the gather of the table.
struct Dequant {
  float scale;
  int zp;
  bool signed_bytes;
};

// table[i] == float(v - zp) * scale, bit for bit, for every byte i (v: i as uint8, or as int8
// where `signed_bytes`), with the zero point and scale read off the table itself: the one
// entry that is +0.0 is the zero point, the entry of value zp + 1 (or zp - 1) the scale.
bool affine_table(const float* table, bool signed_bytes, Dequant* d) {
  const auto value = [&](int i) {
    return signed_bytes ? static_cast<int>(static_cast<int8_t>(i)) : i;
  };
  const auto index = [&](int v) {
    return signed_bytes ? static_cast<int>(static_cast<uint8_t>(v)) : v;
  };
  int zero = -1;
  for (int i = 0; i < 256; ++i) {
    uint32_t bits;
    std::memcpy(&bits, table + i, sizeof bits);
    if (bits == 0) {
      if (zero >= 0) {
        return false;  // two zeros: a scale of 0, or not a dequantize
      }
      zero = i;
    }
  }
  if (zero < 0) {
    return false;  // a -0.0 there is another float: the gather keeps its sign
  }
  const int zp = value(zero), hi = signed_bytes ? 127 : 255;
  const float scale = zp < hi ? table[index(zp + 1)] : -table[index(zp - 1)];
  for (int i = 0; i < 256; ++i) {
    const float want = static_cast<float>(value(i) - zp) * scale;
    if (std::memcmp(&want, table + i, sizeof want) != 0) {
      return false;
    }
  }
  *d = Dequant{scale, zp, signed_bytes};
  return true;
}

// A two-input table that is a product: table[a * 256 + b] == Q(a_floats[a] * b_floats[b])
// for every pair (conversion/lookups.py writes the op only where that holds, checked on all
// 65536 in the kernel's own arithmetic).
struct Product {
  const float* a_floats;
  const float* b_floats;
  ProductQuant quant;
  // each operand's table as a DequantizeLinear, where it is one (affine_table)
  bool a_affine, b_affine;
  Dequant a_dq, b_dq;
};

void lookup_portable(const uint8_t* table, const uint8_t* x, uint8_t* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {  // eight independent loads in flight
    uint8_t v0 = table[x[i]], v1 = table[x[i + 1]], v2 = table[x[i + 2]], v3 = table[x[i + 3]];
    uint8_t v4 = table[x[i + 4]], v5 = table[x[i + 5]], v6 = table[x[i + 6]], v7 = table[x[i + 7]];
    y[i] = v0, y[i + 1] = v1, y[i + 2] = v2, y[i + 3] = v3;
    y[i + 4] = v4, y[i + 5] = v5, y[i + 6] = v6, y[i + 7] = v7;
  }
  for (; i < n; ++i) {
    y[i] = table[x[i]];
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// AVX512-VBMI: the 256-byte table in four registers; VPERMT2B looks up 64 bytes at a time in
// each half (the index's low 7 bits), and the index's top bit picks the half. By ORT's
// profiler, MobileNetV3's ten hardswish lookups at batch 1: 39 us against 119 us for the loop.
__attribute__((target("avx512f,avx512bw,avx512vbmi,bmi2"))) void lookup_vbmi(const uint8_t* table,
                                                                        const uint8_t* x,
                                                                        uint8_t* y, size_t n) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i idx = _mm512_loadu_si512(x + i);
    const __m512i low = _mm512_permutex2var_epi8(t0, idx, t1);
    const __m512i high = _mm512_permutex2var_epi8(t2, idx, t3);
    _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), low, high));
  }
  if (i < n) {
    const __mmask64 tail = _bzhi_u64(~0ULL, static_cast<unsigned>(n - i));
    const __m512i idx = _mm512_maskz_loadu_epi8(tail, x + i);
    const __m512i low = _mm512_permutex2var_epi8(t0, idx, t1);
    const __m512i high = _mm512_permutex2var_epi8(t2, idx, t3);
    _mm512_mask_storeu_epi8(y + i, tail,
                            _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), low, high));
  }
}

// lookup_vbmi over `rows` rows of `n` bytes, x's rows `x_stride` apart and y's `y_stride` (a
// concat's input into its slice of the output: ort_concat.cpp), the table loaded once for all.
// A row of NHWC channels is often under 64 bytes: one masked load and store a row.
__attribute__((target("avx512f,avx512bw,avx512vbmi,bmi2"))) void lookup_rows_vbmi(
    const uint8_t* table, const uint8_t* x, size_t x_stride, uint8_t* y, size_t y_stride,
    size_t n, size_t rows) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  const size_t whole = n / 64 * 64;
  const __mmask64 tail = _bzhi_u64(~0ULL, static_cast<unsigned>(n - whole));
  for (size_t r = 0; r < rows; ++r, x += x_stride, y += y_stride) {
    for (size_t i = 0; i < whole; i += 64) {
      const __m512i idx = _mm512_loadu_si512(x + i);
      const __m512i low = _mm512_permutex2var_epi8(t0, idx, t1);
      const __m512i high = _mm512_permutex2var_epi8(t2, idx, t3);
      _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), low, high));
    }
    if (tail) {
      const __m512i idx = _mm512_maskz_loadu_epi8(tail, x + whole);
      const __m512i low = _mm512_permutex2var_epi8(t0, idx, t1);
      const __m512i high = _mm512_permutex2var_epi8(t2, idx, t3);
      _mm512_mask_storeu_epi8(y + whole, tail,
                              _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), low, high));
    }
  }
}

// AVX512-VBMI for a table of 256 floats: each of a float's four bytes is a 256-byte table of
// its own (a "plane"), looked up as lookup_vbmi does, then the four planes' bytes are put back
// together as floats, 16 at a time. Timed by hand on 28224 indices: 2.9 us, against 5.6 us for
// the scalar loop and 9.0 us for AVX-512's gather.
#define TFL_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi,bmi2")))

// A float table's four byte planes, in the registers lookup64 reads.
struct FloatPlanes {
  __m512i t[4][4];
};

TFL_VBMI inline void make_planes(const float* table, FloatPlanes* p) {
  alignas(64) uint8_t planes[4][256];
  for (int i = 0; i < 256; ++i) {
    uint32_t bits;
    std::memcpy(&bits, table + i, sizeof bits);
    for (int b = 0; b < 4; ++b) planes[b][i] = static_cast<uint8_t>(bits >> (8 * b));
  }
  for (int b = 0; b < 4; ++b) {
    for (int k = 0; k < 4; ++k) p->t[b][k] = _mm512_load_si512(planes[b] + 64 * k);
  }
}

// Byte q of the index, for lookup64's joins: the index of element 16k + 4L + j, at q = 16L +
// 4k + j (the byte the unpacks below put in lane L, slot j of vector k).
alignas(64) constexpr uint8_t kJoinOrder[64] = {
    0,  1,  2,  3,  16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51,
    4,  5,  6,  7,  20, 21, 22, 23, 36, 37, 38, 39, 52, 53, 54, 55,
    8,  9,  10, 11, 24, 25, 26, 27, 40, 41, 42, 43, 56, 57, 58, 59,
    12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63};

// The table's floats for 64 indices, as four vectors of 16 (their bit patterns). The four
// planes' bytes become floats by two rounds of unpacks, which interleave within 128-bit lanes;
// the index is put in the order that makes the result come out in element order. (Widening
// each plane's bytes and shifting them in place took 56 instructions for 64 floats, the
// unpacks take 8.)
TFL_VBMI __attribute__((always_inline)) inline void lookup64(const FloatPlanes& p, __m512i idx, __m512i (&q)[4]) {
  idx = _mm512_permutexvar_epi8(_mm512_load_si512(kJoinOrder), idx);
  const __mmask64 high = _mm512_movepi8_mask(idx);
  __m512i v[4];
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) {
    v[b] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(p.t[b][0], idx, p.t[b][1]),
                                  _mm512_permutex2var_epi8(p.t[b][2], idx, p.t[b][3]));
  }
  const __m512i lo01 = _mm512_unpacklo_epi8(v[0], v[1]), hi01 = _mm512_unpackhi_epi8(v[0], v[1]);
  const __m512i lo23 = _mm512_unpacklo_epi8(v[2], v[3]), hi23 = _mm512_unpackhi_epi8(v[2], v[3]);
  q[0] = _mm512_unpacklo_epi16(lo01, lo23), q[1] = _mm512_unpackhi_epi16(lo01, lo23);
  q[2] = _mm512_unpacklo_epi16(hi01, hi23), q[3] = _mm512_unpackhi_epi16(hi01, hi23);
}

TFL_VBMI inline __mmask64 first_bytes(size_t left) {
  return left >= 64 ? ~0ULL : _bzhi_u64(~0ULL, static_cast<unsigned>(left));
}

TFL_VBMI void lookup_floats_vbmi(const float* table, const uint8_t* x, float* y, size_t n) {
  FloatPlanes p;
  make_planes(table, &p);
  for (size_t i = 0; i < n; i += 64) {
    const __mmask64 in = first_bytes(n - i);
    __m512i q[4];
    lookup64(p, _mm512_maskz_loadu_epi8(in, x + i), q);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __mmask16 out = static_cast<__mmask16>(in >> (16 * k));
      _mm512_mask_storeu_epi32(y + i + 16 * k, out, q[k]);
    }
  }
}

// A product pair (Lookup2MulU8 / I8, ort_lookup.h) over NHWC pixels: y = Q(t[x] * f), `x` the
// running operand's bytes, `t` its float table, `f` the repeated operand's floats (`pattern`:
// its row of `period` values, extended by 64); Q divides by `scale` (or multiplies, `Divide`
// false), clamps to [lo, hi] less the zero point, rounds to nearest even and adds it, as ONNX
// Runtime's QuantizeLinear. 64 outputs a step, each from two table registers' lookups rather
// than a gather from the 64 KB table. The step is unrolled and the form a template argument:
// compiled as a loop over 16 outputs, with the form read from memory in it, its vectors went
// through the stack.
template <bool Divide, bool Signed>
TFL_VBMI void product_repeating_vbmi(const float* table, const uint8_t* x, const float* pattern,
                                     size_t period, const ProductQuant& q, uint8_t* y,
                                     size_t n) {
  FloatPlanes p;
  make_planes(table, &p);
  const __m512 s = _mm512_set1_ps(q.scale);
  const __m512 lo = _mm512_set1_ps(static_cast<float>(q.lo - q.zp));
  const __m512 hi = _mm512_set1_ps(static_cast<float>(q.hi - q.zp));
  const __m512i zp = _mm512_set1_epi32(q.zp);
  // packing 4 x 16 words leaves each 128-bit lane with 4 of each vector: this puts them back
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  size_t r = 0;  // i % period
  for (size_t i = 0; i < n; i += 64) {
    const __mmask64 in = first_bytes(n - i);
    __m512i v[4], b[4];
    lookup64(p, _mm512_maskz_loadu_epi8(in, x + i), v);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(v[k]), _mm512_loadu_ps(pattern + r + 16 * k));
      f = Divide ? _mm512_div_ps(f, s) : _mm512_mul_ps(f, s);
      f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
      b[k] = _mm512_add_epi32(_mm512_cvtps_epi32(f), zp);  // nearest even (MXCSR)
    }
    // each value is in the output type's range already: the saturating packs keep it, and one
    // 64-byte store takes the place of four masked 16-byte ones
    const __m512i w01 = _mm512_packs_epi32(b[0], b[1]), w23 = _mm512_packs_epi32(b[2], b[3]);
    const __m512i bytes = Signed ? _mm512_packs_epi16(w01, w23) : _mm512_packus_epi16(w01, w23);
    _mm512_mask_storeu_epi8(y + i, in, _mm512_permutexvar_epi32(order, bytes));
    for (r += 64; r >= period;) {
      r -= period;
    }
  }
}

// mean_floats (ort_lookup.h) 64 columns at a time, the looked-up floats added in registers.
TFL_VBMI void mean_floats_vbmi(const float* table, const uint8_t* x, size_t rows, size_t cols,
                               size_t stride, MeanOrder order, float* y) {
  FloatPlanes p;
  make_planes(table, &p);
  const __m512 div = _mm512_set1_ps(static_cast<float>(rows));
  for (size_t c = 0; c < cols; c += 64) {
    const __mmask64 in = first_bytes(cols - c);
    __m512 acc[4], group[4];
    __m512i q[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) acc[k] = _mm512_setzero_ps();
    for (size_t r = 0; r < rows;) {
      const size_t size = group_size(order, rows - r);
      for (size_t i = 0; i < size; ++i, ++r) {
        lookup64(p, _mm512_maskz_loadu_epi8(in, x + r * stride + c), q);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m512 v = _mm512_castsi512_ps(q[k]);
          group[k] = i == 0 ? v : _mm512_add_ps(group[k], v);
        }
      }
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[k] = _mm512_add_ps(group[k], acc[k]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __mmask16 out = static_cast<__mmask16>(in >> (16 * k));
      _mm512_mask_storeu_ps(y + c + 16 * k, out, _mm512_div_ps(acc[k], div));
    }
  }
}

// y[j] = table[a[j] * 256 + b[j]]: sixteen pairs at a time, widened to 32-bit offsets, one
// gather of 32-bit words from the 64 KB table keeping each word's low byte (x86 is little
// endian). A word read at offset 65533 and up would pass the table's end: those lanes are
// masked out of the gather and looked up one by one. By ORT's profiler, MobileNetV3's nine
// squeeze-excitation scales in NHWC (batch 8, 1 thread): 0.90 ms against 2.19 ms for the loop.
__attribute__((target("avx512f"))) void lookup_byte_pairs_avx512(const uint8_t* table,
                                                                 const uint8_t* a,
                                                                 const uint8_t* b, uint8_t* y,
                                                                 size_t n) {
  const __m512i last_safe = _mm512_set1_epi32(65536 - 4);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i ia = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m512i ib = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m512i idx = _mm512_or_si512(_mm512_slli_epi32(ia, 8), ib);
    const __mmask16 safe = _mm512_cmple_epi32_mask(idx, last_safe);
    const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), safe, idx, table, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(words));
    for (unsigned rest = static_cast<unsigned>(~safe) & 0xFFFFu; rest; rest &= rest - 1) {
      const unsigned j = static_cast<unsigned>(__builtin_ctz(rest));
      y[i + j] = table[256 * static_cast<size_t>(a[i + j]) + b[i + j]];
    }
  }
  for (; i < n; ++i) {
    y[i] = table[256 * static_cast<size_t>(a[i]) + b[i]];
  }
}

// y[i] = table[256 * a_i + b_i] over n outputs, where one operand runs along (`run`, n bytes)
// and the other repeats with period `period` (`rep`: its byte i % period), the high byte of the
// index where `rep_high`: sixteen at a time, the repeated bytes read from a copy of its row
// extended by 16 so that any 16 in a row are contiguous.
__attribute__((target("avx512f"))) void lookup_byte_pairs_repeating_avx512(
    const uint8_t* table, const uint8_t* run, const uint8_t* pattern, size_t period,
    bool rep_high, uint8_t* y, size_t n) {
  const __m512i last_safe = _mm512_set1_epi32(65536 - 4);
  const int hi_shift = 8;
  size_t i = 0, r = 0;  // r = i % period
  for (; i + 16 <= n; i += 16) {
    const __m512i x =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(run + i)));
    const __m512i p =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pattern + r)));
    const __m512i idx = rep_high ? _mm512_or_si512(_mm512_slli_epi32(p, hi_shift), x)
                                 : _mm512_or_si512(_mm512_slli_epi32(x, hi_shift), p);
    const __mmask16 safe = _mm512_cmple_epi32_mask(idx, last_safe);
    const __m512i words =
        _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), safe, idx, table, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(words));
    for (unsigned rest = static_cast<unsigned>(~safe) & 0xFFFFu; rest; rest &= rest - 1) {
      const unsigned j = static_cast<unsigned>(__builtin_ctz(rest));
      const size_t hi = rep_high ? pattern[r + j] : run[i + j];
      const size_t lo = rep_high ? run[i + j] : pattern[r + j];
      y[i + j] = table[256 * hi + lo];
    }
    for (r += 16; r >= period;) {  // no division: one subtraction from 16 channels up
      r -= period;
    }
  }
  for (; i < n; ++i, r = r + 1 == period ? 0 : r + 1) {
    const size_t hi = rep_high ? pattern[r] : run[i];
    const size_t lo = rep_high ? run[i] : pattern[r];
    y[i] = table[256 * hi + lo];
  }
}

bool have_avx512f() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return have;
}

bool have_vbmi() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("bmi2");
  }();
  return have;
}

bool have_avx512bw() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2");
  }();
  return have;
}

// A clamp (clamp_of) as VPMAXUB / VPMINUB (or their signed forms) over 64 bytes at a time, the
// tail masked. Each block is loaded before it is stored: x may be y.
template <bool Signed>
__attribute__((target("avx512f,avx512bw"))) inline __m512i clamp64(__m512i v, __m512i low,
                                                                  __m512i high) {
  return Signed ? _mm512_min_epi8(_mm512_max_epi8(v, low), high)
                : _mm512_min_epu8(_mm512_max_epu8(v, low), high);
}

template <bool Signed>
__attribute__((target("avx512f,avx512bw,bmi2"))) void clamp_avx512(uint8_t lo, uint8_t hi,
                                                                   const uint8_t* x, uint8_t* y,
                                                                   size_t n) {
  const __m512i low = _mm512_set1_epi8(static_cast<char>(lo));
  const __m512i high = _mm512_set1_epi8(static_cast<char>(hi));
  const auto clamp = [&](__m512i v) __attribute__((target("avx512f,avx512bw"))) {
    return clamp64<Signed>(v, low, high);
  };
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {  // four blocks in flight
    const __m512i a = _mm512_loadu_si512(x + i), b = _mm512_loadu_si512(x + i + 64);
    const __m512i c = _mm512_loadu_si512(x + i + 128), d = _mm512_loadu_si512(x + i + 192);
    _mm512_storeu_si512(y + i, clamp(a));
    _mm512_storeu_si512(y + i + 64, clamp(b));
    _mm512_storeu_si512(y + i + 128, clamp(c));
    _mm512_storeu_si512(y + i + 192, clamp(d));
  }
  for (; i + 64 <= n; i += 64) {
    _mm512_storeu_si512(y + i, clamp(_mm512_loadu_si512(x + i)));
  }
  if (i < n) {
    const __mmask64 tail = _bzhi_u64(~0ULL, static_cast<unsigned>(n - i));
    _mm512_mask_storeu_epi8(y + i, tail, clamp(_mm512_maskz_loadu_epi8(tail, x + i)));
  }
}

// AVX2 forms, for x86 CPUs without AVX512-VBMI (Haswell to Zen 3; `scripts/cpu_kind.py`
// emulates one on an AVX-512 host). The portable loops they replace made the lookups slower
// than ONNX Runtime's own float ops there: MobileNetV3-Small's session at batch 1 took 4.35 ms
// with its 42 lookups and 4.17 ms without (bench_sim's breakdown, emulated AVX2).
#define TFL_AVX2 __attribute__((target("avx2")))

bool have_avx2() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return have;
}

// 32 bytes looked up in a 256-byte table held as 16 rows of 16 (each in both 128-bit lanes):
// at step k the index less 16k is 0..15 in the lanes of row k, and adding 0x70 with unsigned
// saturation keeps those below 0x80 (VPSHUFB reads their low nibble) and takes every other lane
// to 0x80 or above (VPSHUFB writes 0 there), so OR-ing the 16 answers leaves each lane's own.
TFL_AVX2 inline __m256i lookup32_avx2(const __m256i (&rows)[16], __m256i idx) {
  const __m256i step = _mm256_set1_epi8(16), bias = _mm256_set1_epi8(0x70);
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) {
    acc = _mm256_or_si256(acc, _mm256_shuffle_epi8(rows[k], _mm256_adds_epu8(idx, bias)));
    idx = _mm256_sub_epi8(idx, step);
  }
  return acc;
}

TFL_AVX2 void lookup_avx2(const uint8_t* table, const uint8_t* x, uint8_t* y, size_t n) {
  __m256i rows[16];
  for (int k = 0; k < 16; ++k) {
    rows[k] = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(table + 16 * k)));
  }
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {  // each block loaded before it is stored: x may be y
    const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), lookup32_avx2(rows, idx));
  }
  if (i < n) {  // the tail through a zeroed block of 32
    alignas(32) uint8_t block[32] = {};
    std::memcpy(block, x + i, n - i);
    const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(block));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block), lookup32_avx2(rows, idx));
    std::memcpy(y + i, block, n - i);
  }
}

template <bool Signed>
TFL_AVX2 void clamp_avx2(uint8_t lo, uint8_t hi, const uint8_t* x, uint8_t* y, size_t n) {
  const __m256i low = _mm256_set1_epi8(static_cast<char>(lo));
  const __m256i high = _mm256_set1_epi8(static_cast<char>(hi));
  const auto clamp = [&](__m256i v) TFL_AVX2 {
    return Signed ? _mm256_min_epi8(_mm256_max_epi8(v, low), high)
                  : _mm256_min_epu8(_mm256_max_epu8(v, low), high);
  };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), clamp(v));
  }
  if (i < n) {
    alignas(32) uint8_t block[32] = {};
    std::memcpy(block, x + i, n - i);
    _mm256_store_si256(reinterpret_cast<__m256i*>(block),
                       clamp(_mm256_load_si256(reinterpret_cast<const __m256i*>(block))));
    std::memcpy(y + i, block, n - i);
  }
}

// 8 floats of a 256-float table at the 8 bytes from x: each loaded on its own and put in its
// lane. On Zen 3 AVX2's gather of the 8 took about twice as long (a mean over 196 rows of 240
// bytes, by hand: 21.9 against 12.3 us; and gathers are slow on Intel's cores since their
// microcode's Downfall fix): MobileNetV3-Small's nine squeeze-excitation means and products at
// batch 8 (ORT's profiler, 1 thread) are docs/compile.md's figures.
TFL_AVX2 inline __m256 floats8_avx2(const float* table, const uint8_t* x) {
  uint64_t b;
  std::memcpy(&b, x, sizeof b);
  const auto at = [&](int byte) TFL_AVX2 { return _mm_load_ss(table + ((b >> (8 * byte)) & 255)); };
  __m128 lo = at(0), hi = at(4);
  lo = _mm_insert_ps(lo, at(1), 0x10);
  hi = _mm_insert_ps(hi, at(5), 0x10);
  lo = _mm_insert_ps(lo, at(2), 0x20);
  hi = _mm_insert_ps(hi, at(6), 0x20);
  lo = _mm_insert_ps(lo, at(3), 0x30);
  hi = _mm_insert_ps(hi, at(7), 0x30);
  return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

// The whole 8s of lookup_floats; returns how many it did (the rest: the caller's loop).
TFL_AVX2 size_t lookup_floats_avx2(const float* table, const uint8_t* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, floats8_avx2(table, x + i));
  }
  return i;
}

// The whole 8s of mean_floats' columns, added in `order` as the plain loop adds them; returns
// how many columns it did.
TFL_AVX2 size_t mean_floats_avx2(const float* table, const uint8_t* x, size_t rows, size_t cols,
                                 size_t stride, MeanOrder order, float* y) {
  const __m256 div = _mm256_set1_ps(static_cast<float>(rows));
  size_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (size_t r = 0; r < rows;) {
      const size_t size = group_size(order, rows - r);
      __m256 group = floats8_avx2(table, x + r * stride + k);
      for (size_t i = 1; i < size; ++i) {
        group = _mm256_add_ps(group, floats8_avx2(table, x + (r + i) * stride + k));
      }
      acc = _mm256_add_ps(group, acc);
      r += size;
    }
    _mm256_storeu_ps(y + k, _mm256_div_ps(acc, div));
  }
  return k;
}

// product_repeating_vbmi's arithmetic (a product pair over NHWC pixels) 32 outputs a step: the
// running operand's floats, times the repeated operand's floats, then QuantizeLinear's steps in
// its order. The running floats are gathered from its table, or, where the table is a
// DequantizeLinear (`Affine`, `dq`), computed as it was: on Zen 3 the four gathers a step were
// most of the time (perf). By ORT's profiler (MobileNetV3-Small, batch 1, 1 thread, a 2-vCPU
// Zen 3 EPYC, 200 interleaved runs), its nine product pairs took 215 us against 246: the first,
// 16 channels over 56x56 pixels of a Relu's bytes, is the one whose operand is a dequantize (the
// others' are a hardswish's).
template <bool Divide, bool Signed, bool Affine>
TFL_AVX2 void product_repeating_avx2(const float* table, const Dequant& dq, const uint8_t* x,
                                     const float* pattern, size_t period, const ProductQuant& q,
                                     uint8_t* y, size_t n) {
  const __m256 s = _mm256_set1_ps(q.scale);
  const __m256 lo = _mm256_set1_ps(static_cast<float>(q.lo - q.zp));
  const __m256 hi = _mm256_set1_ps(static_cast<float>(q.hi - q.zp));
  const __m256i zp = _mm256_set1_epi32(q.zp);
  const __m256i x_zp = _mm256_set1_epi32(dq.zp);
  const __m256 x_scale = _mm256_set1_ps(dq.scale);
  // two packs leave dword j of each 128-bit lane from vector j: this puts vector order back
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const auto floats8 = [&](const uint8_t* in) TFL_AVX2 {
    if constexpr (Affine) {
      int64_t bytes;
      std::memcpy(&bytes, in, sizeof bytes);
      const __m128i b = _mm_cvtsi64_si128(bytes);
      const __m256i v = dq.signed_bytes ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
      return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, x_zp)), x_scale);
    } else {
      return floats8_avx2(table, in);
    }
  };
  size_t r = 0;  // i % period
  for (size_t i = 0; i < n; i += 32) {
    const size_t count = std::min<size_t>(32, n - i);
    alignas(32) uint8_t tail[32] = {};  // the tail's missing bytes read entry 0: not stored
    const uint8_t* in = x + i;
    if (count < 32) {
      std::memcpy(tail, in, count);
      in = tail;
    }
    __m256i b[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m256 f = _mm256_mul_ps(floats8(in + 8 * k), _mm256_loadu_ps(pattern + r + 8 * k));
      f = Divide ? _mm256_div_ps(f, s) : _mm256_mul_ps(f, s);
      f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
      b[k] = _mm256_add_epi32(_mm256_cvtps_epi32(f), zp);  // nearest even (MXCSR)
    }
    const __m256i w01 = _mm256_packs_epi32(b[0], b[1]), w23 = _mm256_packs_epi32(b[2], b[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        Signed ? _mm256_packs_epi16(w01, w23) : _mm256_packus_epi16(w01, w23), order);
    if (count == 32) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), bytes);
    } else {
      alignas(32) uint8_t out[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(out), bytes);
      std::memcpy(y + i, out, count);
    }
    for (r += 32; r >= period;) {
      r -= period;
    }
  }
}
#endif

// The plain clamp: each byte read before it is written (x may be y).
template <bool Signed>
void clamp_portable(uint8_t lo, uint8_t hi, const uint8_t* x, uint8_t* y, size_t n) {
  using T = std::conditional_t<Signed, int8_t, uint8_t>;
  const T low = static_cast<T>(lo), high = static_cast<T>(hi);
  for (size_t i = 0; i < n; ++i) {
    const T v = static_cast<T>(x[i]);
    y[i] = static_cast<uint8_t>(v < low ? low : v > high ? high : v);
  }
}

#if defined(__aarch64__)
// NEON (every aarch64 CPU, the boards' among them): TBL looks up 16 bytes at a time in a 64-byte
// quarter of the table, and TBX each further quarter with the index moved down by 64 (an index
// outside a quarter leaves the byte as it was).
void lookup_neon(const uint8_t* table, const uint8_t* x, uint8_t* y, size_t n) {
  const uint8x16x4_t t0 = vld1q_u8_x4(table), t1 = vld1q_u8_x4(table + 64);
  const uint8x16x4_t t2 = vld1q_u8_x4(table + 128), t3 = vld1q_u8_x4(table + 192);
  const uint8x16_t quarter = vdupq_n_u8(64);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint8x16_t idx = vld1q_u8(x + i);
    uint8x16_t r = vqtbl4q_u8(t0, idx);
    idx = vsubq_u8(idx, quarter);
    r = vqtbx4q_u8(r, t1, idx);
    idx = vsubq_u8(idx, quarter);
    r = vqtbx4q_u8(r, t2, idx);
    idx = vsubq_u8(idx, quarter);
    r = vqtbx4q_u8(r, t3, idx);
    vst1q_u8(y + i, r);
  }
  lookup_portable(table, x + i, y + i, n - i);
}

// A clamp (clamp_of) as UMAX / UMIN (or SMAX / SMIN) over 16 bytes at a time; x may be y.
template <bool Signed>
void clamp_neon(uint8_t lo, uint8_t hi, const uint8_t* x, uint8_t* y, size_t n) {
  size_t i = 0;
  if (Signed) {
    const int8x16_t low = vdupq_n_s8(static_cast<int8_t>(lo));
    const int8x16_t high = vdupq_n_s8(static_cast<int8_t>(hi));
    for (; i + 16 <= n; i += 16) {
      const int8x16_t v = vreinterpretq_s8_u8(vld1q_u8(x + i));
      vst1q_u8(y + i, vreinterpretq_u8_s8(vminq_s8(vmaxq_s8(v, low), high)));
    }
  } else {
    const uint8x16_t low = vdupq_n_u8(lo), high = vdupq_n_u8(hi);
    for (; i + 16 <= n; i += 16) {
      vst1q_u8(y + i, vminq_u8(vmaxq_u8(vld1q_u8(x + i), low), high));
    }
  }
  clamp_portable<Signed>(lo, hi, x + i, y + i, n - i);
}
#endif

void lookup_byte_pairs(const uint8_t* table, const uint8_t* a, const uint8_t* b, uint8_t* y,
                       size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (have_avx512f()) {
    lookup_byte_pairs_avx512(table, a, b, y, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) {
    y[i] = table[256 * static_cast<size_t>(a[i]) + b[i]];
  }
}

void lookup_byte_pairs_repeating(const uint8_t* table, const uint8_t* run, const uint8_t* rep,
                                 size_t period, bool rep_high, uint8_t* y, size_t n) {
  // the repeated row, extended by 16 bytes (its start again) for the vector form's loads
  thread_local std::vector<uint8_t> pattern;
  pattern.resize(period + 16);
  std::memcpy(pattern.data(), rep, period);
  for (size_t k = period; k < period + 16; ++k) {
    pattern[k] = pattern[k - period];
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (have_avx512f()) {
    lookup_byte_pairs_repeating_avx512(table, run, pattern.data(), period, rep_high, y, n);
    return;
  }
#endif
  for (size_t i = 0, r = 0; i < n; ++i, r = r + 1 == period ? 0 : r + 1) {
    const size_t hi = rep_high ? pattern[r] : run[i];
    const size_t lo = rep_high ? run[i] : pattern[r];
    y[i] = table[256 * hi + lo];
  }
}

// Whether the product kernel here is the AVX2 form, the one that computes a dequantize operand
// (product_repeating_avx2): elsewhere the operands' tables are not checked at all.
bool computes_dequant() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return !have_vbmi() && have_avx2();
#else
  return false;
#endif
}

// Runs of the product kernel that computed the running operand's floats (affine_table), for
// tests (torch_fl._C._affine_products).
std::atomic<uint64_t> g_affine_product_runs{0};

bool product_pairs_repeating(const Product& p, const uint8_t* run, const uint8_t* rep,
                             size_t period, bool rep_is_a, uint8_t* y, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const bool vbmi = have_vbmi();
  if (!vbmi && !have_avx2()) {
    return false;
  }
  // the repeated operand's floats, its row extended by 64 for the 64-wide steps
  const float* rep_table = rep_is_a ? p.a_floats : p.b_floats;
  thread_local std::vector<float> pattern;
  pattern.resize(period + 64);
  for (size_t k = 0; k < period; ++k) {
    pattern[k] = rep_table[rep[k]];
  }
  for (size_t k = period; k < period + 64; ++k) {
    pattern[k] = pattern[k - period];
  }
  const ProductQuant& q = p.quant;  // lo < 0: an int8 output
  const float* run_table = rep_is_a ? p.b_floats : p.a_floats;
  if (vbmi) {
    const auto kernel = q.lo < 0 ? (q.divide ? product_repeating_vbmi<true, true>
                                             : product_repeating_vbmi<false, true>)
                                 : (q.divide ? product_repeating_vbmi<true, false>
                                             : product_repeating_vbmi<false, false>);
    kernel(run_table, run, pattern.data(), period, q, y, n);
    return true;
  }
  const bool affine = rep_is_a ? p.b_affine : p.a_affine;
  const Dequant& dq = rep_is_a ? p.b_dq : p.a_dq;
  if (affine) {
    g_affine_product_runs.fetch_add(1, std::memory_order_relaxed);
  }
  using Kernel = void (*)(const float*, const Dequant&, const uint8_t*, const float*, size_t,
                          const ProductQuant&, uint8_t*, size_t);
  // [affine][int8 output][divide]
  static constexpr Kernel kKernels[2][2][2] = {
      {{product_repeating_avx2<false, false, false>, product_repeating_avx2<true, false, false>},
       {product_repeating_avx2<false, true, false>, product_repeating_avx2<true, true, false>}},
      {{product_repeating_avx2<false, false, true>, product_repeating_avx2<true, false, true>},
       {product_repeating_avx2<false, true, true>, product_repeating_avx2<true, true, true>}}};
  kKernels[affine][q.lo < 0][q.divide](run_table, dq, run, pattern.data(), period, q, y, n);
  return true;
#else
  (void)p, (void)run, (void)rep, (void)period, (void)rep_is_a, (void)y, (void)n;
  return false;  // the table's lookup runs it
#endif
}

void mean_floats_portable(const float* table, const uint8_t* x, size_t rows, size_t cols,
                          size_t stride, MeanOrder order, float* y) {
  const float div = static_cast<float>(rows);
  for (size_t k = 0; k < cols; ++k) {
    float acc = 0.0f;
    for (size_t r = 0; r < rows;) {
      const size_t size = group_size(order, rows - r);
      float group = table[x[r * stride + k]];
      for (size_t i = 1; i < size; ++i) {
        group += table[x[(r + i) * stride + k]];
      }
      acc = group + acc;
      r += size;
    }
    y[k] = acc / div;
  }
}

void lookup_floats_portable(const float* table, const uint8_t* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {  // four independent loads in flight
    const float a = table[x[i]], b = table[x[i + 1]], c = table[x[i + 2]], d = table[x[i + 3]];
    y[i] = a, y[i + 1] = b, y[i + 2] = c, y[i + 3] = d;
  }
  for (; i < n; ++i) {
    y[i] = table[x[i]];
  }
}

namespace {

using namespace torch_fl::ort;

// Byte lookups run with their output over their input (ONNX Runtime's planner granted
// in_place_op), for tests (torch_fl._C._lookups_in_place).
std::atomic<uint64_t> g_in_place_runs{0};

// The least outputs of a piece (ort_kernel.h, Pieces): handing one to another thread costs about
// 2 us here. Tuned on MobileNetV3's sim session at batch 1 (2-vCPU EPYC, in one process, blocks
// of ten runs in turns): with 16384 / 4096 (and ort_mean.cpp's 8192) its 2-thread run took 0.836
// against 0.898 ms with the earlier 131072 / 16384 (and a mean on one thread); on 1 thread each
// change alone came within 0.004 ms of 1.156 (one thread runs the pieces in turn). Its tensors
// at batch 1 are 14 000 to 150 000 elements: the earlier bounds kept most of them on one thread.
constexpr int64_t kMinBytePiece = 16384;  // byte lookups: ~45 GB/s, 16 KB is ~0.4 us
constexpr int64_t kMinPiece = 4096;       // float results and pairs: 5-10x slower per output

bool is_byte_type(int type) {
  return type == kUint8 || type == kInt8;
}

// The ONNX (numpy) broadcast of a and b, coalesced: adjacent dims merge while each operand
// either spans both or is broadcast over both, so that a per-channel scale over a feature map
// ([N,C,1,1] x [N,C,H,W]) is N*C rows of H*W. Strides are in elements, 0 where broadcast.
struct Broadcast {
  std::vector<int64_t> out_dims;   // the full output shape
  std::vector<int64_t> extent;     // coalesced loop extents
  std::vector<int64_t> stride_a;
  std::vector<int64_t> stride_b;
};

bool broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b, Broadcast* out) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> da(rank, 1), db(rank, 1);
  std::copy(a.begin(), a.end(), da.begin() + (rank - a.size()));
  std::copy(b.begin(), b.end(), db.begin() + (rank - b.size()));
  out->out_dims.assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    if (da[i] != db[i] && da[i] != 1 && db[i] != 1) {
      return false;
    }
    out->out_dims[i] = da[i] == 1 ? db[i] : da[i];
  }
  // walk from the innermost dim, merging while the broadcast pattern stays the same
  std::vector<int64_t> ext, sa, sb;
  int64_t step_a = 1, step_b = 1;
  int prev = -1;
  for (size_t k = rank; k-- > 0;) {
    const int64_t n = out->out_dims[k];
    if (n == 1) {
      continue;
    }
    const bool full_a = da[k] != 1, full_b = db[k] != 1;
    const int pattern = (full_a ? 1 : 0) | (full_b ? 2 : 0);
    if (pattern == prev) {
      ext.back() *= n;
    } else {
      ext.push_back(n);
      sa.push_back(full_a ? step_a : 0);
      sb.push_back(full_b ? step_b : 0);
      prev = pattern;
    }
    if (full_a) step_a *= n;
    if (full_b) step_b *= n;
  }
  if (ext.empty()) {
    ext.push_back(1), sa.push_back(0), sb.push_back(0);
  }
  std::reverse(ext.begin(), ext.end());
  std::reverse(sa.begin(), sa.end());
  std::reverse(sb.begin(), sb.end());
  out->extent = ext, out->stride_a = sa, out->stride_b = sb;
  return true;
}

// Rows [row_begin, row_end) of the broadcast walk (a row: `inner` outputs along the last
// coalesced dim), columns [j0, j1) of each: one piece of the work (run_pieces below).
void lookup_pairs(const uint8_t* table, const uint8_t* a, const uint8_t* b, uint8_t* out,
                  const Broadcast& bc, int64_t row_begin, int64_t row_end, int64_t j0,
                  int64_t j1, const Product* product) {
  const size_t rank = bc.extent.size();
  const int64_t inner = bc.extent[rank - 1];
  const int64_t ia = bc.stride_a[rank - 1], ib = bc.stride_b[rank - 1];
  const int64_t n = j1 - j0;
  // the outer index of the first row (mixed radix over the outer extents), then an odometer
  std::vector<int64_t> index(rank, 0);
  int64_t oa = 0, ob = 0;
  for (size_t k = rank - 1, r = static_cast<size_t>(row_begin); k-- > 0;) {
    index[k] = static_cast<int64_t>(r % static_cast<size_t>(bc.extent[k]));
    r /= static_cast<size_t>(bc.extent[k]);
    oa += index[k] * bc.stride_a[k];
    ob += index[k] * bc.stride_b[k];
  }
  uint8_t* y = out + row_begin * inner + j0;
  // advance the outer index one row, keeping the operands' offsets in step
  const auto next_row = [&] {
    for (size_t k = rank - 1; k-- > 0;) {
      ++index[k];
      oa += bc.stride_a[k];
      ob += bc.stride_b[k];
      if (index[k] < bc.extent[k]) {
        break;
      }
      oa -= bc.stride_a[k] * bc.extent[k];
      ob -= bc.stride_b[k] * bc.extent[k];
      index[k] = 0;
    }
  };
  // A per-channel operand over NHWC pixels: both run along whole rows, one of them the same row
  // again for each row of an image (stride 0 on the row axis) while the other continues where
  // the last row ended. The rows of such a run are one long lookup (lookup_byte_pairs_repeating)
  // rather than a call and a gather or two per row: MobileNetV3's first squeeze-excitation
  // scale, 16 channels over 56 x 56 pixels, is 3136 rows of 16.
  if (rank >= 2 && ia == 1 && ib == 1 && j0 == 0 && j1 == inner) {
    const int64_t ra = bc.stride_a[rank - 2], rb = bc.stride_b[rank - 2];
    const bool a_repeats = ra == 0 && rb == inner, b_repeats = rb == 0 && ra == inner;
    if (a_repeats || b_repeats) {
      for (int64_t row = row_begin; row < row_end;) {
        // the rows left before the row index wraps (a new image: the repeated row changes)
        const int64_t run =
            std::min(row_end - row, bc.extent[rank - 2] - index[rank - 2]);
        const size_t count = static_cast<size_t>(run * inner);
        const uint8_t* running = a_repeats ? b + ob : a + oa;
        const uint8_t* repeated = a_repeats ? a + oa : b + ob;
        if (product == nullptr || !product_pairs_repeating(*product, running, repeated,
                                                           static_cast<size_t>(inner), a_repeats,
                                                           y, count)) {
          lookup_byte_pairs_repeating(table, running, repeated, static_cast<size_t>(inner),
                                      a_repeats, y, count);
        }
        y += run * inner;
        row += run;
        // on by the run's rows: to its last row (within the row axis), then one step that carries
        index[rank - 2] += run - 1;
        oa += (run - 1) * ra;
        ob += (run - 1) * rb;
        next_row();
      }
      return;
    }
  }
  for (int64_t row = row_begin; row < row_end; ++row, y += inner) {
    const uint8_t* pa = a + oa + j0 * ia;
    const uint8_t* pb = b + ob + j0 * ib;
    if (ia == 0 && ib == 1) {  // one row of the table for the whole run: a 1-D lookup
      lookup_bytes(table + 256 * static_cast<size_t>(*pa), pb, y, static_cast<size_t>(n));
    } else if (ia == 1 && ib == 0) {
      const uint8_t col = *pb;
      for (int64_t j = 0; j < n; ++j) y[j] = table[256 * static_cast<size_t>(pa[j]) + col];
    } else if (ia == 1 && ib == 1) {  // both run along: a per-channel scale in NHWC
      lookup_byte_pairs(table, pa, pb, y, static_cast<size_t>(n));
    } else {
      for (int64_t j = 0; j < n; ++j) {
        y[j] = table[256 * static_cast<size_t>(pa[j * ia]) + pb[j * ib]];
      }
    }
    next_row();
  }
}


struct OpSpec {
  CustomOp op;  // first: ONNX Runtime passes back &op, which is also &spec
  const char* name;
  int out_type;
  int arity;     // byte inputs after the table: 1 or 2
  bool product;  // Lookup2Mul: the two inputs' float tables and the quantization follow
};

// A Lookup2Mul's inputs 3 to 5: a_floats [256], b_floats [256] and [scale, zero point, divide
// (1) or multiply (0)], checked.
Status* read_product(KernelContext* context, const OpSpec& spec, Product* p) {
  TensorView fa, fb, q;
  TFL_ORT_TRY(read_input(context, 3, &fa, spec.name));
  TFL_ORT_TRY(read_input(context, 4, &fb, spec.name));
  TFL_ORT_TRY(read_input(context, 5, &q, spec.name));
  if (fa.type != kFloat || fa.count != 256 || fb.type != kFloat || fb.count != 256 ||
      q.type != kFloat || q.count != 3) {
    return error(std::string("torch_fl.bpu ") + spec.name +
                 ": inputs 3 to 5 must be 256 floats, 256 floats and 3 floats (scale, zero "
                 "point, divide)");
  }
  const float* qv = static_cast<const float*>(q.data);
  const int lo = spec.out_type == kInt8 ? -128 : 0, hi = spec.out_type == kInt8 ? 127 : 255;
  if (!(qv[0] > 0.0f) || !(qv[1] >= static_cast<float>(lo) && qv[1] <= static_cast<float>(hi)) ||
      qv[1] != static_cast<float>(static_cast<int>(qv[1])) || !(qv[2] == 0.0f || qv[2] == 1.0f)) {
    return error(std::string("torch_fl.bpu ") + spec.name +
                 ": the quantization must be a positive scale, an integer zero point in the "
                 "output type's range and a divide flag of 0 or 1");
  }
  p->a_floats = static_cast<const float*>(fa.data);
  p->b_floats = static_cast<const float*>(fb.data);
  p->quant = ProductQuant{qv[0], qv[2] == 1.0f, static_cast<int>(qv[1]), lo, hi};
  return nullptr;
}

Status* compute(void* kernel, KernelContext* context) {
  const OpSpec& spec = *static_cast<const OpSpec*>(kernel);
  TensorView table, x, z;
  TFL_ORT_TRY(read_input(context, 0, &table, spec.name));
  TFL_ORT_TRY(read_input(context, 1, &x, spec.name));
  const size_t entries = spec.arity == 1 ? 256 : 65536;
  if (table.count != entries) {
    return error(std::string("torch_fl.bpu ") + spec.name + ": the table has " +
                 std::to_string(table.count) + " entries; it needs " + std::to_string(entries) +
                 " (one per input byte" + (spec.arity == 1 ? ")" : " pair)"));
  }
  if (!is_byte_type(x.type)) {
    return error(std::string("torch_fl.bpu ") + spec.name +
                 ": the looked-up input must be uint8 or int8 (ONNX element type " +
                 std::to_string(x.type) + ")");
  }
  const uint8_t* tab = static_cast<const uint8_t*>(table.data);
  void* out = nullptr;
  if (spec.arity == 1) {
    TFL_ORT_TRY(make_output(context, x.dims, &out));
    const uint8_t* in = static_cast<const uint8_t*>(x.data);
    const int64_t count = static_cast<int64_t>(x.count);
    if (count == 0) {
      return nullptr;
    }
    // one row: pieces are 64-aligned slices of it
    const Pieces pieces(count, count, spec.out_type == kFloat ? kMinPiece : kMinBytePiece);
    if (spec.out_type == kFloat) {
      const float* ftab = static_cast<const float*>(table.data);
      float* y = static_cast<float*>(out);
      return run_pieces(context, pieces, [&](int64_t i) {
        int64_t r0, r1, j0, j1;
        pieces.at(i, &r0, &r1, &j0, &j1);
        lookup_floats(ftab, in + j0, y + j0, static_cast<size_t>(j1 - j0));
      });
    }
    uint8_t* y = static_cast<uint8_t*>(out);  // may be x: ONNX Runtime grants in_place_op
    if (in == y) {
      g_in_place_runs.fetch_add(1, std::memory_order_relaxed);
    }
    ByteClamp clamp;
    if (clamp_of(tab, &clamp)) {  // a ReLU's clamp: a max and a min instead of the lookup
      return run_pieces(context, pieces, [&](int64_t i) {
        int64_t r0, r1, j0, j1;
        pieces.at(i, &r0, &r1, &j0, &j1);
        clamp_bytes(clamp, in + j0, y + j0, static_cast<size_t>(j1 - j0));
      });
    }
    return run_pieces(context, pieces, [&](int64_t i) {
      int64_t r0, r1, j0, j1;
      pieces.at(i, &r0, &r1, &j0, &j1);
      lookup_bytes(tab, in + j0, y + j0, static_cast<size_t>(j1 - j0));
    });
  }
  TFL_ORT_TRY(read_input(context, 2, &z, spec.name));
  if (!is_byte_type(z.type)) {
    return error(std::string("torch_fl.bpu ") + spec.name +
                 ": the second looked-up input must be uint8 or int8 (ONNX element type " +
                 std::to_string(z.type) + ")");
  }
  Broadcast bc;
  if (!broadcast(x.dims, z.dims, &bc)) {
    return error(std::string("torch_fl.bpu ") + spec.name + ": inputs of shapes " +
                 shape_text(x.dims) + " and " + shape_text(z.dims) + " do not broadcast");
  }
  TFL_ORT_TRY(make_output(context, bc.out_dims, &out));
  if (x.count == 0 || z.count == 0) {
    return nullptr;
  }
  int64_t total = 1;
  for (int64_t d : bc.out_dims) total *= d;
  Product product{};
  if (spec.product) {
    TFL_ORT_TRY(read_product(context, spec, &product));
    if (computes_dequant()) {  // only the AVX2 product form reads them
      product.a_affine = affine_table(product.a_floats, x.type == kInt8, &product.a_dq);
      product.b_affine = affine_table(product.b_floats, z.type == kInt8, &product.b_dq);
    }
  }
  const Pieces pieces(total, bc.extent.back(), kMinPiece);
  const uint8_t* a = static_cast<const uint8_t*>(x.data);
  const uint8_t* b = static_cast<const uint8_t*>(z.data);
  uint8_t* y = static_cast<uint8_t*>(out);
  return run_pieces(context, pieces, [&](int64_t i) {
    int64_t r0, r1, j0, j1;
    pieces.at(i, &r0, &r1, &j0, &j1);
    lookup_pairs(tab, a, b, y, bc, r0, r1, j0, j1, spec.product ? &product : nullptr);
  });
}

const OpSpec& spec_of(const CustomOp* op) {
  return *reinterpret_cast<const OpSpec*>(op);
}

const char* name(const CustomOp* op) { return spec_of(op).name; }
// input 0 the table (of the output type); the byte inputs any type, checked to be 8-bit when
// run; a Lookup2Mul's float tables and quantization after them
int input_type(const CustomOp* op, size_t index) {
  return index == 0 ? spec_of(op).out_type : index <= 2 ? kUndefined : kFloat;
}
size_t input_count(const CustomOp* op) {
  return 1 + static_cast<size_t>(spec_of(op).arity) + (spec_of(op).product ? 3 : 0);
}
int output_type(const CustomOp* op, size_t) { return spec_of(op).out_type; }

constexpr OpSpec make_spec(const char* op_name, int out_type, int arity, bool product = false) {
  const CustomOp op = custom_op(name, input_type, input_count, output_type, compute);
  // a byte lookup's y is x's size: it may overwrite x (lookup_bytes reads each block first)
  return OpSpec{arity == 1 && out_type != kFloat ? in_place_op(op) : op, op_name, out_type,
                arity, product};
}

OpSpec g_ops[] = {
    make_spec("LookupU8", kUint8, 1),
    make_spec("LookupI8", kInt8, 1),
    make_spec("Lookup2U8", kUint8, 2),
    make_spec("Lookup2I8", kInt8, 2),
    make_spec("Lookup2MulU8", kUint8, 2, true),
    make_spec("Lookup2MulI8", kInt8, 2, true),
    make_spec("LookupF32", kFloat, 1),
};

}  // namespace

std::vector<const CustomOp*> ops() {
  return op_list(g_ops);
}

}  // namespace ort_lookup

void lookup_bytes(const uint8_t* table, const uint8_t* x, uint8_t* y, size_t n, bool portable) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!portable && ort_lookup::have_vbmi()) {
    ort_lookup::lookup_vbmi(table, x, y, n);
    return;
  }
  if (!portable && ort_lookup::have_avx2()) {
    ort_lookup::lookup_avx2(table, x, y, n);
    return;
  }
#elif defined(__aarch64__)
  if (!portable) {
    ort_lookup::lookup_neon(table, x, y, n);
    return;
  }
#endif
  ort_lookup::lookup_portable(table, x, y, n);
}

bool clamp_of(const uint8_t* table, ByteClamp* clamp) {
  // unsigned: the bounds are the results at 0 and 255; then every byte must match
  const uint8_t lo = table[0], hi = table[255];
  bool match = lo <= hi;
  for (int b = 0; match && b < 256; ++b) {
    match = table[b] == std::min<int>(std::max<int>(b, lo), hi);
  }
  if (match) {
    *clamp = ByteClamp{false, lo, hi};
    return true;
  }
  // signed: the bounds are the results at -128 (byte 128) and 127 (byte 127)
  const int slo = static_cast<int8_t>(table[128]), shi = static_cast<int8_t>(table[127]);
  match = slo <= shi;
  for (int b = 0; match && b < 256; ++b) {
    const int v = static_cast<int8_t>(b);
    match = static_cast<int8_t>(table[b]) == std::min(std::max(v, slo), shi);
  }
  if (match) {
    *clamp = ByteClamp{true, table[128], table[127]};
  }
  return match;
}

void clamp_bytes(const ByteClamp& clamp, const uint8_t* x, uint8_t* y, size_t n, bool portable) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!portable && ort_lookup::have_avx512bw()) {
    clamp.is_signed ? ort_lookup::clamp_avx512<true>(clamp.lo, clamp.hi, x, y, n)
                    : ort_lookup::clamp_avx512<false>(clamp.lo, clamp.hi, x, y, n);
    return;
  }
  if (!portable && ort_lookup::have_avx2()) {
    clamp.is_signed ? ort_lookup::clamp_avx2<true>(clamp.lo, clamp.hi, x, y, n)
                    : ort_lookup::clamp_avx2<false>(clamp.lo, clamp.hi, x, y, n);
    return;
  }
#elif defined(__aarch64__)
  if (!portable) {
    clamp.is_signed ? ort_lookup::clamp_neon<true>(clamp.lo, clamp.hi, x, y, n)
                    : ort_lookup::clamp_neon<false>(clamp.lo, clamp.hi, x, y, n);
    return;
  }
#endif
  clamp.is_signed ? ort_lookup::clamp_portable<true>(clamp.lo, clamp.hi, x, y, n)
                  : ort_lookup::clamp_portable<false>(clamp.lo, clamp.hi, x, y, n);
}

void lookup_byte_rows(const uint8_t* table, const uint8_t* x, size_t x_stride, uint8_t* y,
                      size_t y_stride, size_t n, size_t rows, bool portable) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!portable && ort_lookup::have_vbmi()) {
    ort_lookup::lookup_rows_vbmi(table, x, x_stride, y, y_stride, n, rows);
    return;
  }
#endif
  for (size_t r = 0; r < rows; ++r) {
    lookup_bytes(table, x + r * x_stride, y + r * y_stride, n, portable);
  }
}

void lookup_floats(const float* table, const uint8_t* x, float* y, size_t n, bool portable) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!portable && ort_lookup::have_vbmi()) {
    ort_lookup::lookup_floats_vbmi(table, x, y, n);
    return;
  }
  if (!portable && ort_lookup::have_avx2()) {
    const size_t done = ort_lookup::lookup_floats_avx2(table, x, y, n);
    ort_lookup::lookup_floats_portable(table, x + done, y + done, n - done);
    return;
  }
#endif
  ort_lookup::lookup_floats_portable(table, x, y, n);
}

void mean_floats(const float* table, const uint8_t* x, size_t rows, size_t cols, size_t stride,
                 float* y, MeanOrder order, bool portable) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!portable && ort_lookup::have_vbmi()) {
    ort_lookup::mean_floats_vbmi(table, x, rows, cols, stride, order, y);
    return;
  }
  if (!portable && ort_lookup::have_avx2()) {
    const size_t done = ort_lookup::mean_floats_avx2(table, x, rows, cols, stride, order, y);
    ort_lookup::mean_floats_portable(table, x + done, rows, cols - done, stride, order, y + done);
    return;
  }
#endif
  ort_lookup::mean_floats_portable(table, x, rows, cols, stride, order, y);
}

const char* lookup_kernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (ort_lookup::have_vbmi()) return "avx512vbmi";
  if (ort_lookup::have_avx2()) return "avx2";
#elif defined(__aarch64__)
  return "neon";
#endif
  return "portable";
}

uint64_t affine_products() {
  return ort_lookup::g_affine_product_runs.load(std::memory_order_relaxed);
}

bool dequant_of(const float* table, bool signed_bytes, float* scale, int* zp) {
  ort_lookup::Dequant d{};
  if (!ort_lookup::affine_table(table, signed_bytes, &d)) {
    return false;
  }
  *scale = d.scale, *zp = d.zp;
  return true;
}

uint64_t lookups_in_place() {
  return ort_lookup::g_in_place_runs.load(std::memory_order_relaxed);
}

std::vector<const ort::CustomOp*> ort::lookup_ops() {
  return ort_lookup::ops();
}

}  // namespace torch_fl
