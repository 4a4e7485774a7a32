// 8-bit convolution over few input channels (an image stem) for the sim executor's ONNX Runtime
// sessions, bit-equal to ONNX Runtime's own QLinearConv, on AVX512-VNNI's byte dot products (or
// AVX2's 16-bit ones: packed_row_avx2, row_avx2).
//
// ONNX Runtime runs an int8 conv as im2col rows against packed weights. With 3 input channels
// most of each row is padding: MobileNetV3's 3x3 stem from 3 to 16 channels took 226 us at batch
// 1 on 1 thread (ORT's profiler), and the exact float form of it (conversion/narrow_convs.py)
// with the conversions around it 137 us for five of its six nodes (the dequantize not counted).
// Here each input pixel's (up to) 4 channels are one 32-bit word, and `vpdpbusd` multiplies the
// word, broadcast, with 16 output channels' 4 weights and adds the 4 products into each
// channel's int32: one instruction per kernel tap for 16 outputs. The accumulator is
// QLinearConv's own integer, sum((q_x - zp_x) * (q_w - zp_w)) + bias, computed as sum(q_x * w)
// + (bias - zp_x * sum(w)) (padding reads zp_x, as ORT pads), exact in int32 (at most 4 x 255 x
// 128 per tap); then ORT's requantization (ort_requant.h).
//
// Op, in domain "torch_fl.bpu", named by the 8-bit type of x and y:
//   NarrowConv<U8|I8>(x, weights, bias, scale, geometry) -> y
//     x         [N, H, W, C] (layout 0) or [N, C, H, W] (layout 1), uint8 / int8, C <= 4
//     weights   [KH * KW, CO16, 4] int8: w - w_zero_point, tap-major; the output channels
//               padded to CO16 (a multiple of 16), the input channels to 4, with zeros
//     bias      [CO] int32: QLinearConv's bias (0 where it has none)
//     scale     [CO] float: the requantization scale
//     geometry  [15] int64: KH, KW, stride h, w, pads top, left, bottom, right, dilation h, w,
//               x zero point, y zero point, CO, layout, form (0: the fastest form here; 1: the
//               plain loop, for tests that compare the two)
//     y         [N, OH, OW, CO] of x's type (channels last)
// conversion/narrow_op.py writes it where the CPU has AVX512-VNNI or AVX2 (`_narrow_kernel()`).
#include "runtime/ort_narrow.h"

#include "runtime/ort_kernel.h"
#include "runtime/ort_requant.h"

#include <atomic>
#include <cstring>
#include <type_traits>

namespace torch_fl {
namespace ort_narrow {
namespace {

using namespace torch_fl::ort;

constexpr int kLanes = 4;  // input channels in one 32-bit word

struct Geometry {
  int64_t kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, zp_x, zp_y, co, layout, form;
  int64_t n, c, h, w, oh, ow, co16;
};

// The byte an input value becomes in the band: the value itself (uint8), or shifted by 128 into
// uint8 (int8), for vpdpbusd's unsigned operand; the zero point moves with it.
template <class T>
inline uint8_t as_unsigned(T v) {
  return static_cast<uint8_t>(std::is_signed<T>::value ? (static_cast<int>(v) + 128) : v);
}

template <class T>
inline int64_t unsigned_zp(int64_t zp) {
  return std::is_signed<T>::value ? zp + 128 : zp;
}

// `word` with byte `ci` set to v's band byte.
template <class T>
inline uint32_t with_byte(uint32_t word, int64_t ci, T v) {
  const int shift = static_cast<int>(8 * ci);
  return (word & ~(0xFFu << shift)) | (uint32_t{as_unsigned(v)} << shift);
}

#if defined(TFL_X86_AVX512)
// One NCHW input row's first pixels as band words, 16 at a time: each plane's bytes widened to
// 32 bits and shifted into their channel's byte, over `pad` (the zero point in every byte, which
// the channels past C keep); returns how many pixels it did (the rest: the caller's loop). The
// SSE2 byte unpacks this replaced kept the planes in a loop over four lanes: by perf, filling
// the band of MobileNetV3's 3x3 stem took as long as its dot products.
template <class T, int C>
TFL_AVX512 int64_t words_of(const T* const* plane, int64_t w, uint32_t pad, uint32_t* dst) {
  const __m512i flip = _mm512_set1_epi32(std::is_signed<T>::value ? 0x80 : 0);
  // the zero point in the bytes of the channels past C, the real channels' bytes cleared
  const __m512i rest = _mm512_set1_epi32(static_cast<int>(
      C >= kLanes ? 0u : pad & ~((1u << (8 * C)) - 1u)));
  int64_t iw = 0;
  for (; iw + 16 <= w; iw += 16) {
    __m512i word = rest;
#pragma GCC unroll 4
    for (int ci = 0; ci < C; ++ci) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(plane[ci] + iw));
      const __m512i v = _mm512_xor_si512(_mm512_cvtepu8_epi32(bytes), flip);  // int8: + 128
      word = _mm512_or_si512(word, _mm512_slli_epi32(v, 8 * ci));
    }
    _mm512_storeu_si512(dst + iw, word);
  }
  return iw;
}

// words_of in 8 lanes, for the AVX2 form.
template <class T, int C>
TFL_AVX2_FMA int64_t words_of8(const T* const* plane, int64_t w, uint32_t pad, uint32_t* dst) {
  const __m256i flip = _mm256_set1_epi32(std::is_signed<T>::value ? 0x80 : 0);
  const __m256i rest = _mm256_set1_epi32(static_cast<int>(
      C >= kLanes ? 0u : pad & ~((1u << (8 * C)) - 1u)));
  int64_t iw = 0;
  for (; iw + 8 <= w; iw += 8) {
    __m256i word = rest;
#pragma GCC unroll 4
    for (int ci = 0; ci < C; ++ci) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(plane[ci] + iw));
      const __m256i v = _mm256_xor_si256(_mm256_cvtepu8_epi32(bytes), flip);  // int8: + 128
      word = _mm256_or_si256(word, _mm256_slli_epi32(v, 8 * ci));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + iw), word);
  }
  return iw;
}

// The vector form's words of an NCHW row (its first pixels; the rest: the caller's loop).
template <class T>
int64_t words_fast(bool avx512, const T* const* plane, int64_t c, int64_t w, uint32_t pad,
                   uint32_t* dst) {
  switch (c) {
    case 1:
      return avx512 ? words_of<T, 1>(plane, w, pad, dst) : words_of8<T, 1>(plane, w, pad, dst);
    case 2:
      return avx512 ? words_of<T, 2>(plane, w, pad, dst) : words_of8<T, 2>(plane, w, pad, dst);
    case 3:
      return avx512 ? words_of<T, 3>(plane, w, pad, dst) : words_of8<T, 3>(plane, w, pad, dst);
    default:
      return avx512 ? words_of<T, 4>(plane, w, pad, dst) : words_of8<T, 4>(plane, w, pad, dst);
  }
}
#endif

// The form the op's fastest setting (geometry form 0) runs on this CPU: AVX512-VNNI's byte dot
// products, else AVX2's 16-bit ones (vpmaddwd: over packed rows or words), else the plain loop.
enum class Form { kPortable, kAvx2, kVnni };

Form form_here() {
#if defined(TFL_X86_AVX512)
  if (have_vnni()) {
    return Form::kVnni;
  }
  if (have_avx2_fma()) {
    return Form::kAvx2;
  }
#endif
  return Form::kPortable;
}

// Input rows [ih0, ih0 + rows) of batch item `n` as 32-bit words of 4 channel bytes, in a band
// of rows of `wp` = W + pads pixels; padding (and rows outside the input) read the zero point.
// Channels past C read the zero point too (their weights are zero).
template <class T>
void fill_band(const T* x, const Geometry& g, int64_t n, int64_t ih0, int64_t rows,
               [[maybe_unused]] Form form, uint32_t* band) {
  const int64_t wp = g.w + g.pl + g.pr;
  const uint32_t zp = static_cast<uint32_t>(unsigned_zp<T>(g.zp_x));
  const uint32_t pad = zp * 0x01010101u;
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t* out = band + r * wp;
    const int64_t ih = ih0 + r;
    if (ih < 0 || ih >= g.h) {
      std::fill(out, out + wp, pad);
      continue;
    }
    std::fill(out, out + g.pl, pad);
    std::fill(out + g.pl + g.w, out + wp, pad);
    uint32_t* dst = out + g.pl;
    if (g.layout == 0) {  // [N, H, W, C]
      const T* in = x + ((n * g.h + ih) * g.w) * g.c;
      for (int64_t iw = 0; iw < g.w; ++iw) {
        uint32_t word = pad;
        for (int64_t ci = 0; ci < g.c; ++ci) {
          word = with_byte(word, ci, in[iw * g.c + ci]);
        }
        dst[iw] = word;
      }
      continue;
    }
    // [N, C, H, W]: the row of each plane
    const T* plane[kLanes];
    for (int64_t ci = 0; ci < g.c; ++ci) {
      plane[ci] = x + ((n * g.c + ci) * g.h + ih) * g.w;
    }
    int64_t iw = 0;
#if defined(TFL_X86_AVX512)
    if (form != Form::kPortable) {
      iw = words_fast<T>(form == Form::kVnni, plane, g.c, g.w, pad, dst);
    }
#endif
    for (; iw < g.w; ++iw) {
      uint32_t word = pad;
      for (int64_t ci = 0; ci < g.c; ++ci) {
        word = with_byte(word, ci, plane[ci][iw]);
      }
      dst[iw] = word;
    }
  }
}

// One output row from its band (band row 0 is the row of tap 0), the plain loop. `corr` is the
// bias less the zero point's share (above), per output channel.
template <class T>
void row_portable(const uint32_t* band, const int8_t* w, const int32_t* corr,
                  const float* scale, const Geometry& g, T* out) {
  const int64_t wp = g.w + g.pl + g.pr;
  for (int64_t ow = 0; ow < g.ow; ++ow) {
    for (int64_t o = 0; o < g.co; ++o) {
      uint32_t acc = static_cast<uint32_t>(corr[o]);  // int32 arithmetic, wrapping as MLAS's
      for (int64_t i = 0; i < g.kh; ++i) {
        const uint32_t* px = band + (i * g.dh) * wp + ow * g.sw;
        for (int64_t j = 0; j < g.kw; ++j) {
          const uint32_t word = px[j * g.dw];
          const int8_t* wt = w + ((i * g.kw + j) * g.co16 + o) * kLanes;
          for (int k = 0; k < kLanes; ++k) {
            acc += static_cast<uint32_t>(static_cast<int32_t>((word >> (8 * k)) & 0xFF) * wt[k]);
          }
        }
      }
      out[ow * g.co + o] =
          requantize<T>(static_cast<float>(static_cast<int32_t>(acc)), scale[o], g.zp_y);
    }
  }
}

#if defined(TFL_X86_AVX512)
// P output pixels from `ow`, NB blocks of 16 output channels: per tap, each pixel's input word
// broadcast once and each block's weights loaded once (P x NB accumulators).
template <class T, int NB, int SW, int P>
TFL_VNNI inline void tile(const uint32_t* band, int64_t wp, const int8_t* w, const __m512i* corr,
                          const __m512* scale, const Requant<T>& q, const Geometry& g,
                          int64_t ow, T* out) {
  // the geometry read once: byte stores may alias it, and the compiler would reload it after each
  const int64_t sw = SW > 0 ? SW : g.sw, kh = g.kh, kw = g.kw, dh = g.dh, dw = g.dw;
  const int64_t co = g.co, taps_stride = g.co16 * kLanes;
  __m512i acc[P][NB];
#pragma GCC unroll 16
  for (int o = 0; o < P; ++o) {
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) {
      acc[o][b] = corr[b];
    }
  }
  for (int64_t i = 0; i < kh; ++i) {
    const int32_t* row = reinterpret_cast<const int32_t*>(band + (i * dh) * wp + ow * sw);
    for (int64_t j = 0; j < kw; ++j) {
      const int8_t* wt = w + (i * kw + j) * taps_stride;
      __m512i wv[NB];
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) {
        wv[b] = _mm512_loadu_si512(wt + b * 16 * kLanes);
      }
      const int32_t* px = row + j * dw;
#pragma GCC unroll 16
      for (int o = 0; o < P; ++o) {
        const __m512i x = _mm512_set1_epi32(px[o * sw]);
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) {
          acc[o][b] = _mm512_dpbusd_epi32(acc[o][b], x, wv[b]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int o = 0; o < P; ++o) {
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) {
      store16(_mm512_cvtepi32_ps(acc[o][b]), scale[b], q, tail_mask(co - 16 * b),
              out + (ow + o) * co + 16 * b);
    }
  }
}

// One output row: tiles of P pixels, then of P / 2, ... 1.
template <class T, int NB, int SW, int P>
TFL_VNNI void tiles(const uint32_t* band, int64_t wp, const int8_t* w, const __m512i* corr,
                    const __m512* scale, const Requant<T>& q, const Geometry& g, int64_t ow,
                    T* out) {
  const int64_t end = g.ow;
  for (; ow + P <= end; ow += P) {
    tile<T, NB, SW, P>(band, wp, w, corr, scale, q, g, ow, out);
  }
  if constexpr (P > 1) {
    tiles<T, NB, SW, P / 2>(band, wp, w, corr, scale, q, g, ow, out);
  }
}

template <class T, int NB, int SW>
TFL_VNNI void row_vnni(const uint32_t* band, const int8_t* w, const int32_t* corr,
                       const float* scale, const Geometry& g, T* out) {
  __m512i cv[NB];
  __m512 sv[NB];
  for (int b = 0; b < NB; ++b) {
    const __mmask16 m = tail_mask(g.co - 16 * b);
    cv[b] = _mm512_maskz_loadu_epi32(m, corr + 16 * b);
    sv[b] = _mm512_maskz_loadu_ps(m, scale + 16 * b);
  }
  const Requant<T> q(g.zp_y);
  // 8 accumulators for one block, 8 for two, 12 for three and 16 for four, of 32 registers
  // (8 pixels for two blocks measured 4 % slower on a 3 -> 32 stem, 16 for one block 27 %)
  constexpr int P = NB == 1 ? 8 : 4;
  tiles<T, NB, SW, P>(band, g.w + g.pl + g.pr, w, cv, sv, q, g, 0, out);
}

using RowFn = void (*)(const uint32_t*, const int8_t*, const int32_t*, const float*,
                       const Geometry&, void*);

template <class T, int NB, int SW>
void row_entry(const uint32_t* band, const int8_t* w, const int32_t* corr, const float* scale,
               const Geometry& g, void* out) {
  row_vnni<T, NB, SW>(band, w, corr, scale, g, static_cast<T*>(out));
}

// By the block count and the column stride: 1 and 2 (an image stem's) with the stride a
// constant, so that a tile's broadcasts are loads at fixed offsets; any other stride read at run
// time (SW = 0).
template <class T, int SW>
constexpr RowFn kRows[4] = {row_entry<T, 1, SW>, row_entry<T, 2, SW>, row_entry<T, 3, SW>,
                            row_entry<T, 4, SW>};

template <class T>
RowFn pick_row(const Geometry& g) {
  const int64_t block = g.co16 / 16 - 1;
  return g.sw == 1 ? kRows<T, 1>[block] : g.sw == 2 ? kRows<T, 2>[block] : kRows<T, 0>[block];
}

// The AVX2 form, for x86 CPUs without AVX512-VNNI: `vpmaddubsw`'s pairs of byte products would
// saturate in int16 (255 x 128 x 2 > 32767, as ONNX Runtime's own AVX2 u8s8 kernels do), so
// the input word's 4 bytes are widened to 16 bits, repeated across the register (a 32-bit
// broadcast, then a zero-extension of its 16 bytes), and `vpmaddwd` multiplies them with 4
// output channels' 4 weights (w16: the weights sign-extended to 16 bits, as laid out) into two
// exact int32 pair sums a channel. After the taps, a horizontal add joins each channel's two
// sums; the bias correction, added last, gives the same wrapped int32 as the VNNI form.
template <int P>
TFL_AVX2_FMA inline void taps_avx2(const uint32_t* band, int64_t wp, const int16_t* w16,
                                   const Geometry& g, int64_t b, int64_t ow, __m256i (&acc)[P][4]) {
  const int64_t sw = g.sw, taps_stride = g.co16 * kLanes;
  for (int64_t i = 0; i < g.kh; ++i) {
    const uint32_t* row = band + (i * g.dh) * wp + ow * sw;
    for (int64_t j = 0; j < g.kw; ++j) {
      const __m256i* wt =
          reinterpret_cast<const __m256i*>(w16 + (i * g.kw + j) * taps_stride + b * 16 * kLanes);
      const uint32_t* px = row + j * g.dw;
#pragma GCC unroll 4
      for (int o = 0; o < P; ++o) {
        const __m256i x = _mm256_cvtepu8_epi16(_mm_set1_epi32(static_cast<int>(px[o * sw])));
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          acc[o][k] = _mm256_add_epi32(acc[o][k], _mm256_madd_epi16(x, _mm256_loadu_si256(wt + k)));
        }
      }
    }
  }
}

// The 4 registers of a block's pair sums -> its 16 channels' int32s in order, in two registers.
TFL_AVX2_FMA inline void join_pairs(const __m256i (&acc)[4], __m256i* lo, __m256i* hi) {
  // hadd(a, b) per 128-bit lane: a's two channels, then b's; 0xD8 puts the quads in order
  *lo = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[0], acc[1]), 0xD8);
  *hi = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[2], acc[3]), 0xD8);
}

template <class T>
TFL_AVX2_FMA void row_avx2(const uint32_t* band, const int16_t* w16, const int32_t* corr,
                           const float* scale, const Geometry& g, T* out) {
  constexpr int P = 2;  // 8 accumulators, 2 inputs and a weight: 11 of the 16 registers
  const int64_t wp = g.w + g.pl + g.pr, co = g.co;
  const Requant8<T> q(g.zp_y);
  for (int64_t b = 0; b < g.co16 / 16; ++b) {
    const int64_t c0 = 16 * b, left = co - c0;  // this block's channels: left, at most 16
    const __m256i m0 = lanes8(left), m1 = lanes8(left - 8);
    const __m256i c_lo = _mm256_maskload_epi32(corr + c0, m0);
    const __m256i c_hi = _mm256_maskload_epi32(corr + c0 + 8, m1);
    const __m256 s_lo = _mm256_maskload_ps(scale + c0, m0);
    const __m256 s_hi = _mm256_maskload_ps(scale + c0 + 8, m1);
    for (int64_t ow = 0; ow < g.ow;) {
      const int count = g.ow - ow >= P ? P : 1;
      __m256i acc[P][4];
#pragma GCC unroll 4
      for (int o = 0; o < P; ++o) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          acc[o][k] = _mm256_setzero_si256();
        }
      }
      if (count == P) {
        taps_avx2<P>(band, wp, w16, g, b, ow, acc);
      } else {
        taps_avx2<1>(band, wp, w16, g, b, ow, reinterpret_cast<__m256i(&)[1][4]>(acc));
      }
      for (int o = 0; o < count; ++o) {
        __m256i lo, hi;
        join_pairs(acc[o], &lo, &hi);
        T* dst = out + (ow + o) * co + c0;
        const __m256 a_lo = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, c_lo));
        store8(a_lo, s_lo, q, std::min<int64_t>(left, 8), dst);
        if (left > 8) {
          const __m256 a_hi = _mm256_cvtepi32_ps(_mm256_add_epi32(hi, c_hi));
          store8(a_hi, s_hi, q, std::min<int64_t>(left - 8, 8), dst + 8);
        }
      }
      ow += count;
    }
  }
}

// The AVX2 form over packed rows, where the kernel has no column dilation: a kernel row's KW
// pixels of C channels are one run of KW * C values in a row of int16s that holds each pixel's
// C channels and nothing else (`pack_rows`), so `vpmaddwd` takes its pairs from the run itself,
// a pair a broadcast, and multiplies it with 8 output channels' two weights (`pack_weights`: a
// pair past the run's end has weight 0). A 3x3 over 3 channels is 3 runs of 9 values: 15 pairs
// where the word form above multiplies 9 words of 4 (36 products a channel, the fourth a
// padding channel's), and the lanes hold the channels in order (no pair sums to join). Each
// accumulator starts at the bias correction: the same wrapped int32 sum in another order.
// docs/compile.md (*Narrow convolutions on the extension's op*) has its timings.
constexpr int64_t kMaxPackedVectors = 4;  // output channels in vectors of 8: 32 at most

// Output rows the packed form computed, in this process (torch_fl._C._narrow_packed_rows: tests
// check which form a conv took).
std::atomic<uint64_t> g_packed_rows{0};

// Band rows of 4-byte words -> rows of `stride` int16s: each pixel's first C bytes, then zeros.
// Four pixels at a time: their C bytes gathered to the front of 16 (VPSHUFB), widened to 16
// int16s and stored whole; the next store starts at the 4 C-th and overwrites the rest (so a row
// may be written up to kPackSlack int16s past its end before its last zeros). A plain loop over
// the values took as long as the stem's products (MobileNetV3's, by hand).
constexpr int64_t kPackSlack = 16;

TFL_AVX2_FMA inline void pack_rows(const uint32_t* band, int64_t rows, int64_t wp, int64_t c,
                                   int64_t stride, int16_t* packed) {
  alignas(16) int8_t order[16];
  for (int64_t k = 0; k < 16; ++k) {
    order[k] = k < 4 * c ? static_cast<int8_t>((k / c) * 4 + k % c) : int8_t{-128};
  }
  const __m128i gather = _mm_load_si128(reinterpret_cast<const __m128i*>(order));
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* in = band + r * wp;
    int16_t* out = packed + r * stride;
    int64_t iw = 0;
    for (; iw + 4 <= wp; iw += 4) {
      const __m128i words = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + iw));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + iw * c),
                          _mm256_cvtepu8_epi16(_mm_shuffle_epi8(words, gather)));
    }
    for (; iw < wp; ++iw) {
      for (int64_t ci = 0; ci < c; ++ci) {
        out[iw * c + ci] = static_cast<int16_t>((in[iw] >> (8 * ci)) & 0xFF);
      }
    }
    for (int64_t e = wp * c; e < stride; ++e) {
      out[e] = 0;  // read as the partner of a run's last value, whose weight is 0
    }
  }
}

// The weights as pairs of a kernel row's run: [KH][pairs][vectors][8 channels][2] int16.
inline void pack_weights(const int8_t* w, const Geometry& g, int64_t vectors, int16_t* dst) {
  const int64_t run = g.kw * g.c, pairs = (run + 1) / 2;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t p = 0; p < pairs; ++p) {
      for (int64_t v = 0; v < vectors; ++v) {
        for (int64_t lane = 0; lane < 8; ++lane) {
          const int64_t o = 8 * v + lane;
          for (int64_t t = 0; t < 2; ++t) {
            const int64_t e = 2 * p + t, j = e / g.c, ci = e % g.c;
            const bool real = e < run && o < g.co;
            *dst++ = real ? w[((i * g.kw + j) * g.co16 + o) * kLanes + ci] : int16_t{0};
          }
        }
      }
    }
  }
}

// P output pixels from `ow`, V vectors of 8 output channels, from packed rows `rows` (row 0:
// tap row 0; `stride` int16s apart).
template <class T, int V, int P>
TFL_AVX2_FMA inline void packed_tile(const int16_t* rows, int64_t stride, const int16_t* wpk,
                                     const __m256i (&c)[kMaxPackedVectors],
                                     const __m256 (&s)[kMaxPackedVectors], const Requant8<T>& q,
                                     const Geometry& g, int64_t ow, T* out) {
  const int64_t pairs = (g.kw * g.c + 1) / 2, step = g.sw * g.c, co = g.co;
  __m256i acc[P][V];
#pragma GCC unroll 8
  for (int o = 0; o < P; ++o) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[o][v] = c[v];
    }
  }
  for (int64_t i = 0; i < g.kh; ++i) {
    const int16_t* run = rows + (i * g.dh) * stride + ow * step;
    const __m256i* wt = reinterpret_cast<const __m256i*>(wpk + i * pairs * V * 16);
    for (int64_t p = 0; p < pairs; ++p) {
#pragma GCC unroll 8
      for (int o = 0; o < P; ++o) {
        int32_t word;
        std::memcpy(&word, run + o * step + 2 * p, sizeof word);
        const __m256i b = _mm256_set1_epi32(word);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) {
          acc[o][v] = _mm256_add_epi32(acc[o][v], _mm256_madd_epi16(b, _mm256_loadu_si256(wt + v)));
        }
      }
      wt += V;
    }
  }
#pragma GCC unroll 8
  for (int o = 0; o < P; ++o) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      store8(_mm256_cvtepi32_ps(acc[o][v]), s[v], q, std::min<int64_t>(co - 8 * v, 8),
             out + (ow + o) * co + 8 * v);
    }
  }
}

// One output row over packed rows, V vectors of output channels: tiles of P pixels, then one
// at a time. P x V accumulators, a broadcast and a weight: 8 + 2 of the 16 registers.
template <class T, int V>
TFL_AVX2_FMA void packed_row_avx2(const int16_t* rows, int64_t stride, const int16_t* wpk,
                                  const int32_t* corr, const float* scale, const Geometry& g,
                                  T* out) {
  constexpr int P = 8 / V;
  const Requant8<T> q(g.zp_y);
  __m256i c[kMaxPackedVectors];
  __m256 s[kMaxPackedVectors];
  for (int v = 0; v < V; ++v) {
    const __m256i m = lanes8(g.co - 8 * v);
    c[v] = _mm256_maskload_epi32(corr + 8 * v, m);
    s[v] = _mm256_maskload_ps(scale + 8 * v, m);
  }
  int64_t ow = 0;
  for (; ow + P <= g.ow; ow += P) {
    packed_tile<T, V, P>(rows, stride, wpk, c, s, q, g, ow, out);
  }
  for (; ow < g.ow; ++ow) {
    packed_tile<T, V, 1>(rows, stride, wpk, c, s, q, g, ow, out);
  }
}

template <class T>
using PackedRow = void (*)(const int16_t*, int64_t, const int16_t*, const int32_t*,
                           const float*, const Geometry&, T*);

template <class T>
PackedRow<T> packed_row_for(int64_t vectors) {
  switch (vectors) {
    case 1:
      return packed_row_avx2<T, 1>;
    case 2:
      return packed_row_avx2<T, 2>;
    case 3:
      return packed_row_avx2<T, 3>;
    default:
      return packed_row_avx2<T, 4>;
  }
}

// The weights sign-extended to 16 bits, in their layout (the AVX2 form's operand).
TFL_AVX2_FMA void widen_weights(const int8_t* w, int64_t count, int16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_cvtepi8_epi16(bytes));
  }
  for (; i < count; ++i) {
    dst[i] = w[i];
  }
}
#endif

// Output channels the fast form handles (four blocks of 16: conversion/narrow_op.py's bound).
constexpr int64_t kMaxOutputs = 64;

// The band of input rows one pass fills, at most (where one output row needs more, that row's
// band): as ort_depthwise.cpp's, one the caches keep while the rows that read it run.
constexpr int64_t kBandBytes = 96 * 1024;

// Output rows [r0, r1) of the N * OH rows, in bands of the input rows they read.
template <class T>
void rows(const T* x, const int8_t* w, const int32_t* corr, const float* scale,
          const Geometry& g, int64_t r0, int64_t r1, T* y) {
  thread_local std::vector<uint32_t> band;
  const int64_t wp = g.w + g.pl + g.pr;
  const Form form = g.form == 0 ? form_here() : Form::kPortable;
#if defined(TFL_X86_AVX512)
  const RowFn vnni_row = form == Form::kVnni ? pick_row<T>(g) : nullptr;
  thread_local std::vector<int16_t> w16, packed;
  // the packed rows where no column dilation splits a kernel row's run; the words elsewhere
  const int64_t vectors = (g.co + 7) / 8;
  const bool pack = form == Form::kAvx2 && g.dw == 1 && vectors <= kMaxPackedVectors;
  const int64_t stride = wp * g.c + 2;  // int16s a packed row, the last run's partner included
  PackedRow<T> packed_row = nullptr;
  if (pack) {
    w16.resize(static_cast<size_t>(g.kh * ((g.kw * g.c + 1) / 2) * vectors * 16));
    pack_weights(w, g, vectors, w16.data());
    packed_row = packed_row_for<T>(vectors);
  } else if (form == Form::kAvx2) {
    const int64_t count = g.kh * g.kw * g.co16 * kLanes;
    w16.resize(static_cast<size_t>(count));
    widen_weights(w, count, w16.data());
  }
#endif
  const int64_t band_rows = kBandBytes / std::max<int64_t>(wp * 4, 1);
  for_each_band(r0, r1, g.oh, g.kh, g.sh, g.dh, g.pt, band_rows, [&](int64_t n, int64_t oh0,
                                                                     int64_t oh1, int64_t ih0,
                                                                     int64_t span) {
    band.resize(static_cast<size_t>(span * wp));
    fill_band(x, g, n, ih0, span, form, band.data());
#if defined(TFL_X86_AVX512)
    if (pack) {
      packed.resize(static_cast<size_t>(span * stride + kPackSlack));
      pack_rows(band.data(), span, wp, g.c, stride, packed.data());
      g_packed_rows.fetch_add(static_cast<uint64_t>(oh1 - oh0), std::memory_order_relaxed);
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        packed_row(packed.data() + (oh - oh0) * g.sh * stride, stride, w16.data(), corr, scale,
                   g, y + ((n * g.oh + oh) * g.ow) * g.co);
      }
      return;
    }
#endif
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const uint32_t* start = band.data() + (oh - oh0) * g.sh * wp;
      T* out = y + ((n * g.oh + oh) * g.ow) * g.co;
#if defined(TFL_X86_AVX512)
      if (form == Form::kVnni) {
        vnni_row(start, w, corr, scale, g, out);
        continue;
      }
      if (form == Form::kAvx2) {
        row_avx2(start, w16.data(), corr, scale, g, out);
        continue;
      }
#endif
      row_portable(start, w, corr, scale, g, out);
    }
  });
}

// Work for one piece, in 4-channel multiply-adds: as ort_depthwise.cpp's bound (chosen, not
// tuned).
constexpr int64_t kMinPieceWork = 1 << 18;


Status* compute(void* kernel, KernelContext* context) {
  const TypedOp& spec = *static_cast<const TypedOp*>(kernel);
  const char* op = spec.name;
  TensorView x, w, bias, scale, geo;
  TFL_ORT_TRY(read_input(context, 0, &x, op));
  TFL_ORT_TRY(read_input(context, 1, &w, op));
  TFL_ORT_TRY(read_input(context, 2, &bias, op));
  TFL_ORT_TRY(read_input(context, 3, &scale, op));
  TFL_ORT_TRY(read_input(context, 4, &geo, op));
  if (geo.type != kInt64 || geo.count != 15) {
    return fail(op, "geometry must be 15 int64 values");
  }
  const int64_t* v = static_cast<const int64_t*>(geo.data);
  Geometry g{v[0], v[1], v[2],  v[3],  v[4],  v[5], v[6], v[7], v[8], v[9], v[10],
             v[11], v[12], v[13], v[14], 0, 0, 0, 0, 0, 0, 0};
  if (x.type != spec.type || x.dims.size() != 4 || g.layout < 0 || g.layout > 1) {
    return fail(op, std::string("x must be a 4-D tensor of ") +
                        (spec.type == kUint8 ? "uint8" : "int8") + " and layout 0 or 1, got " +
                        shape_text(x.dims) + " of ONNX element type " + std::to_string(x.type));
  }
  g.n = x.dims[0];
  g.c = g.layout == 0 ? x.dims[3] : x.dims[1];
  g.h = g.layout == 0 ? x.dims[1] : x.dims[2];
  g.w = g.layout == 0 ? x.dims[2] : x.dims[3];
  const int64_t lo = spec.type == kUint8 ? 0 : -128, hi = spec.type == kUint8 ? 255 : 127;
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.pt < 0 ||
      g.pl < 0 || g.pb < 0 || g.pr < 0 || g.zp_x < lo || g.zp_x > hi || g.zp_y < lo ||
      g.zp_y > hi || g.form < 0 || g.form > 1 || g.co < 1 || g.co > kMaxOutputs) {
    return fail(op, "geometry out of range (kernel, strides and dilations >= 1, pads >= 0, zero "
                    "points in the 8-bit type's range, 1 to 64 outputs, form 0 or 1)");
  }
  if (g.c < 1 || g.c > kLanes) {
    return fail(op, "x must have 1 to 4 channels, got " + shape_text(x.dims));
  }
  if (g.h + g.pt + g.pb < (g.kh - 1) * g.dh + 1 || g.w + g.pl + g.pr < (g.kw - 1) * g.dw + 1) {
    return fail(op, "the padded input " + shape_text(x.dims) + " is smaller than the kernel");
  }
  g.oh = (g.h + g.pt + g.pb - (g.kh - 1) * g.dh - 1) / g.sh + 1;
  g.ow = (g.w + g.pl + g.pr - (g.kw - 1) * g.dw - 1) / g.sw + 1;
  g.co16 = (g.co + 15) / 16 * 16;
  const int64_t taps = g.kh * g.kw;
  if (w.type != kInt8 || w.count != static_cast<size_t>(taps * g.co16 * kLanes)) {
    return fail(op, "weights must be " + std::to_string(taps * g.co16 * kLanes) +
                        " int8 values ([KH * KW, CO16, 4]), got " + std::to_string(w.count));
  }
  if (bias.type != kInt32 || bias.count != static_cast<size_t>(g.co)) {
    return fail(op, "bias must be " + std::to_string(g.co) + " int32 values");
  }
  if (scale.type != kFloat || scale.count != static_cast<size_t>(g.co)) {
    return fail(op, "scale must be " + std::to_string(g.co) + " floats");
  }
  const int8_t* wt = static_cast<const int8_t*>(w.data);
  // bias less zp_x * sum(w) per output channel (int32, wrapping as MLAS's sums); the weights of
  // the padding channels must be zero, as the band holds the zero point there
  const int64_t zp =
      spec.type == kUint8 ? unsigned_zp<uint8_t>(g.zp_x) : unsigned_zp<int8_t>(g.zp_x);
  std::vector<int32_t> corr(static_cast<size_t>(g.co));
  for (int64_t o = 0; o < g.co; ++o) {
    uint32_t sum = 0;
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t k = 0; k < kLanes; ++k) {
        const int8_t value = wt[(t * g.co16 + o) * kLanes + k];
        if (k >= g.c && value != 0) {
          return fail(op, "weights of the padding input channels must be zero");
        }
        sum += static_cast<uint32_t>(static_cast<int32_t>(value));
      }
    }
    const uint32_t b = static_cast<uint32_t>(static_cast<const int32_t*>(bias.data)[o]);
    corr[static_cast<size_t>(o)] = static_cast<int32_t>(b - static_cast<uint32_t>(zp) * sum);
  }
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, {g.n, g.oh, g.ow, g.co}, &out));
  const int64_t total_rows = g.n * g.oh;
  if (total_rows == 0 || g.ow == 0) {
    return nullptr;
  }
  const int64_t row_work = g.ow * g.co16 * taps;
  const float* sf = static_cast<const float*>(scale.data);
  const int32_t* cf = corr.data();
  return run_typed_rows(context, spec.type, x.data, out, total_rows, row_work, kMinPieceWork,
                        [&](auto in, auto y, int64_t r0, int64_t r1) {
                          rows(in, wt, cf, sf, g, r0, r1, y);
                        });
}

int input_type(const CustomOp* op, size_t index) {
  static const int types[] = {kUndefined, kInt8, kInt32, kFloat, kInt64};
  return index == 0 ? typed_op(op).type : types[index];
}
size_t input_count(const CustomOp*) { return 5; }

TypedOp g_ops[] = {
    typed_spec("NarrowConvU8", kUint8, input_type, input_count, compute),
    typed_spec("NarrowConvI8", kInt8, input_type, input_count, compute),
};

}  // namespace
}  // namespace ort_narrow

std::vector<const ort::CustomOp*> ort::narrow_ops() {
  return ort::op_list(ort_narrow::g_ops);
}

uint64_t narrow_packed_rows() {
#if defined(TFL_X86_AVX512)
  return ort_narrow::g_packed_rows.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

const char* narrow_kernel() {
  switch (ort_narrow::form_here()) {
    case ort_narrow::Form::kVnni:
      return "vnni";
    case ort_narrow::Form::kAvx2:
      return "avx2";
    default:
      return "portable";
  }
}

}  // namespace torch_fl
