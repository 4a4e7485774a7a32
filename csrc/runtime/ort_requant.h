// ONNX Runtime's requantization of an 8-bit convolution's accumulator (MLAS's
// MlasRequantizeOutput), as the sim's conv ops write their outputs (ort_depthwise.cpp,
// ort_narrow.cpp): the accumulator, bias included, as a float times the per-channel scale
// (x_scale * w_scale / y_scale, formed so in float32 by torch_fl/bpu/conversion/qlinear_conv.py),
// clamped to the output type's range less the zero point, rounded to nearest even, plus the zero
// point. Both ops are held to ORT's own QLinearConv byte for byte by their tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TFL_X86_AVX512 1
#endif

namespace torch_fl::ort {

// The 8-bit type's range: the output bounds where an op's geometry gives none.
template <class T>
constexpr int64_t type_lo() {
  return std::is_signed<T>::value ? -128 : 0;
}
template <class T>
constexpr int64_t type_hi() {
  return std::is_signed<T>::value ? 127 : 255;
}

// The plain form, one output: `acc` the accumulator (exact in float: see each op). The output
// is clamped to [lo_q, hi_q], a range inside the type's: a clamp that followed the op (a ReLU's
// Max with the zero point, a ReLU6's Clip: conversion/clamp_fold.py) folded into its output
// step. Clamping the rounded byte and clamping the float before rounding to those integer bounds
// less the zero point give the same byte, rounding being monotone.
template <class T>
inline T requantize(float acc, float scale, int64_t zp, int64_t lo_q = type_lo<T>(),
                    int64_t hi_q = type_hi<T>()) {
  const float lo = static_cast<float>(lo_q - zp);
  const float hi = static_cast<float>(hi_q - zp);
  const float r = std::min(std::max(acc * scale, lo), hi);
  return static_cast<T>(static_cast<int>(std::nearbyint(r)) + zp);
}

#if defined(TFL_X86_AVX512)
#define TFL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

// The output type's range less the zero point, and the zero point, as vectors (store16).
template <class T>
struct Requant {
  __m512 lo, hi;
  __m512i zp;
  TFL_AVX512 explicit Requant(int64_t zp_y, int64_t lo_q = type_lo<T>(),
                              int64_t hi_q = type_hi<T>())
      : lo(_mm512_set1_ps(static_cast<float>(lo_q - zp_y))),
        hi(_mm512_set1_ps(static_cast<float>(hi_q - zp_y))),
        zp(_mm512_set1_epi32(static_cast<int>(zp_y))) {}
};

// The accumulators of 16 channels -> 16 output bytes (the lanes of `mask`).
template <class T>
TFL_AVX512 inline void store16(__m512 acc, __m512 scale, const Requant<T>& q, __mmask16 mask,
                               T* out) {
  const __m512 r = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(acc, scale), q.lo), q.hi);
  const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(r), q.zp);  // nearest even (MXCSR)
  _mm_mask_storeu_epi8(out, mask, _mm512_cvtepi32_epi8(v));         // low byte: the 8-bit value
}

// Whether this CPU runs TFL_AVX512 code (ort_depthwise.cpp, ort_maxpool.cpp).
inline bool have_avx512() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return have;
}

// The target of the AVX512-VNNI forms (ort_narrow.cpp, ort_grouped_dot.cpp), and whether this
// CPU runs them.
#define TFL_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx512vnni")))

inline bool have_vnni() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return have;
}

// The AVX2 form (the depthwise op's, for x86 CPUs without AVX-512): 8 channels a vector.
#define TFL_AVX2_FMA __attribute__((target("avx2,fma")))

template <class T>
struct Requant8 {
  __m256 lo, hi;
  __m256i zp;
  TFL_AVX2_FMA explicit Requant8(int64_t zp_y, int64_t lo_q = type_lo<T>(),
                                 int64_t hi_q = type_hi<T>())
      : lo(_mm256_set1_ps(static_cast<float>(lo_q - zp_y))),
        hi(_mm256_set1_ps(static_cast<float>(hi_q - zp_y))),
        zp(_mm256_set1_epi32(static_cast<int>(zp_y))) {}
};

// The accumulators of 8 channels -> the first `left` (at most 8) of their output bytes: store16's
// arithmetic, then the int32s (already in the type's range) narrowed by saturating packs.
template <class T>
TFL_AVX2_FMA inline void store8(__m256 acc, __m256 scale, const Requant8<T>& q, int64_t left,
                                T* out) {
  const __m256 r = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(acc, scale), q.lo), q.hi);
  const __m256i v = _mm256_add_epi32(_mm256_cvtps_epi32(r), q.zp);  // nearest even (MXCSR)
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i b = std::is_signed<T>::value ? _mm_packs_epi16(w, w) : _mm_packus_epi16(w, w);
  if (left >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), b);
  } else {
    alignas(16) uint8_t bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), b);
    std::memcpy(out, bytes, static_cast<size_t>(left));
  }
}

// The lanes of a block of 8 channels that `left` channels fill (none where left <= 0), as a
// vector mask for _mm256_maskload_*.
TFL_AVX2_FMA inline __m256i lanes8(int64_t left) {
  const int n = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 8)));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline bool have_avx2_fma() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return have;
}

// The lanes of a block of 16 channels that `left` channels fill.
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}
#endif

}  // namespace torch_fl::ort
