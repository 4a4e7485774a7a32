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
// summed: the widened input rows hold, per pixel and for each k < G, the value each output channel
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
//               for tests that compare the two); or [15]: the least and greatest output byte
//               before form (a clamp that followed the op, folded in: conversion/clamp_fold.py)
//     y         [N, OH, OW, C] of x's type
//   GroupedConv<U8|I8>(x, weights, bias, scale, geometry) -> y
//     x         [N, H, W, CI] (channels last), CI = groups x G
//     weights   [G, KH * KW, CO] float: w - w_zero_point, input-of-group-major, then tap-major
//     bias, scale [CO]
//     geometry  [14] int64: as DepthwiseConv's, then G (input channels a group) before form;
//               or [16]: the least and greatest output byte before G
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
  int64_t lo_q, hi_q;          // the output bytes' range (ort_requant.h)
};


// Input row `ih` (inside the input) of batch item `n`, less the zero point, as floats in a
// zero-padded row of W + pads pixels of `g.cin` channels. `widen` (nullptr: the plain loop) does
// a vector form's share of it.
template <class T>
void fill_row(const T* x, const Geometry& g, int64_t n, int64_t ih,
              int64_t (*widen)(const T*, int64_t, float, float*), float* out) {
  const int64_t ps = g.cin;
  const float zp = static_cast<float>(g.zp_x);
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(g.pl * ps));
  std::memset(out + (g.pl + g.w) * ps, 0, sizeof(float) * static_cast<size_t>(g.pr * ps));
  const T* in = x + ((n * g.h + ih) * g.w) * ps;
  float* dst = out + g.pl * ps;
  const int64_t count = g.w * ps;
  int64_t i = widen != nullptr ? widen(in, count, zp, dst) : 0;
  for (; i < count; ++i) {
    dst[i] = static_cast<float>(in[i]) - zp;  // exact: both are small integers
  }
}

// One output row from the input rows `taps` (one a kernel row, padded: fill_row), the plain
// loop: output channel c of group c / ogw reads that group's inputs (c / ogw) * gw + k.
template <class T>
void row_portable(const float* const* taps, const float* w, const float* bias,
                  const float* scale, const Geometry& g, T* out) {
  const int64_t ps = g.cin;
  for (int64_t ow = 0; ow < g.ow; ++ow) {
    for (int64_t c = 0; c < g.c; ++c) {
      float acc = bias[c];
      const int64_t first = (c / g.ogw) * g.gw;
      for (int64_t k = 0; k < g.gw; ++k) {
        for (int64_t i = 0; i < g.kh; ++i) {
          const float* px = taps[i] + ow * g.sw * ps + first + k;
          const float* wt = w + ((k * g.kh + i) * g.kw) * g.c + c;
          for (int64_t j = 0; j < g.kw; ++j) {
            acc += px[j * g.dw * ps] * wt[j * g.c];
          }
        }
      }
      out[ow * g.c + c] = requantize<T>(acc, scale[c], g.zp_y, g.lo_q, g.hi_q);
    }
  }
}


// The x86 vector forms of the row kernel (ort_depthwise_rows.inc, once per width): AVX-512 where
// the CPU has it, else AVX2 with FMA (Haswell to Zen 3). There ONNX Runtime's int8 depthwise
// kernel is slower still than on AVX-512: by its profiler (MobileNetV3, batch 1, 1 thread, the
// emulated AVX2 CPU of scripts/cpu_kind.py), 117 us for the 3x3 at stride 2 over 72 channels
// that its fp32 NCHWc kernel runs in 30 us. Every product and sum is the same float operation
// in either width, so both forms give the plain loop's bytes.
#if defined(TFL_X86_AVX512)
enum Reads { kOwn = 0, kPermute = 1, kBroadcast = 2, kPlain = 3 };

using RowFn = void (*)(const float* const*, const float*, const float*, const float*,
                       const Geometry&, void*);

// 16 float lanes, masked by __mmask16.
struct V512 {
  using Reg = __m512;
  using Mask = __mmask16;
  using Index = __m512i;
  static constexpr int kLanes = 16;
  // 8 outputs a tile at column stride 1, 4 at 2: up to 23 of the 32 vector registers
  static constexpr int tile(int sw) { return sw == 1 ? 8 : 4; }
  template <class T>
  using Requant = ort::Requant<T>;

  TFL_AVX512 static Mask mask(int64_t left) { return tail_mask(left); }
  TFL_AVX512 static Reg load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  TFL_AVX512 static Reg set1(float v) { return _mm512_set1_ps(v); }
  TFL_AVX512 static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  TFL_AVX512 static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  // lane l's group start within its block, for groups of `gw` (a power of two)
  TFL_AVX512 static Index group_starts(int64_t gw) {
    return _mm512_and_si512(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(~static_cast<int32_t>(gw - 1)));
  }
  TFL_AVX512 static Reg permute(Index starts, int64_t k, Reg v) {
    const __m512i at = _mm512_add_epi32(starts, _mm512_set1_epi32(static_cast<int32_t>(k)));
    return _mm512_permutexvar_ps(at, v);
  }
  template <class T>
  TFL_AVX512 static void store(Reg acc, Reg s, const Requant<T>& q, Mask m, T* out) {
    store16(acc, s, q, m, out);
  }
  TFL_AVX512 static void store_floats(float* dst, Reg v) { _mm512_storeu_ps(dst, v); }
  template <class T>
  TFL_AVX512 static Reg bytes_to_floats(const T* in) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
    return _mm512_cvtepi32_ps(std::is_signed<T>::value ? _mm512_cvtepi8_epi32(bytes)
                                                       : _mm512_cvtepu8_epi32(bytes));
  }
};

// 8 float lanes; the tail's lanes as a vector mask and its count (for the byte store).
struct V256 {
  using Reg = __m256;
  struct Mask {
    __m256i lanes;
    int64_t left;
  };
  using Index = __m256i;
  static constexpr int kLanes = 8;
  // 4 outputs a tile at either column stride: 2 at stride 2 left a 5x5 load-bound (96 channels
  // at 28x28: 63.9 against 56.7 us, dwbench of docs/compile.md)
  static constexpr int tile(int) { return 4; }
  template <class T>
  using Requant = ort::Requant8<T>;

  TFL_AVX2_FMA static Mask mask(int64_t left) { return {lanes8(left), left}; }
  TFL_AVX2_FMA static Reg load(const Mask& m, const float* p) {
    return _mm256_maskload_ps(p, m.lanes);  // masked lanes read as 0 and never fault
  }
  TFL_AVX2_FMA static Reg set1(float v) { return _mm256_set1_ps(v); }
  TFL_AVX2_FMA static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  TFL_AVX2_FMA static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  TFL_AVX2_FMA static Index group_starts(int64_t gw) {
    return _mm256_and_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                            _mm256_set1_epi32(~static_cast<int32_t>(gw - 1)));
  }
  TFL_AVX2_FMA static Reg permute(Index starts, int64_t k, Reg v) {
    const __m256i at = _mm256_add_epi32(starts, _mm256_set1_epi32(static_cast<int32_t>(k)));
    return _mm256_permutevar8x32_ps(v, at);
  }
  template <class T>
  TFL_AVX2_FMA static void store(Reg acc, Reg s, const Requant<T>& q, const Mask& m, T* out) {
    store8(acc, s, q, m.left, out);
  }
  TFL_AVX2_FMA static void store_floats(float* dst, Reg v) { _mm256_storeu_ps(dst, v); }
  template <class T>
  TFL_AVX2_FMA static Reg bytes_to_floats(const T* in) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in));
    return _mm256_cvtepi32_ps(std::is_signed<T>::value ? _mm256_cvtepi8_epi32(bytes)
                                                       : _mm256_cvtepu8_epi32(bytes));
  }
};

namespace avx512 {
using V = V512;
#define TFL_ROWS_TARGET TFL_AVX512
#include "runtime/ort_depthwise_rows.inc"
#undef TFL_ROWS_TARGET
}  // namespace avx512

namespace avx2 {
using V = V256;
#define TFL_ROWS_TARGET TFL_AVX2_FMA
#include "runtime/ort_depthwise_rows.inc"
#undef TFL_ROWS_TARGET
}  // namespace avx2
#endif

// The form the ops' fastest setting (geometry form 0) runs on this CPU.
enum class Form { kPortable, kAvx2, kAvx512 };

Form form_here() {
#if defined(TFL_X86_AVX512)
  if (ort::have_avx512()) {
    return Form::kAvx512;
  }
  if (ort::have_avx2_fma()) {
    return Form::kAvx2;
  }
#endif
  return Form::kPortable;
}

// What one call of the op runs: the row kernel (nullptr: the plain loop) and the input rows'
// widening (nullptr: the plain loop).
template <class T>
struct Kernels {
#if defined(TFL_X86_AVX512)
  RowFn row = nullptr;
#endif
  int64_t (*widen)(const T*, int64_t, float, float*) = nullptr;
};

template <class T>
Kernels<T> kernels_for(const Geometry& g) {
  Kernels<T> k;
#if defined(TFL_X86_AVX512)
  switch (g.form == 0 ? form_here() : Form::kPortable) {
    case Form::kAvx512:
      k.row = avx512::pick_row<T>(g), k.widen = avx512::widen<T>;
      break;
    case Form::kAvx2:
      k.row = avx2::pick_row<T>(g), k.widen = avx2::widen<T>;
      break;
    case Form::kPortable:
      break;
  }
#else
  (void)g;
#endif
  return k;
}


// Output rows [r0, r1) of the N * OH rows. Each input row is widened to floats once, into a ring
// of the (KH - 1) * DH + 1 rows one output row reads (row ih in slot ih % that), and every
// padding row is one row of zeros. Before, a band of input rows (at most 96 KB) per run of output
// rows was widened afresh for each run, so a row that two runs read was widened twice: each row
// of a 5x5 over 240 channels at 14x14 five times (its band held one output row's 5 rows), of a
// 3x3 over 144 at 56x56 three times. By hand (one-node sessions, 1 thread, AVX-512), the 5x5
// took 83.7 us before and 75.6 after; scripts/bench_conv_ops.py times the op per shape.
template <class T>
void rows(const T* x, const float* w, const float* bias, const float* scale, const Geometry& g,
          int64_t r0, int64_t r1, T* y) {
  thread_local std::vector<float> ring, zeros;
  thread_local std::vector<int64_t> held;  // the input row each slot holds, -1: none yet
  thread_local std::vector<const float*> taps;
  const Kernels<T> kernels = kernels_for<T>(g);
  const int64_t row_floats = (g.w + g.pl + g.pr) * g.cin;
  const int64_t span = (g.kh - 1) * g.dh + 1;
  ring.resize(static_cast<size_t>(span * row_floats));
  if (zeros.size() < static_cast<size_t>(row_floats)) {
    zeros.assign(static_cast<size_t>(row_floats), 0.0f);  // only ever written here: all zeros
  }
  held.assign(static_cast<size_t>(span), -1);
  taps.resize(static_cast<size_t>(g.kh));
  int64_t item = -1;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / g.oh, oh = r % g.oh;
    if (n != item) {  // another batch item: no slot holds its rows
      std::fill(held.begin(), held.end(), -1);
      item = n;
    }
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t ih = oh * g.sh - g.pt + i * g.dh;
      if (ih < 0 || ih >= g.h) {
        taps[i] = zeros.data();
        continue;
      }
      // the rows of one output row are `span` consecutive ones: each in its own slot
      const int64_t slot = ih % span;
      float* row = ring.data() + slot * row_floats;
      if (held[slot] != ih) {
        fill_row(x, g, n, ih, kernels.widen, row);
        held[slot] = ih;
      }
      taps[i] = row;
    }
    T* out = y + r * g.ow * g.c;
#if defined(TFL_X86_AVX512)
    if (kernels.row != nullptr) {
      kernels.row(taps.data(), w, bias, scale, g, out);
      continue;
    }
#endif
    row_portable(taps.data(), w, bias, scale, g, out);
  }
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
  const bool bounded = geo.count == values + 2;
  if (geo.type != kInt64 || (geo.count != values && !bounded)) {
    return error(std::string("torch_fl.bpu ") + op + ": geometry must be " +
                 std::to_string(values) + " int64 values, or " + std::to_string(values + 2) +
                 " with the least and greatest output byte");
  }
  const int64_t* v = static_cast<const int64_t*>(geo.data);
  const int64_t cin = x.dims[3], gw = grouped ? v[geo.count - 2] : 1;
  const int64_t lo = spec.type == kUint8 ? 0 : -128, hi = spec.type == kUint8 ? 255 : 127;
  Geometry g{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
             v[geo.count - 1], x.dims[0], x.dims[1], x.dims[2],
             grouped ? static_cast<int64_t>(bias.count) : cin, 0, 0,
             cin, gw, 1, bounded ? v[12] : lo, bounded ? v[13] : hi};
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.pt < 0 ||
      g.pl < 0 || g.pb < 0 || g.pr < 0 || g.zp_x < lo || g.zp_x > hi || g.zp_y < lo ||
      g.zp_y > hi || g.form < 0 || g.form > 1 || g.lo_q < lo || g.hi_q > hi || g.lo_q > g.hi_q) {
    return error(std::string("torch_fl.bpu ") + op +
                 ": geometry out of range (kernel, strides and dilations >= 1, pads >= 0, zero "
                 "points in the 8-bit type's range, output bytes lo <= hi inside it, form 0 or "
                 "1)");
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
  switch (ort_depthwise::form_here()) {
    case ort_depthwise::Form::kAvx512:
      return "avx512";
    case ort_depthwise::Form::kAvx2:
      return "avx2";
    default:
      return "portable";
  }
}

}  // namespace torch_fl
