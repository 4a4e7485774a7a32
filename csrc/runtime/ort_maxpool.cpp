// 8-bit max pooling over channels-first tensors for the sim executor's ONNX Runtime sessions,
// equal to ONNX Runtime's own MaxPool byte for byte (the max of integers has one answer).
//
// ONNX Runtime pools 8-bit tensors fast only channels-last (its NhwcMaxPool, where its layout
// pass moves a pool next to channels-last convs). A pool it leaves channels-first runs its
// generic per-element loop: DenseNet-121's stem pool, whose output feeds a concat and a float
// batch norm rather than a conv, took 4852 us of a 35.3 ms session at batch 1 on 1 thread (ORT's
// profiler, AVX512-VNNI EPYC), where the same pool channels-last took 72 us. Here each output
// row is two passes over contiguous bytes: the max of the input rows its window covers, in a row
// padded with the type's lowest value (ORT's padding: a pad never wins), then the max over the
// window's columns, every stride-th kept.
//
// Op, in domain "torch_fl.bpu", named by the 8-bit type of x and y:
//   MaxPool<U8|I8>(x, geometry) -> y
//     x         [N, C, H, W] uint8 / int8
//     geometry  [11] int64: KH, KW, stride h, w, pads top, left, bottom, right, dilation h, w,
//               form (0: the fastest form here; 1: the plain loop, for tests that compare them)
//     y         [N, C, OH, OW] of x's type, OH = (H + pads - (KH - 1) * dilation - 1) / stride + 1
//               (floor: ceil_mode 0, the only mode conversion/max_pool.py moves here)
// conversion/max_pool.py writes it in ORT's optimized graph for each MaxPool of a byte tensor.
#include "runtime/ort_maxpool.h"

#include "runtime/ort_kernel.h"
#include "runtime/ort_requant.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace torch_fl {
namespace ort_maxpool {
namespace {

using namespace torch_fl::ort;

// Work for one piece, in bytes compared: below it a pool stays one call (ort_kernel.h).
constexpr int64_t kMinPieceWork = 1 << 16;

// Kernel sizes, strides, dilations and pads above this are refused.
constexpr int64_t kMaxGeometry = int64_t{1} << 24;

struct Pool {
  int64_t kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, form;
  int64_t h, w, oh, ow;
};

// dst[i] = max(dst[i], src[i]) for i < n, and dst[i] = max over k of src[i + k * step] (k < taps),
// the plain loops.
template <class T>
void max_into(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
}
template <class T>
void window_max(const T* src, int64_t n, int64_t taps, int64_t step, T* dst) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
  for (int64_t k = 1; k < taps; ++k) max_into(dst, src + k * step, n);
}

#if defined(TFL_X86_AVX512)
// the lanes of a tail of `left` < 64 bytes (< 32 words)
inline __mmask64 byte_tail(int64_t left) { return (1ULL << left) - 1; }
inline __mmask32 word_tail(int64_t left) { return static_cast<__mmask32>((1u << left) - 1); }

template <class T>
TFL_AVX512 inline __m512i max64(__m512i a, __m512i b) {
  return std::is_signed<T>::value ? _mm512_max_epi8(a, b) : _mm512_max_epu8(a, b);
}

template <class T>
TFL_AVX512 void max_into_avx512(T* dst, const T* src, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i a = _mm512_loadu_si512(dst + i), b = _mm512_loadu_si512(src + i);
    _mm512_storeu_si512(dst + i, max64<T>(a, b));
  }
  if (i < n) {
    const __mmask64 m = byte_tail(n - i);
    const __m512i a = _mm512_maskz_loadu_epi8(m, dst + i), b = _mm512_maskz_loadu_epi8(m, src + i);
    _mm512_mask_storeu_epi8(dst + i, m, max64<T>(a, b));
  }
}

template <class T>
TFL_AVX512 void window_max_avx512(const T* src, int64_t n, int64_t taps, int64_t step, T* dst) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i m = _mm512_loadu_si512(src + i);
    for (int64_t k = 1; k < taps; ++k) m = max64<T>(m, _mm512_loadu_si512(src + i + k * step));
    _mm512_storeu_si512(dst + i, m);
  }
  if (i < n) {
    const __mmask64 tail = byte_tail(n - i);
    __m512i m = _mm512_maskz_loadu_epi8(tail, src + i);
    for (int64_t k = 1; k < taps; ++k) {
      m = max64<T>(m, _mm512_maskz_loadu_epi8(tail, src + i + k * step));
    }
    _mm512_mask_storeu_epi8(dst + i, tail, m);
  }
}

// dst[o] = src[2 * o] for o < n: each 16-bit word's low byte (VPMOVWB), 32 outputs a step.
// src must be readable up to 2 * n.
template <class T>
TFL_AVX512 void every_second_avx512(const T* src, int64_t n, T* dst) {
  int64_t o = 0;
  for (; o + 32 <= n; o += 32) {
    _mm512_mask_cvtepi16_storeu_epi8(dst + o, ~__mmask32{0}, _mm512_loadu_si512(src + 2 * o));
  }
  if (o < n) {
    const __mmask32 tail = word_tail(n - o);
    _mm512_mask_cvtepi16_storeu_epi8(dst + o, tail, _mm512_maskz_loadu_epi16(tail, src + 2 * o));
  }
}
#endif

// Output rows [r0, r1) of the N * C * OH rows: `fast` picks the AVX-512 loops.
template <class T>
void rows(const T* x, T* y, const Pool& g, bool fast, int64_t r0, int64_t r1) {
  (void)fast;
  const T lowest = std::numeric_limits<T>::lowest();
  // columns the windows read, from the left pad on: the input row sits at [pl, pl + w)
  const int64_t span = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int64_t width = std::max(span, g.pl + g.w);
  const int64_t strided = (g.ow - 1) * g.sw + 1;  // stride-1 window maxima the strided keep
  std::vector<T> band(static_cast<size_t>(width), lowest);
  // (+ 1: every_second_avx512 reads a last word's high byte)
  std::vector<T> wide(g.sw > 1 ? static_cast<size_t>(strided + 1) : 0);
  T* row = band.data() + g.pl;
  auto merge = [&](T* dst, const T* src, int64_t n) {
#if defined(TFL_X86_AVX512)
    if (fast) return max_into_avx512(dst, src, n);
#endif
    max_into(dst, src, n);
  };
  auto windows = [&](const T* src, int64_t n, T* dst) {
#if defined(TFL_X86_AVX512)
    if (fast) return window_max_avx512(src, n, g.kw, g.dw, dst);
#endif
    window_max(src, n, g.kw, g.dw, dst);
  };
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t plane = r / g.oh, oh = r % g.oh;
    const T* in = x + plane * g.h * g.w;
    // the rows of this output row's window, maxed into the band (no row: all padding)
    bool any = false;
    for (int64_t k = 0; k < g.kh; ++k) {
      const int64_t ih = oh * g.sh - g.pt + k * g.dh;
      if (ih < 0 || ih >= g.h) continue;
      if (!any) {
        std::memcpy(row, in + ih * g.w, static_cast<size_t>(g.w) * sizeof(T));
        any = true;
      } else {
        merge(row, in + ih * g.w, g.w);
      }
    }
    if (!any) std::fill(row, row + g.w, lowest);
    T* out = y + r * g.ow;
    if (g.sw == 1) {
      windows(band.data(), g.ow, out);
      continue;
    }
    windows(band.data(), strided, wide.data());
#if defined(TFL_X86_AVX512)
    if (fast && g.sw == 2) {
      every_second_avx512(wide.data(), g.ow, out);
      continue;
    }
#endif
    for (int64_t o = 0; o < g.ow; ++o) out[o] = wide[static_cast<size_t>(o * g.sw)];
  }
}

Status* compute(void* kernel, KernelContext* context) {
  const TypedOp& spec = *static_cast<const TypedOp*>(kernel);
  const char* op = spec.name;
  TensorView x, geo;
  TFL_ORT_TRY(read_input(context, 0, &x, op));
  TFL_ORT_TRY(read_input(context, 1, &geo, op));
  if (geo.type != kInt64 || geo.count != 11) {
    return fail(op, "geometry must be 11 int64 values");
  }
  const int64_t* v = static_cast<const int64_t*>(geo.data);
  Pool g{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], 0, 0, 0, 0};
  if (x.type != spec.type || x.dims.size() != 4) {
    return fail(op, std::string("x must be a 4-D tensor (N, C, H, W) of ") +
                        (spec.type == kUint8 ? "uint8" : "int8") + ", got " +
                        shape_text(x.dims) + " of ONNX element type " + std::to_string(x.type));
  }
  // the bound keeps every size below (kernel * dilation + pads) far from int64's range
  const bool huge = std::any_of(v, v + 10, [](int64_t value) { return value > kMaxGeometry; });
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.pt < 0 ||
      g.pl < 0 || g.pb < 0 || g.pr < 0 || g.form < 0 || g.form > 1 || huge) {
    return fail(op, "geometry out of range (kernel, strides and dilations 1 to 2^24, pads 0 to "
                    "2^24, form 0 or 1)");
  }
  g.h = x.dims[2], g.w = x.dims[3];
  if (g.h + g.pt + g.pb < (g.kh - 1) * g.dh + 1 || g.w + g.pl + g.pr < (g.kw - 1) * g.dw + 1) {
    return fail(op, "the padded input " + shape_text(x.dims) + " is smaller than the kernel");
  }
  g.oh = (g.h + g.pt + g.pb - (g.kh - 1) * g.dh - 1) / g.sh + 1;
  g.ow = (g.w + g.pl + g.pr - (g.kw - 1) * g.dw - 1) / g.sw + 1;
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, {x.dims[0], x.dims[1], g.oh, g.ow}, &out));
  const int64_t total_rows = x.dims[0] * x.dims[1] * g.oh;
  if (total_rows == 0 || g.ow == 0 || g.w == 0) {
    return nullptr;
  }
  bool fast = false;
#if defined(TFL_X86_AVX512)
  fast = g.form == 0 && ort::have_avx512();
#endif
  const int64_t row_work = (g.kh * g.w + g.kw * g.ow * g.sw);
  return run_typed_rows(context, spec.type, x.data, out, total_rows, row_work, kMinPieceWork,
                        [&](auto in, auto y, int64_t r0, int64_t r1) {
                          rows(in, y, g, fast, r0, r1);
                        });
}

int input_type(const CustomOp* op, size_t index) {
  return index == 0 ? typed_op(op).type : kInt64;
}
size_t input_count(const CustomOp*) { return 2; }

TypedOp g_ops[] = {
    typed_spec("MaxPoolU8", kUint8, input_type, input_count, compute),
    typed_spec("MaxPoolI8", kInt8, input_type, input_count, compute),
};

}  // namespace
}  // namespace ort_maxpool

std::vector<const ort::CustomOp*> ort::maxpool_ops() {
  return ort::op_list(ort_maxpool::g_ops);
}

const char* maxpool_kernel() {
#if defined(TFL_X86_AVX512)
  if (ort::have_avx512()) return "avx512";
#endif
  return "portable";
}

}  // namespace torch_fl
