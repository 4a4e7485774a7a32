// Depthwise and narrow-group 8-bit convolutions for the sim executor's ONNX Runtime sessions,
// bit-equal to ONNX Runtime's own QLinearConv (channels-last).
//
// ONNX Runtime's int8 depthwise kernel is slow on channel counts that are not a multiple of 16:
// by its profiler (MobileNetV3, batch 1, 1 thread), a 3x3 over 88 channels at 28x28 took 55.4 us
// and this op 24.2 us (docs/compile.md, *Depthwise convolutions on the extension's op*). A
// grouped conv whose groups are a few channels wide (RegNet's, 8 channels a group; ResNeXt's)
// it runs as one small GEMM per group, N = the group's outputs: 10.8 M multiply-adds of
// RegNetY-400MF's first 3x3 (48 channels in 6 groups, stride 2, 112x112) took 1.03 ms, a tenth
// of what its 1x1 convs reach. Here a conv of G input channels a group is G depthwise convs
// summed: the input band holds, per pixel and for each k < G, the value each output channel
// reads at its group's k-th input (a permute of 16 channels for groups of 2 to 16), and the
// depthwise tiles below run over those G planes into one accumulator.
//
// Every product and partial sum of an 8-bit conv is an integer; where each output channel's
// sum of |w| times the widest |x - zp|, plus |bias|, stays below 2^24 (a 3x3 over 8 channels:
// 72 x 255 x 255 < 2^23; conversion/depthwise.py checks the bound per channel), float32 holds
// each of them exactly and the float multiply-adds give QLinearConv's own int32 accumulator;
// then the output is requantized as MLAS does (MlasRequantizeOutput): the accumulator, bias
// included, times the per-channel scale (x_scale * w_scale / y_scale, formed so in float32 by
// torch_fl/bpu/conversion/qlinear_conv.py), clamped to the output type's range less the zero
// point, rounded to nearest even, plus the zero point.
//
// Ops, in domain "torch_fl.bpu", named by the 8-bit type of x and y:
//   DepthwiseConv<U8|I8>(x, weights, bias, scale, geometry) -> y
//     x         [N, H, W, C] uint8 / int8 (channels last)
//     weights   [KH * KW, C] float: w - w_zero_point, tap-major
//     bias      [C] float: QLinearConv's int32 bias (0 where it has none)
//     scale     [C] float: the requantization scale
//     geometry  [13] int64: KH, KW, stride h, w, pads top, left, bottom, right, dilation h, w,
//               x zero point, y zero point, form (0: the fastest form here; 1: the plain loop,
//               for tests that compare the two)
//     y         [N, OH, OW, C] of x's type
//   GroupedConv<U8|I8>(x, weights, bias, scale, geometry) -> y
//     x         [N, H, W, CI] (channels last), CI = groups x G
//     weights   [G, KH * KW, CO] float: w - w_zero_point, input-of-group-major, then tap-major
//     bias, scale [CO]
//     geometry  [14] int64: as DepthwiseConv's, then G (input channels a group) before form
//     y         [N, OH, OW, CO], CO a multiple of the group count
// conversion/depthwise.py writes them only where that exactness bound holds per channel.
#include "runtime/ort_depthwise.h"

#include "runtime/ort_kernel.h"
#include "runtime/ort_requant.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace torch_fl {
namespace ort_depthwise {
namespace {

using namespace torch_fl::ort;

struct Geometry {
  int64_t kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, zp_x, zp_y, form;
  int64_t n, h, w, c, oh, ow;  // c: output channels
  int64_t cin, gw, ogw;        // input channels; input and output channels a group
};

#if defined(TFL_X86_AVX512)
// in[i] - zp as floats, 16 at a time; returns how many it did (the rest: the caller's loop).
template <class T>
TFL_AVX512 inline int64_t widen_avx512(const T* in, int64_t count, float zp, float* dst) {
  const __m512 z = _mm512_set1_ps(zp);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m512i v = std::is_signed<T>::value ? _mm512_cvtepi8_epi32(bytes)
                                               : _mm512_cvtepu8_epi32(bytes);
    _mm512_storeu_ps(dst + i, _mm512_sub_ps(_mm512_cvtepi32_ps(v), z));
  }
  return i;
}
#endif

// Input rows [ih0, ih0 + rows) of batch item `n`, less the zero point, as floats in a
// zero-padded band of rows of `wp` = W + pads pixels of `g.cin` channels; rows outside the input
// are all padding.
template <class T>
void fill_band(const T* x, const Geometry& g, int64_t n, int64_t ih0, int64_t rows,
               [[maybe_unused]] bool fast, float* band) {
  const int64_t wp = g.w + g.pl + g.pr, ps = g.cin;
  const float zp = static_cast<float>(g.zp_x);
  for (int64_t r = 0; r < rows; ++r) {
    float* out = band + r * wp * ps;
    const int64_t ih = ih0 + r;
    if (ih < 0 || ih >= g.h) {
      std::memset(out, 0, sizeof(float) * static_cast<size_t>(wp * ps));
      continue;
    }
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(g.pl * ps));
    std::memset(out + (g.pl + g.w) * ps, 0, sizeof(float) * static_cast<size_t>(g.pr * ps));
    const T* in = x + ((n * g.h + ih) * g.w) * ps;
    float* dst = out + g.pl * ps;
    const int64_t count = g.w * ps;
    int64_t i = 0;
#if defined(TFL_X86_AVX512)
    if (fast) {
      i = widen_avx512(in, count, zp, dst);
    }
#endif
    for (; i < count; ++i) {
      dst[i] = static_cast<float>(in[i]) - zp;  // exact: both are small integers
    }
  }
}

// One output row from its band (band row 0 is the row of tap 0), the plain loop: output channel
// c of group c / ogw reads that group's inputs (c / ogw) * gw + k.
template <class T>
void row_portable(const float* band, const float* w, const float* bias, const float* scale,
                  const Geometry& g, T* out) {
  const int64_t wp = g.w + g.pl + g.pr, ps = g.cin;
  for (int64_t ow = 0; ow < g.ow; ++ow) {
    for (int64_t c = 0; c < g.c; ++c) {
      float acc = bias[c];
      const int64_t first = (c / g.ogw) * g.gw;
      for (int64_t k = 0; k < g.gw; ++k) {
        for (int64_t i = 0; i < g.kh; ++i) {
          const float* px = band + ((i * g.dh) * wp + ow * g.sw) * ps + first + k;
          const float* wt = w + ((k * g.kh + i) * g.kw) * g.c + c;
          for (int64_t j = 0; j < g.kw; ++j) {
            acc += px[j * g.dw * ps] * wt[j * g.c];
          }
        }
      }
      out[ow * g.c + c] = requantize<T>(acc, scale[c], g.zp_y);
    }
  }
}

#if defined(TFL_X86_AVX512)
// How the AVX-512 form forms the vector of inputs that a block of 16 output channels multiplies
// by one weight vector: a depthwise conv's are the block's own 16 channels; groups of G (2 to 16,
// dividing 16) as wide as their outputs read the block's own 16 channels too, lane l taking
// channel (l / G) * G + k for the group's k-th input (one permute); groups whose outputs fill
// whole blocks read one input for all 16 lanes (a broadcast). Other shapes take the plain loop
// (conversion/grouped_conv.py `fits` writes the op only for these).
enum Reads { kOwn = 0, kPermute = 1, kBroadcast = 2, kPlain = 3 };

Reads reads(const Geometry& g) {
  if (g.gw == 1 && g.ogw == 1) {
    return kOwn;
  }
  if (g.gw == g.ogw && g.gw <= 16 && 16 % g.gw == 0) {
    return kPermute;
  }
  return g.ogw % 16 == 0 ? kBroadcast : kPlain;
}

// The 16 inputs that output block c0 multiplies by the weights of its groups' k-th input, at
// pixel `px` of the band (see Reads): `lanes` holds lane l's group start within the block.
template <int R>
TFL_AVX512 inline __m512 inputs(const float* px, int64_t c0, int64_t first, __mmask16 m,
                                __m512i lanes, int64_t k) {
  if constexpr (R == kOwn) {
    return _mm512_maskz_loadu_ps(m, px + c0);
  } else if constexpr (R == kPermute) {
    const __m512i at = _mm512_add_epi32(lanes, _mm512_set1_epi32(static_cast<int32_t>(k)));
    return _mm512_permutexvar_ps(at, _mm512_maskz_loadu_ps(m, px + c0));
  } else {
    return _mm512_set1_ps(px[first + k]);
  }
}

// P output pixels of one output row, 16 channels from c0 (`m`: the tail mask), with kernel width
// KW and column stride SW (column dilation 1): per kernel row and group input, the (P - 1) * SW
// + KW input vectors that the P outputs read are formed once and each weight loaded once, so
// the multiply-adds outnumber the loads (8 outputs of a 3x3: 24 multiply-adds on 13 loads a
// row, where loading each operand would take 48).
template <int R, int KW, int SW, int P>
TFL_AVX512 inline void tile(const float* band, int64_t wp, const float* w, const Geometry& g,
                            int64_t c0, int64_t first, __mmask16 m, __m512i lanes, int64_t ow,
                            __m512 (&acc)[P]) {
  constexpr int kInputs = (P - 1) * SW + KW;
  const int64_t ps = g.cin, gw = R == kOwn ? 1 : g.gw;  // a depthwise conv's loop is gone
  for (int64_t i = 0; i < g.kh; ++i) {
    const float* row = band + ((i * g.dh) * wp + ow * SW) * ps;
    for (int64_t k = 0; k < gw; ++k) {
      const float* wt = w + ((k * g.kh + i) * KW) * g.c + c0;
      __m512 in[kInputs];
#pragma GCC unroll 32
      for (int t = 0; t < kInputs; ++t) {
        in[t] = inputs<R>(row + t * ps, c0, first, m, lanes, k);
      }
#pragma GCC unroll 16
      for (int j = 0; j < KW; ++j) {
        const __m512 wv = _mm512_maskz_loadu_ps(m, wt + j * g.c);
#pragma GCC unroll 16
        for (int o = 0; o < P; ++o) {
          acc[o] = _mm512_fmadd_ps(in[o * SW + j], wv, acc[o]);
        }
      }
    }
  }
}

// Outputs [ow, ow + count) of the row in tiles of P, then of P / 2, ... 1.
template <class T, int R, int KW, int SW, int P>
TFL_AVX512 inline void tiles(const float* band, int64_t wp, const float* w, const Geometry& g,
                             int64_t c0, int64_t first, __mmask16 m, __m512i lanes, __m512 b,
                             __m512 s, const Requant<T>& q, int64_t ow, int64_t end, T* out) {
  for (; ow + P <= end; ow += P) {
    __m512 acc[P];
#pragma GCC unroll 16
    for (int o = 0; o < P; ++o) {
      acc[o] = b;
    }
    tile<R, KW, SW, P>(band, wp, w, g, c0, first, m, lanes, ow, acc);
#pragma GCC unroll 16
    for (int o = 0; o < P; ++o) {
      store16(acc[o], s, q, m, out + (ow + o) * g.c + c0);
    }
  }
  if constexpr (P > 1) {
    tiles<T, R, KW, SW, P / 2>(band, wp, w, g, c0, first, m, lanes, b, s, q, ow, end, out);
  }
}

// One output row, 16 channels at a time (the tail masked): in tiles for kernel width KW at column
// stride SW, or, with KW = 0, any geometry one output pixel at a time, every operand formed.
// The tiles took the 88-channel 3x3 above from 32.2 to 20.7 us, the 240-channel 5x5 at 14x14
// from 52.9 to 27.1 us (ORT's profiler, two runs; before: four outputs at a time, every operand
// loaded for each).
template <class T, int R, int KW, int SW>
TFL_AVX512 void row_avx512(const float* band, const float* w, const float* bias,
                           const float* scale, const Geometry& g, T* out) {
  const int64_t wp = g.w + g.pl + g.pr, ps = g.cin;
  const Requant<T> q(g.zp_y);
  // lane l's group start within its block, for kPermute (G a power of two there)
  const __m512i lanes = _mm512_and_si512(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(~static_cast<int32_t>(g.gw - 1)));
  for (int64_t c0 = 0; c0 < g.c; c0 += 16) {
    const __mmask16 m = tail_mask(g.c - c0);
    const __m512 b = _mm512_maskz_loadu_ps(m, bias + c0);
    const __m512 s = _mm512_maskz_loadu_ps(m, scale + c0);
    const int64_t first = (c0 / g.ogw) * g.gw;  // kBroadcast: the block's group's first input
    if constexpr (KW > 0) {
      // 8 outputs a tile at column stride 1, 4 at 2: up to 23 of the 32 vector registers
      tiles<T, R, KW, SW, (SW == 1 ? 8 : 4)>(band, wp, w, g, c0, first, m, lanes, b, s, q, 0,
                                             g.ow, out);
    } else {
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        __m512 a = b;
        for (int64_t i = 0; i < g.kh; ++i) {
          const float* row = band + ((i * g.dh) * wp + ow * g.sw) * ps;
          for (int64_t k = 0; k < g.gw; ++k) {
            const float* wt = w + ((k * g.kh + i) * g.kw) * g.c + c0;
            for (int64_t j = 0; j < g.kw; ++j) {
              a = _mm512_fmadd_ps(inputs<R>(row + j * g.dw * ps, c0, first, m, lanes, k),
                                  _mm512_maskz_loadu_ps(m, wt + j * g.c), a);
            }
          }
        }
        store16(a, s, q, m, out + ow * g.c + c0);
      }
    }
  }
}

using RowFn = void (*)(const float*, const float*, const float*, const float*, const Geometry&,
                       void*);

template <class T, int R, int KW, int SW>
void row_entry(const float* band, const float* w, const float* bias, const float* scale,
               const Geometry& g, void* out) {
  row_avx512<T, R, KW, SW>(band, w, bias, scale, g, static_cast<T*>(out));
}

// Kernel widths 1 to 7 at column stride 1, then at 2, tiled; the one-pixel loop.
template <class T, int R>
struct RowTable {
  static constexpr RowFn tiled[2][7] = {
      {row_entry<T, R, 1, 1>, row_entry<T, R, 2, 1>, row_entry<T, R, 3, 1>, row_entry<T, R, 4, 1>,
       row_entry<T, R, 5, 1>, row_entry<T, R, 6, 1>, row_entry<T, R, 7, 1>},
      {row_entry<T, R, 1, 2>, row_entry<T, R, 2, 2>, row_entry<T, R, 3, 2>, row_entry<T, R, 4, 2>,
       row_entry<T, R, 5, 2>, row_entry<T, R, 6, 2>, row_entry<T, R, 7, 2>}};
  static constexpr RowFn any = row_entry<T, R, 0, 0>;
};

// The row kernel for g (nullptr: the plain loop): a tiled one for kernel widths 1 to 7 at
// column stride 1 or 2 (no column dilation), the one-pixel loop otherwise.
template <class T, int R>
RowFn pick_for(const Geometry& g) {
  if (g.dw == 1 && (g.sw == 1 || g.sw == 2) && g.kw >= 1 && g.kw <= 7) {
    return RowTable<T, R>::tiled[g.sw - 1][g.kw - 1];
  }
  return RowTable<T, R>::any;
}

template <class T>
RowFn pick_row(const Geometry& g) {
  switch (reads(g)) {
    case kOwn:
      return pick_for<T, kOwn>(g);
    case kPermute:
      return pick_for<T, kPermute>(g);
    case kBroadcast:
      return pick_for<T, kBroadcast>(g);
    default:
      return nullptr;
  }
}
#endif

bool fast_form_here() {
#if defined(TFL_X86_AVX512)
  return ort::have_avx512();
#else
  return false;
#endif
}

// The float band of input rows one pass converts, at most (where a single output row needs
// more, that row's band): one the caches keep while the rows that read it run. With a band of
// the whole input (950 KB for 72 channels at 56x56) the op gained little on the compiled
// MobileNetV3 (batch 1, 1 thread, steady, by hand: 1.094 against 1.112 ms without the op, and
// 1.188 against 1.211); with this bound 1.092 against 1.155.
constexpr int64_t kBandBytes = 96 * 1024;

// Output rows [r0, r1) of the N * OH rows, in bands of the input rows they read.
template <class T>
void rows(const T* x, const float* w, const float* bias, const float* scale, const Geometry& g,
          int64_t r0, int64_t r1, T* y) {
  thread_local std::vector<float> band;
  const int64_t wp = g.w + g.pl + g.pr, ps = g.cin;
  const bool fast = g.form == 0 && fast_form_here();
#if defined(TFL_X86_AVX512)
  const RowFn fast_row = fast ? pick_row<T>(g) : nullptr;  // nullptr: the plain loop
#endif
  // output rows per band: as many as keep the band within kBandBytes (at least one)
  const int64_t row_bytes = wp * ps * static_cast<int64_t>(sizeof(float));
  const int64_t band_rows = kBandBytes / std::max<int64_t>(row_bytes, 1);
  for_each_band(r0, r1, g.oh, g.kh, g.sh, g.dh, g.pt, band_rows, [&](int64_t n, int64_t oh0,
                                                                     int64_t oh1, int64_t ih0,
                                                                     int64_t span) {
    band.resize(static_cast<size_t>(span * wp * ps));
    fill_band(x, g, n, ih0, span, fast, band.data());
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const float* start = band.data() + (oh - oh0) * g.sh * wp * ps;
      T* out = y + ((n * g.oh + oh) * g.ow) * g.c;
#if defined(TFL_X86_AVX512)
      if (fast_row != nullptr) {
        fast_row(start, w, bias, scale, g, out);
        continue;
      }
#endif
      row_portable(start, w, bias, scale, g, out);
    }
  });
}

// Work for one piece: handing a piece to another thread costs ~2 us (ort_lookup.cpp), so a
// piece is at least this many multiply-adds, a few times that cost at the tiles' speed above.
// At 1 << 18, MobileNetV3's 3x3 at stride 2 over 72 channels (508 032 multiply-adds) stayed one
// piece, 110 us on 1 thread while a second one waited; at 1 << 17 it splits, and the compiled
// session at batch 1 on 2 threads ran 0.973 of its time before (60 paired blocks, Intel Xeon
// with AVX-512; 0.987 on 1 thread, inside the noise).
constexpr int64_t kMinPieceWork = 1 << 17;

// The pieces the ops' calls split into, counted for tests (torch_fl._C._depthwise_pieces).
std::atomic<uint64_t> g_pieces{0};


Status* check_float(const char* op, const TensorView& t, const char* what, size_t count) {
  if (t.type != kFloat || t.count != count) {
    return error(std::string("torch_fl.bpu ") + op + ": " + what + " must be " +
                 std::to_string(count) + " floats, got " + std::to_string(t.count) +
                 " of ONNX element type " + std::to_string(t.type));
  }
  return nullptr;
}

// Both ops: a grouped conv's geometry has G before its form; a depthwise conv's G is 1 and its
// outputs are its inputs' channels.
Status* compute(void* kernel, KernelContext* context, bool grouped) {
  const TypedOp& spec = *static_cast<const TypedOp*>(kernel);
  const char* op = spec.name;
  TensorView x, w, bias, scale, geo;
  TFL_ORT_TRY(read_input(context, 0, &x, op));
  TFL_ORT_TRY(read_input(context, 1, &w, op));
  TFL_ORT_TRY(read_input(context, 2, &bias, op));
  TFL_ORT_TRY(read_input(context, 3, &scale, op));
  TFL_ORT_TRY(read_input(context, 4, &geo, op));
  if (x.type != spec.type || x.dims.size() != 4) {
    return error(std::string("torch_fl.bpu ") + op + ": x must be a 4-D [N, H, W, C] tensor of " +
                 (spec.type == kUint8 ? "uint8" : "int8") + ", got " + shape_text(x.dims) +
                 " of ONNX element type " + std::to_string(x.type));
  }
  const size_t values = grouped ? 14 : 13;
  if (geo.type != kInt64 || geo.count != values) {
    return error(std::string("torch_fl.bpu ") + op + ": geometry must be " +
                 std::to_string(values) + " int64 values");
  }
  const int64_t* v = static_cast<const int64_t*>(geo.data);
  const int64_t cin = x.dims[3], gw = grouped ? v[12] : 1;
  Geometry g{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
             v[values - 1], x.dims[0], x.dims[1], x.dims[2],
             grouped ? static_cast<int64_t>(bias.count) : cin, 0, 0,
             cin, gw, 1};
  const int64_t lo = spec.type == kUint8 ? 0 : -128, hi = spec.type == kUint8 ? 255 : 127;
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.pt < 0 ||
      g.pl < 0 || g.pb < 0 || g.pr < 0 || g.zp_x < lo || g.zp_x > hi || g.zp_y < lo ||
      g.zp_y > hi || g.form < 0 || g.form > 1) {
    return error(std::string("torch_fl.bpu ") + op +
                 ": geometry out of range (kernel, strides and dilations >= 1, pads >= 0, zero "
                 "points in the 8-bit type's range, form 0 or 1)");
  }
  // the groups: G input channels each, and as many of the outputs each
  if (gw < 1 || cin % gw != 0 || cin == 0 || g.c % (cin / gw) != 0) {
    return error(std::string("torch_fl.bpu ") + op + ": " + std::to_string(cin) +
                 " input channels in groups of " + std::to_string(gw) + " do not divide the " +
                 std::to_string(g.c) + " outputs (bias and scale) into as many groups");
  }
  g.ogw = g.c / (cin / gw);
  g.oh = (g.h + g.pt + g.pb - (g.kh - 1) * g.dh - 1) / g.sh + 1;
  g.ow = (g.w + g.pl + g.pr - (g.kw - 1) * g.dw - 1) / g.sw + 1;
  if (g.h + g.pt + g.pb < (g.kh - 1) * g.dh + 1 || g.w + g.pl + g.pr < (g.kw - 1) * g.dw + 1) {
    return error(std::string("torch_fl.bpu ") + op + ": the padded input " + shape_text(x.dims) +
                 " is smaller than the kernel");
  }
  const size_t channels = static_cast<size_t>(g.c);
  TFL_ORT_TRY(check_float(op, w, "weights", static_cast<size_t>(gw * g.kh * g.kw) * channels));
  TFL_ORT_TRY(check_float(op, bias, "bias", channels));
  TFL_ORT_TRY(check_float(op, scale, "scale", channels));
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, {g.n, g.oh, g.ow, g.c}, &out));
  const int64_t total_rows = g.n * g.oh;
  if (total_rows == 0 || g.ow == 0 || g.c == 0) {
    return nullptr;
  }
  const int64_t row_work = g.ow * g.c * g.kh * g.kw * gw;
  g_pieces.fetch_add(static_cast<uint64_t>(row_piece_count(total_rows, row_work, kMinPieceWork)),
                     std::memory_order_relaxed);
  const float* wf = static_cast<const float*>(w.data);
  const float* bf = static_cast<const float*>(bias.data);
  const float* sf = static_cast<const float*>(scale.data);
  return run_typed_rows(context, spec.type, x.data, out, total_rows, row_work, kMinPieceWork,
                        [&](auto in, auto y, int64_t r0, int64_t r1) {
                          rows(in, wf, bf, sf, g, r0, r1, y);
                        });
}

int input_type(const CustomOp* op, size_t index) {
  return index == 0 ? typed_op(op).type : index == 4 ? kInt64 : kFloat;
}
size_t input_count(const CustomOp*) { return 5; }

Status* compute_depthwise(void* kernel, KernelContext* context) {
  return compute(kernel, context, false);
}
Status* compute_grouped(void* kernel, KernelContext* context) {
  return compute(kernel, context, true);
}

TypedOp g_ops[] = {
    typed_spec("DepthwiseConvU8", kUint8, input_type, input_count, compute_depthwise),
    typed_spec("DepthwiseConvI8", kInt8, input_type, input_count, compute_depthwise),
    typed_spec("GroupedConvU8", kUint8, input_type, input_count, compute_grouped),
    typed_spec("GroupedConvI8", kInt8, input_type, input_count, compute_grouped),
};

}  // namespace
}  // namespace ort_depthwise

std::vector<const ort::CustomOp*> ort::depthwise_ops() {
  return ort::op_list(ort_depthwise::g_ops);
}

uint64_t depthwise_pieces() { return ort_depthwise::g_pieces.load(std::memory_order_relaxed); }

const char* depthwise_kernel() {
  return ort_depthwise::fast_form_here() ? "avx512" : "portable";
}

}  // namespace torch_fl
