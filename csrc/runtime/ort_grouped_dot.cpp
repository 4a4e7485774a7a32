// Grouped 8-bit convolution on AVX512-VNNI's byte dot products, for the sim executor's ONNX
// Runtime sessions, bit-equal to ONNX Runtime's own QLinearConv (channels-last).
//
// ONNX Runtime runs a grouped conv as one small GEMM per group; the float form of this
// extension (GroupedConv, ort_depthwise.cpp) beats it where groups are 2 to 8 channels wide, but
// its 16 multiply-adds an instruction lose to ORT's 8-bit dot products once groups are 16 wide
// (RegNetX's, RegNetY-800MF's, ResNeXt's later stages). Here a group's input channels are 32-bit
// words of 4 bytes, and `vpdpbusd` multiplies one word per output lane with that lane's 4
// weights: a kernel tap of a group G channels wide takes G / 4 instructions for 16 outputs. The
// word a lane reads is its group's: where a group's outputs fill whole blocks of 16, every lane
// of a block reads the same word (a broadcast load); where groups of 4 or 8 are as wide as
// their outputs, the block's own 16 input channels hold them (one permute of 4 words). The
// accumulator is QLinearConv's own integer, sum(q_x * (q_w - zp_w)) + corr, corr = bias - zp_x
// * sum(q_w - zp_w) (padding reads zp_x, as ORT pads), in int32 as MLAS's; then ORT's
// requantization (ort_requant.h).
//
// Op, in domain "torch_fl.bpu", named by the 8-bit type of x and y:
//   GroupedDotConv<U8|I8>(x, weights, corr, scale, geometry) -> y
//     x         [N, H, W, CI] uint8 / int8 (channels last), CI = groups x G, G a multiple of 4
//     weights   [CO16 / 16, KH * KW, G / 4, 16, 4] int8: w - w_zero_point, by block of 16
//               output channels (padded with zeros to CO16, a multiple of 16), then tap, then
//               the group's input word, then the block's 16 outputs, then the word's 4 inputs
//     corr      [CO] int32: bias - zp * sum(w - w_zero_point) over the output's taps and inputs
//               (zp: x's zero point, plus 128 for int8 x, whose bytes the op shifts into uint8)
//     scale     [CO] float: the requantization scale
//     geometry  [14] int64: KH, KW, stride h, w, pads top, left, bottom, right, dilation h, w,
//               x zero point, y zero point, G, form (0: the fastest form here; 1: the plain
//               loop, for tests that compare the two); or [16] with the least and greatest
//               output byte before G (a clamp folded into the output step: ort_requant.h,
//               conversion/clamp_fold.py)
//     y         [N, OH, OW, CO] of x's type, CO a multiple of the group count
// conversion/grouped_conv.py writes it where the CPU has AVX512-VNNI (`_narrow_kernel()`).
#include "runtime/ort_kernel.h"
#include "runtime/ort_requant.h"

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace torch_fl {
namespace ort_grouped_dot {
namespace {

using namespace torch_fl::ort;

struct Geometry {
  int64_t kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, zp_x, zp_y, gw, form;
  int64_t lo_q, hi_q;  // the output bytes' range (ort_requant.h)
  int64_t n, h, w, ci, co, co16, oh, ow, ogw;
  int64_t words() const { return gw / 4; }  // a group's input words
  // int8 weights of one block of 16 outputs: a block's weights lie together, so that its taps'
  // vectors do not sit 4 KB apart in the level-1 cache's sets (1024 outputs: a 7x7 conv in
  // groups of 32 ran at a third of its speed over 256 outputs, by hand)
  int64_t block_weights() const { return kh * kw * words() * 64; }
};

// Input rows [ih0, ih0 + rows) of batch item `n` as uint8 (int8 shifted by 128), in a band of
// rows of `wp` = W + pads pixels of CI bytes; padding (and rows outside the input) read the
// zero point.
template <class T>
void fill_band(const T* x, const Geometry& g, int64_t n, int64_t ih0, int64_t rows,
               uint8_t* band) {
  const int64_t wp = g.w + g.pl + g.pr;
  const uint8_t zp = static_cast<uint8_t>(std::is_signed<T>::value ? g.zp_x + 128 : g.zp_x);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* out = band + r * wp * g.ci;
    const int64_t ih = ih0 + r;
    if (ih < 0 || ih >= g.h) {
      std::memset(out, zp, static_cast<size_t>(wp * g.ci));
      continue;
    }
    std::memset(out, zp, static_cast<size_t>(g.pl * g.ci));
    std::memset(out + (g.pl + g.w) * g.ci, zp, static_cast<size_t>(g.pr * g.ci));
    const T* in = x + ((n * g.h + ih) * g.w) * g.ci;
    uint8_t* dst = out + g.pl * g.ci;
    const size_t count = static_cast<size_t>(g.w * g.ci);
    if constexpr (std::is_signed<T>::value) {
      for (size_t i = 0; i < count; ++i) {
        dst[i] = static_cast<uint8_t>(static_cast<uint8_t>(in[i]) ^ 0x80u);  // v + 128
      }
    } else {
      std::memcpy(dst, in, count);
    }
  }
}

// One output row from its band (band row 0 is the row of tap 0), the plain loop.
template <class T>
void row_portable(const uint8_t* band, const int8_t* w, const int32_t* corr, const float* scale,
                  const Geometry& g, T* out) {
  const int64_t wp = g.w + g.pl + g.pr;
  for (int64_t ow = 0; ow < g.ow; ++ow) {
    for (int64_t o = 0; o < g.co; ++o) {
      uint32_t acc = static_cast<uint32_t>(corr[o]);  // int32 arithmetic, wrapping as MLAS's
      const int64_t first = (o / g.ogw) * g.gw;      // the group's first input channel
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          const uint8_t* px = band + ((i * g.dh) * wp + ow * g.sw + j * g.dw) * g.ci + first;
          const int8_t* wt =
              w + (o / 16) * g.block_weights() + (i * g.kw + j) * g.words() * 64 + (o % 16) * 4;
          for (int64_t k = 0; k < g.gw; ++k) {
            const int8_t weight = wt[(k / 4) * 64 + k % 4];
            acc += static_cast<uint32_t>(static_cast<int32_t>(px[k]) * weight);
          }
        }
      }
      out[ow * g.co + o] =
          requantize<T>(static_cast<float>(static_cast<int32_t>(acc)), scale[o], g.zp_y, g.lo_q,
                        g.hi_q);
    }
  }
}

#if defined(TFL_X86_AVX512)
// How a block of 16 outputs finds its lanes' input words (see the top of the file).
enum Reads { kBroadcast = 0, kPermute = 1, kPlain = 2 };

Reads reads(const Geometry& g) {
  if (g.ogw % 16 == 0) {
    return kBroadcast;
  }
  return g.ogw == g.gw && (g.gw == 4 || g.gw == 8) ? kPermute : kPlain;
}



// P output pixels from pixel `p` of the band's output rows (row-major, so a tile may span rows:
// a 7x7 output is six tiles of 8 and one pixel, not seven rows of 4 + 1 + 1 + 1), the 16
// outputs from c0: per tap and input word, the weights loaded once for the P pixels and each
// pixel's word formed once.
template <class T, int R, int P>
TFL_VNNI inline void tile(const uint8_t* band, int64_t wp, const int8_t* w, __m512i corr,
                          __m512 scale, const Requant<T>& q, const Geometry& g, int64_t c0,
                          __m512i lanes, __mmask16 window, int64_t p, T* out) {
  // kBroadcast: the block's group's first input byte; kPermute: the block's first channel
  const int64_t first = R == kBroadcast ? (c0 / g.ogw) * g.gw : c0;
  const uint8_t* base[P];
  __m512i acc[P];
#pragma GCC unroll 8
  for (int o = 0; o < P; ++o) {
    const int64_t row = (p + o) / g.ow, col = (p + o) % g.ow;
    base[o] = band + (row * g.sh * wp + col * g.sw) * g.ci + first;
    acc[o] = corr;
  }
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t tap = ((i * g.dh) * wp + j * g.dw) * g.ci;
      const int8_t* wt = w + (c0 / 16) * g.block_weights() + (i * g.kw + j) * g.words() * 64;
      for (int64_t m = 0; m < g.words(); ++m) {
        const __m512i wv = _mm512_loadu_si512(wt + m * 64);
        const __m512i at = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(m)));
#pragma GCC unroll 8
        for (int o = 0; o < P; ++o) {
          __m512i xv;
          if constexpr (R == kBroadcast) {
            int32_t word;
            std::memcpy(&word, base[o] + tap + 4 * m, sizeof word);
            xv = _mm512_set1_epi32(word);
          } else {
            xv = _mm512_permutexvar_epi32(at, _mm512_maskz_loadu_epi32(window, base[o] + tap));
          }
          acc[o] = _mm512_dpbusd_epi32(acc[o], xv, wv);
        }
      }
    }
  }
  const __mmask16 m = tail_mask(g.co - c0);
#pragma GCC unroll 8
  for (int o = 0; o < P; ++o) {
    store16(_mm512_cvtepi32_ps(acc[o]), scale, q, m, out + (p + o) * g.co + c0);
  }
}

// `rows` output rows whose input rows the band holds (band row 0: the first one's tap 0), a
// block of 16 outputs at a time: tiles of 8 pixels, then 4, then 1.
template <class T, int R>
TFL_VNNI void rows_vnni(const uint8_t* band, const int8_t* w, const int32_t* corr,
                        const float* scale, const Geometry& g, int64_t rows, T* out) {
  const int64_t wp = g.w + g.pl + g.pr, pixels = rows * g.ow;
  const Requant<T> q(g.zp_y, g.lo_q, g.hi_q);
  // kPermute: lane l reads word (l / G) * (G / 4) + m of the block's 4
  const __m512i lanes =
      R == kPermute
          ? _mm512_mullo_epi32(
                _mm512_srli_epi32(
                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                    g.gw == 4 ? 2 : 3),
                _mm512_set1_epi32(static_cast<int32_t>(g.words())))
          : _mm512_setzero_si512();
  for (int64_t c0 = 0; c0 < g.co; c0 += 16) {
    const __mmask16 m = tail_mask(g.co - c0);
    const __m512i cv = _mm512_maskz_loadu_epi32(m, corr + c0);
    const __m512 sv = _mm512_maskz_loadu_ps(m, scale + c0);
    // kPermute: the block's input words that lie inside the pixel (CI = CO there)
    const int64_t left = (g.ci - c0) / 4;
    const __mmask16 window = static_cast<__mmask16>(left >= 4 ? 0xF : (1u << left) - 1);
    int64_t p = 0;
    for (; p + 8 <= pixels; p += 8) {
      tile<T, R, 8>(band, wp, w, cv, sv, q, g, c0, lanes, window, p, out);
    }
    for (; p + 4 <= pixels; p += 4) {
      tile<T, R, 4>(band, wp, w, cv, sv, q, g, c0, lanes, window, p, out);
    }
    for (; p < pixels; ++p) {
      tile<T, R, 1>(band, wp, w, cv, sv, q, g, c0, lanes, window, p, out);
    }
  }
}

using RowsFn = void (*)(const uint8_t*, const int8_t*, const int32_t*, const float*,
                        const Geometry&, int64_t, void*);

template <class T, int R>
void rows_entry(const uint8_t* band, const int8_t* w, const int32_t* corr, const float* scale,
                const Geometry& g, int64_t rows, void* out) {
  rows_vnni<T, R>(band, w, corr, scale, g, rows, static_cast<T*>(out));
}

// The rows kernel for g; nullptr: the plain loop.
template <class T>
RowsFn pick_rows(const Geometry& g) {
  switch (reads(g)) {
    case kBroadcast:
      return rows_entry<T, kBroadcast>;
    case kPermute:
      return rows_entry<T, kPermute>;
    default:
      return nullptr;
  }
}
#endif

bool fast_form_here() {
#if defined(TFL_X86_AVX512)
  return have_vnni();
#else
  return false;
#endif
}

// The band of input rows one pass fills, at most (as ort_depthwise.cpp's).
constexpr int64_t kBandBytes = 96 * 1024;

// Output rows [r0, r1) of the N * OH rows, in bands of the input rows they read.
template <class T>
void rows(const T* x, const int8_t* w, const int32_t* corr, const float* scale,
          const Geometry& g, int64_t r0, int64_t r1, T* y) {
  thread_local std::vector<uint8_t> band;
  const int64_t wp = g.w + g.pl + g.pr;
#if defined(TFL_X86_AVX512)
  const RowsFn fast_rows = g.form == 0 && fast_form_here() ? pick_rows<T>(g) : nullptr;
#endif
  const int64_t band_rows = kBandBytes / std::max<int64_t>(wp * g.ci, 1);
  for_each_band(r0, r1, g.oh, g.kh, g.sh, g.dh, g.pt, band_rows, [&](int64_t n, int64_t oh0,
                                                                     int64_t oh1, int64_t ih0,
                                                                     int64_t span) {
    band.resize(static_cast<size_t>(span * wp * g.ci));
    fill_band(x, g, n, ih0, span, band.data());
#if defined(TFL_X86_AVX512)
    if (fast_rows != nullptr) {  // the band's output rows at once: tiles span rows
      fast_rows(band.data(), w, corr, scale, g, oh1 - oh0, y + ((n * g.oh + oh0) * g.ow) * g.co);
      return;
    }
#endif
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const uint8_t* start = band.data() + (oh - oh0) * g.sh * wp * g.ci;
      row_portable(start, w, corr, scale, g, y + ((n * g.oh + oh) * g.ow) * g.co);
    }
  });
}

// Work for one piece, in 4-input dot products: as ort_depthwise.cpp's bound (chosen, not tuned).
constexpr int64_t kMinPieceWork = 1 << 18;

Status* compute(void* kernel, KernelContext* context) {
  const TypedOp& spec = *static_cast<const TypedOp*>(kernel);
  const char* op = spec.name;
  TensorView x, w, corr, scale, geo;
  TFL_ORT_TRY(read_input(context, 0, &x, op));
  TFL_ORT_TRY(read_input(context, 1, &w, op));
  TFL_ORT_TRY(read_input(context, 2, &corr, op));
  TFL_ORT_TRY(read_input(context, 3, &scale, op));
  TFL_ORT_TRY(read_input(context, 4, &geo, op));
  const bool bounded = geo.count == 16;
  if (geo.type != kInt64 || (geo.count != 14 && !bounded)) {
    return fail(op, "geometry must be 14 int64 values, or 16 with the least and greatest output "
                    "byte");
  }
  const int64_t* v = static_cast<const int64_t*>(geo.data);
  const int64_t lo = spec.type == kUint8 ? 0 : -128, hi = spec.type == kUint8 ? 255 : 127;
  Geometry g{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
             v[geo.count - 2], v[geo.count - 1], bounded ? v[12] : lo, bounded ? v[13] : hi,
             0, 0, 0, 0, 0, 0, 0, 0, 0};
  if (x.type != spec.type || x.dims.size() != 4) {
    return fail(op, std::string("x must be a 4-D [N, H, W, C] tensor of ") +
                        (spec.type == kUint8 ? "uint8" : "int8") + ", got " +
                        shape_text(x.dims) + " of ONNX element type " + std::to_string(x.type));
  }
  g.n = x.dims[0], g.h = x.dims[1], g.w = x.dims[2], g.ci = x.dims[3];
  g.co = static_cast<int64_t>(corr.count);
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.pt < 0 ||
      g.pl < 0 || g.pb < 0 || g.pr < 0 || g.zp_x < lo || g.zp_x > hi || g.zp_y < lo ||
      g.zp_y > hi || g.form < 0 || g.form > 1 || g.lo_q < lo || g.hi_q > hi || g.lo_q > g.hi_q) {
    return fail(op, "geometry out of range (kernel, strides and dilations >= 1, pads >= 0, zero "
                    "points in the 8-bit type's range, output bytes lo <= hi inside it, form 0 "
                    "or 1)");
  }
  if (g.gw < 4 || g.gw % 4 != 0 || g.ci % g.gw != 0 || g.co == 0 ||
      g.co % (g.ci / g.gw) != 0) {
    return fail(op, std::to_string(g.ci) + " input channels in groups of " +
                        std::to_string(g.gw) + " (a multiple of 4) do not divide the " +
                        std::to_string(g.co) + " outputs (corr and scale) into as many groups");
  }
  if (g.h + g.pt + g.pb < (g.kh - 1) * g.dh + 1 || g.w + g.pl + g.pr < (g.kw - 1) * g.dw + 1) {
    return fail(op, "the padded input " + shape_text(x.dims) + " is smaller than the kernel");
  }
  g.ogw = g.co / (g.ci / g.gw);
  g.oh = (g.h + g.pt + g.pb - (g.kh - 1) * g.dh - 1) / g.sh + 1;
  g.ow = (g.w + g.pl + g.pr - (g.kw - 1) * g.dw - 1) / g.sw + 1;
  g.co16 = (g.co + 15) / 16 * 16;
  const int64_t taps = g.kh * g.kw;
  const size_t weights = static_cast<size_t>(taps * g.words() * g.co16 * 4);
  if (w.type != kInt8 || w.count != weights) {
    return fail(op, "weights must be " + std::to_string(weights) +
                        " int8 values ([CO16 / 16, KH * KW, G / 4, 16, 4]), got " +
                        std::to_string(w.count));
  }
  if (corr.type != kInt32) {
    return fail(op, "corr must be int32 values, one per output channel");
  }
  if (scale.type != kFloat || scale.count != static_cast<size_t>(g.co)) {
    return fail(op, "scale must be " + std::to_string(g.co) + " floats");
  }
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, {g.n, g.oh, g.ow, g.co}, &out));
  const int64_t total_rows = g.n * g.oh;
  if (total_rows == 0 || g.ow == 0) {
    return nullptr;
  }
  const int64_t row_work = g.ow * g.co16 * taps * g.words();
  const int8_t* wt = static_cast<const int8_t*>(w.data);
  const int32_t* cf = static_cast<const int32_t*>(corr.data);
  const float* sf = static_cast<const float*>(scale.data);
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
    typed_spec("GroupedDotConvU8", kUint8, input_type, input_count, compute),
    typed_spec("GroupedDotConvI8", kInt8, input_type, input_count, compute),
};

}  // namespace
}  // namespace ort_grouped_dot

std::vector<const ort::CustomOp*> ort::grouped_dot_ops() {
  return ort::op_list(ort_grouped_dot::g_ops);
}

}  // namespace torch_fl
