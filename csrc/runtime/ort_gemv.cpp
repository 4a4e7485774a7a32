// 8-bit matrix-vector products (a QGemm whose A is one row: a classifier at batch 1; a 1x1
// QLinearConv over one pixel: a squeeze-excitation block's at batch 1) on
// AVX512-VNNI's byte dot products, split over the session's threads by output columns, for the
// sim executor's ONNX Runtime sessions; bit-equal to ONNX Runtime's own QGemm.
//
// ONNX Runtime runs such a QGemm as a GEMM of one row, on one thread: by its profiler
// (MobileNetV3-Small's classifier, batch 1, 2-vCPU Xeon with AMX), 576 -> 1024 took 60 us and
// 1024 -> 1000 78 us on 1 thread, 59 and 68 on 2. Its weights are read once a call, so the time
// is the weights' trip from memory: here `vpdpbusd` adds 4 products per lane, four blocks of 16
// outputs share each broadcast input word, and the columns are cut into pieces so that every
// thread of the session fetches its share.
//
// The accumulator is QGemm's own integer, C + sum(a * w) - zp_a * sum(w) (MLAS's, in int32), so
// corr = C - zp_a * sum_k(w) is formed once by conversion/gemv.py; then ONNX Runtime's output
// step: float(acc) times the column's scale, the scale formed as QGemm forms it (alpha * a_scale
// * b_scale[, / y_scale] in float32, in that order), and for an 8-bit y MLAS's requantization
// (ort_requant.h), its float clamped to the least and greatest output byte where the geometry
// names them (a byte clamp after the op folded in: conversion/clamp_fold.py).
//
// Ops, in domain "torch_fl.bpu", named by a's 8-bit type and whether y is float:
//   Gemv<U8|I8>[F](a, weights, corr, scale, geometry) -> y
//     a         [..., K] uint8 / int8, M rows (the product of the leading dimensions: a
//               QGemm's [M, K], a channels-last conv's [N, H, W, K]; int8 bytes are shifted
//               into uint8, v + 128: corr counts it)
//     weights   [N16 / 16, K4 / 4, 16, 4] int8: w (QGemm's B, zero point 0), by block of 16
//               output columns (N16: N padded with zeros to a multiple of 16), then input word of
//               4 (K4: K padded with zeros to a multiple of 4), then the block's 16 columns, then
//               the word's 4 inputs
//     corr      [N] int32: C - zp * sum_k w (zp: a's zero point, plus 128 for int8 a)
//     scale     [N] float: the output scale of each column
//     geometry  [3] int64: K, y's zero point (unused for float y), form (0: the fastest form
//               here; 1: the plain loop, for tests that compare the two); or [5]: K, y's zero
//               point, the least and greatest output byte, form (8-bit y only)
//     y         [..., N] (a's leading dimensions, then N) float (the F ops), else of a's type
// conversion/gemv.py writes them where the CPU has AVX512-VNNI (`_narrow_kernel()`), for
// QGemms whose A has one row and 1x1 QLinearConvs over one pixel.
#include "runtime/ort_gemv.h"

#include "runtime/ort_kernel.h"
#include "runtime/ort_requant.h"

#include <atomic>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace torch_fl {
namespace ort_gemv {
namespace {

using namespace torch_fl::ort;

std::atomic<uint64_t> g_pieces{0};

struct Geometry {
  int64_t m, k, n, zp_y, form;
  int64_t lo_q, hi_q;  // the output bytes' range (ort_requant.h)
  int64_t words() const { return (k + 3) / 4; }  // K4 / 4
  int64_t blocks() const { return (n + 15) / 16; }
  int64_t block_bytes() const { return words() * 64; }
};

// Row `row` of a as uint8 words, padded with zeros to whole words (int8 shifted by 128), into
// `out` (words() * 4 bytes). Through a raw pointer: stores through the vector's own element
// reference may alias its bookkeeping (char aliasing), and for a thread_local vector each
// reload was a __tls_get_addr call, twice the product's own time on a 1024-byte row.
template <class T>
void load_row(const T* a, const Geometry& g, int64_t row, uint8_t* out) {
  const T* in = a + row * g.k;
  if constexpr (std::is_signed<T>::value) {
    for (int64_t i = 0; i < g.k; ++i) {
      out[i] = static_cast<uint8_t>(static_cast<uint8_t>(in[i]) ^ 0x80u);
    }
  } else {
    std::memcpy(out, in, static_cast<size_t>(g.k));
  }
  std::memset(out + g.k, 0, static_cast<size_t>(g.words() * 4 - g.k));
}

// Columns of blocks [b0, b1) of one row, the plain loop: int32 arithmetic wrapping as MLAS's.
template <class Y>
void blocks_portable(const uint8_t* a, const int8_t* w, const int32_t* corr, const float* scale,
                     const Geometry& g, int64_t b0, int64_t b1, Y* y) {
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* block = w + b * g.block_bytes();
    for (int64_t l = 0; l < 16 && b * 16 + l < g.n; ++l) {
      const int64_t col = b * 16 + l;
      uint32_t acc = static_cast<uint32_t>(corr[col]);
      for (int64_t m = 0; m < g.words(); ++m) {
        for (int64_t j = 0; j < 4; ++j) {
          const int32_t product = static_cast<int32_t>(a[m * 4 + j]) * block[m * 64 + l * 4 + j];
          acc += static_cast<uint32_t>(product);
        }
      }
      const float value = static_cast<float>(static_cast<int32_t>(acc));
      if constexpr (std::is_same<Y, float>::value) {
        y[col] = value * scale[col];
      } else {
        y[col] = requantize<Y>(value, scale[col], g.zp_y, g.lo_q, g.hi_q);
      }
    }
  }
}

#if defined(TFL_X86_AVX512)
// B blocks of 16 columns from block b: each input word broadcast once for the B blocks.
template <class Y, int B>
TFL_VNNI inline void blocks_tile(const uint8_t* a, const int8_t* w, const int32_t* corr,
                                 const float* scale, const Geometry& g, int64_t b, Y* y) {
  __m512i acc[B];
  const int8_t* base[B];
#pragma GCC unroll 4
  for (int t = 0; t < B; ++t) {
    const __mmask16 m = tail_mask(g.n - (b + t) * 16);
    acc[t] = _mm512_maskz_loadu_epi32(m, corr + (b + t) * 16);
    base[t] = w + (b + t) * g.block_bytes();
  }
  const int64_t words = g.words();
  for (int64_t m = 0; m < words; ++m) {
    int32_t word;
    std::memcpy(&word, a + 4 * m, sizeof word);
    const __m512i x = _mm512_set1_epi32(word);
#pragma GCC unroll 4
    for (int t = 0; t < B; ++t) {
      acc[t] = _mm512_dpbusd_epi32(acc[t], x, _mm512_loadu_si512(base[t] + m * 64));
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < B; ++t) {
    const int64_t col = (b + t) * 16;
    const __mmask16 m = tail_mask(g.n - col);
    const __m512 value = _mm512_cvtepi32_ps(acc[t]);  // nearest even, as MLAS converts
    const __m512 s = _mm512_maskz_loadu_ps(m, scale + col);
    if constexpr (std::is_same<Y, float>::value) {
      _mm512_mask_storeu_ps(y + col, m, _mm512_mul_ps(value, s));
    } else {
      store16(value, s, Requant<Y>(g.zp_y, g.lo_q, g.hi_q), m, y + col);
    }
  }
}

template <class Y>
TFL_VNNI void blocks_vnni(const uint8_t* a, const int8_t* w, const int32_t* corr,
                          const float* scale, const Geometry& g, int64_t b0, int64_t b1, Y* y) {
  int64_t b = b0;
  for (; b + 4 <= b1; b += 4) {
    blocks_tile<Y, 4>(a, w, corr, scale, g, b, y);
  }
  for (; b < b1; ++b) {
    blocks_tile<Y, 1>(a, w, corr, scale, g, b, y);
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

// Blocks [b0, b1) of every row.
template <class T, class Y>
void columns(const T* a, const int8_t* w, const int32_t* corr, const float* scale,
             const Geometry& g, int64_t b0, int64_t b1, Y* y) {
  thread_local std::vector<uint8_t> buffer;
  buffer.resize(static_cast<size_t>(g.words() * 4));
  uint8_t* row = buffer.data();
  const bool fast = g.form == 0 && fast_form_here();
  for (int64_t r = 0; r < g.m; ++r) {
    load_row(a, g, r, row);
    Y* out = y + r * g.n;
#if defined(TFL_X86_AVX512)
    if (fast) {
      blocks_vnni(row, w, corr, scale, g, b0, b1, out);
      continue;
    }
#endif
    (void)fast;
    blocks_portable(row, w, corr, scale, g, b0, b1, out);
  }
}

// Work for one piece, in multiply-adds: as ort_depthwise.cpp's bound (a piece handed to another
// thread costs a few microseconds; MobileNetV3's 1024 -> 1000 is 8 pieces of 128 columns).
constexpr int64_t kMinPieceWork = 1 << 17;

Status* compute(void* kernel, KernelContext* context) {
  const GemmOp& spec = *static_cast<const GemmOp*>(kernel);
  const char* op = spec.name;
  TensorView a, w, corr, scale, geo;
  TFL_ORT_TRY(read_input(context, 0, &a, op));
  TFL_ORT_TRY(read_input(context, 1, &w, op));
  TFL_ORT_TRY(read_input(context, 2, &corr, op));
  TFL_ORT_TRY(read_input(context, 3, &scale, op));
  TFL_ORT_TRY(read_input(context, 4, &geo, op));
  if (geo.type != kInt64 || (geo.count != 3 && geo.count != 5)) {
    return fail(op, "geometry must be 3 int64 values (K, y's zero point, form) or 5 (K, y's zero "
                    "point, least and greatest output byte, form)");
  }
  const int64_t* v = static_cast<const int64_t*>(geo.data);
  const bool bounded = geo.count == 5;
  Geometry g{0, v[0], static_cast<int64_t>(corr.count), v[1], v[geo.count - 1], 0, 0};
  if (a.type != spec.type || a.dims.empty() || a.dims.back() != g.k) {
    return fail(op, std::string("a must be a tensor of ") +
                        (spec.type == kUint8 ? "uint8" : "int8") + " whose last dimension is K = " +
                        std::to_string(g.k) + ", got " + shape_text(a.dims) +
                        " of ONNX element type " + std::to_string(a.type));
  }
  const int64_t lo = spec.type == kUint8 ? 0 : -128, hi = spec.type == kUint8 ? 255 : 127;
  const bool float_out = spec.out_type == kFloat;
  g.lo_q = bounded ? v[2] : lo, g.hi_q = bounded ? v[3] : hi;
  if (g.k < 1 || g.n < 1 || g.form < 0 || g.form > 1 ||
      (!float_out && (g.zp_y < lo || g.zp_y > hi)) || g.lo_q < lo || g.hi_q > hi ||
      g.lo_q > g.hi_q || (bounded && float_out)) {
    return fail(op, "geometry out of range (K >= 1, one or more columns, form 0 or 1, y's zero "
                    "point in the 8-bit type's range, output bytes lo <= hi inside it, for an "
                    "8-bit y only)");
  }
  const size_t weights = static_cast<size_t>(g.blocks() * g.block_bytes());
  if (w.type != kInt8 || w.count != weights) {
    return fail(op, "weights must be " + std::to_string(weights) +
                        " int8 values ([N16 / 16, K4 / 4, 16, 4]), got " +
                        std::to_string(w.count));
  }
  if (corr.type != kInt32) {
    return fail(op, "corr must be int32 values, one per output column");
  }
  if (scale.type != kFloat || scale.count != static_cast<size_t>(g.n)) {
    return fail(op, "scale must be " + std::to_string(g.n) + " floats");
  }
  std::vector<int64_t> dims = a.dims;
  dims.back() = g.n;
  g.m = static_cast<int64_t>(a.count) / g.k;
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, dims, &out));
  if (g.m == 0) {
    return nullptr;
  }
  // pieces of whole blocks of 64 columns (the tile), by the work of each block over every row
  const int64_t tiles = (g.blocks() + 3) / 4;
  const int64_t tile_work = g.m * g.k * 64;
  const int64_t per = rows_per_piece(tiles, tile_work, kMinPieceWork);
  const int64_t count = row_piece_count(tiles, tile_work, kMinPieceWork);
  g_pieces.fetch_add(static_cast<uint64_t>(count), std::memory_order_relaxed);
  const int8_t* wt = static_cast<const int8_t*>(w.data);
  const int32_t* cf = static_cast<const int32_t*>(corr.data);
  const float* sf = static_cast<const float*>(scale.data);
  return run_parts(context, count, [&](int64_t i) {
    const int64_t b0 = i * per * 4, b1 = std::min(g.blocks(), (i + 1) * per * 4);
    if (b0 >= b1) {
      return;
    }
    if (spec.type == kUint8) {
      const uint8_t* x = static_cast<const uint8_t*>(a.data);
      if (spec.out_type == kFloat) {
        columns(x, wt, cf, sf, g, b0, b1, static_cast<float*>(out));
      } else {
        columns(x, wt, cf, sf, g, b0, b1, static_cast<uint8_t*>(out));
      }
    } else {
      const int8_t* x = static_cast<const int8_t*>(a.data);
      if (spec.out_type == kFloat) {
        columns(x, wt, cf, sf, g, b0, b1, static_cast<float*>(out));
      } else {
        columns(x, wt, cf, sf, g, b0, b1, static_cast<int8_t*>(out));
      }
    }
  });
}

int input_type(const CustomOp* op, size_t index) {
  static const int types[] = {kUndefined, kInt8, kInt32, kFloat, kInt64};
  return index == 0 ? gemm_op(op).type : types[index];
}
size_t input_count(const CustomOp*) { return 5; }

GemmOp g_ops[] = {
    gemm_spec("GemvU8", kUint8, kUint8, input_type, input_count, compute),
    gemm_spec("GemvU8F", kUint8, kFloat, input_type, input_count, compute),
    gemm_spec("GemvI8", kInt8, kInt8, input_type, input_count, compute),
    gemm_spec("GemvI8F", kInt8, kFloat, input_type, input_count, compute),
};

}  // namespace
}  // namespace ort_gemv

std::vector<const ort::CustomOp*> ort::gemv_ops() { return ort::op_list(ort_gemv::g_ops); }

uint64_t gemv_pieces() { return ort_gemv::g_pieces.load(std::memory_order_relaxed); }

const char* gemv_kernel() { return ort_gemv::fast_form_here() ? "vnni" : "portable"; }

}  // namespace torch_fl
