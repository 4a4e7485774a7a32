// Exact 8-bit GEMMs on AVX2's 16-bit products (`vpmaddwd`), for the sim executor's ONNX Runtime
// sessions on x86 CPUs with AVX2 and no AVX-512: a channels-last 1x1 QLinearConv (MobileNet's
// pointwise convs), a QGemm, or a QLinearMatMul by a constant matrix (ViT's linear layers);
// bit-equal to ONNX Runtime's own op.
//
// Without VNNI, ORT's fast int8 kernels multiply u8 by s8 with `vpmaddubsw`, whose int16 pair
// sums saturate, so the sim gives them u8 weights (runtime/sim_kernels.py: the `mixed` path) and
// ORT runs them on its u8u8 kernels, which were slower than its float ones there: by ORT's
// profiler (emulated AVX2 on an AVX-512 Xeon, 1 thread), MobileNetV3-Small's 1x1 conv from 16 to
// 72 channels at 56x56 took 221 us as u8u8 against 97 us as float. Here each input pair (two
// channels of one pixel, or two of one row of A) is widened once to two int16s in a 32-bit word,
// broadcast, and `vpmaddwd` multiplies it with 8 output columns' two int16 weights and adds each
// pair into an int32: exact (|x| <= 255, |w| <= 255), 16 products an instruction. A tile of
// pixels (or rows) shares each weight vector, a block of 16 outputs shares each broadcast.
//
// The accumulator is the ORT op's integer, sum(x * w) + (bias - zp_x * sum(w)): `corr`, formed
// once by conversion/pair_gemm.py (int8 x read as x + 128, as ort_gemv.cpp reads it, its zero
// point shifted with it). Then ORT's output step: float(acc) times the column's scale, and for an
// 8-bit y MLAS's requantization (ort_requant.h).
//
// Ops, in domain "torch_fl.bpu", named by x's 8-bit type and whether y is float:
//   PairGemm<U8|I8>[F](x, weights, corr, scale, geometry) -> y
//     x         [..., K] uint8 / int8: rows of K (a channels-last conv's pixels, or A's rows)
//     weights   [N16 / 16, K2, 16, 2] int16: w less its zero point, by block of 16 outputs (N16:
//               N padded with zeros to a multiple of 16), then input pair (K2: K padded with a
//               zero to even), then the block's 16 outputs, then the pair's 2 inputs
//     corr      [N] int32: bias - zp * sum_k w (zp: x's zero point, plus 128 for int8 x)
//     scale     [N] float: the output scale of each column
//     geometry  [3] int64: K, y's zero point (unused for float y), form (0: the fastest form
//               here; 1: the plain loop, for tests that compare the two); or [5]: K, y's zero
//               point, the least and greatest output byte (a clamp that followed the op,
//               folded in: conversion/clamp_fold.py; 8-bit y only), form
//     y         [..., N] float (the F ops), else of x's type
// conversion/pair_gemm.py writes them where the sim's integer kernels are the u8u8 ones and the
// CPU has AVX2 but no AVX-512 (runtime/executors.takes_pair_gemms).
#include "runtime/ort_pair_gemm.h"

#include "runtime/ort_kernel.h"
#include "runtime/ort_requant.h"

#include <atomic>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace torch_fl {
namespace ort_pair_gemm {
namespace {

using namespace torch_fl::ort;

struct Geometry {
  int64_t m, k, n, zp_y, form;
  int64_t lo_q, hi_q;  // the output bytes' range (ort_requant.h)
  int64_t pairs() const { return (k + 1) / 2; }  // K2
  int64_t blocks() const { return (n + 15) / 16; }
  int64_t block_words() const { return pairs() * 16; }  // int32 words (16-bit pairs) a block
};

// Rows of x in one tile: widened once, then read for each block of 16 outputs while the block's
// weights stay in the L1 cache (K2 x 64 bytes: 18 KB for K = 576).
constexpr int64_t kTileRows = 48;

#if defined(TFL_X86_AVX512)
// 16 bytes at a time of a row widened to int16 (int8 shifted by 128); returns how many it did.
template <class T>
TFL_AVX2_FMA int64_t widen_avx2(const T* in, int64_t k, int16_t* dst) {
  const __m128i flip = _mm_set1_epi8(std::is_signed<T>::value ? static_cast<char>(0x80) : 0);
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m128i bytes =
        _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)), flip);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_cvtepu8_epi16(bytes));
  }
  return i;
}

#endif

// Rows [r0, r1) of x widened to int16 pairs: row r's value k at out[(r - r0) * 2 * K2 + k], int8
// shifted by 128 (corr counts it), and a zero past an odd K. Through raw pointers (ort_gemv.cpp:
// a thread_local vector's reloads cost a __tls_get_addr call each).
template <class T>
void widen_rows(const T* x, const Geometry& g, int64_t r0, int64_t r1, int16_t* out) {
  const int64_t stride = 2 * g.pairs();
  for (int64_t r = r0; r < r1; ++r) {
    const T* in = x + r * g.k;
    int16_t* dst = out + (r - r0) * stride;
    int64_t k = 0;
#if defined(TFL_X86_AVX512)
    if (have_avx2_fma()) {
      k = widen_avx2(in, g.k, dst);
    }
#endif
    for (; k < g.k; ++k) {
      dst[k] = static_cast<int16_t>(std::is_signed<T>::value ? static_cast<int>(in[k]) + 128
                                                             : static_cast<int>(in[k]));
    }
    if (g.k % 2 != 0) {
      dst[g.k] = 0;
    }
  }
}

// Output column `col` of one widened row, the plain loop: int32 arithmetic wrapping as MLAS's.
inline int32_t dot_portable(const int16_t* row, const int16_t* w, const int32_t* corr,
                            const Geometry& g, int64_t col) {
  const int16_t* block = w + (col / 16) * g.block_words() * 2;
  const int64_t lane = col % 16;
  uint32_t acc = static_cast<uint32_t>(corr[col]);
  for (int64_t p = 0; p < g.pairs(); ++p) {
    for (int64_t j = 0; j < 2; ++j) {
      acc += static_cast<uint32_t>(static_cast<int32_t>(row[2 * p + j]) *
                                   block[(p * 16 + lane) * 2 + j]);
    }
  }
  return static_cast<int32_t>(acc);
}

template <class Y>
inline void put(float value, float scale, int64_t zp_y, int64_t lo_q, int64_t hi_q, Y* out) {
  if constexpr (std::is_same<Y, float>::value) {
    *out = value * scale;
  } else {
    *out = requantize<Y>(value, scale, zp_y, lo_q, hi_q);
  }
}

template <class Y>
void tile_portable(const int16_t* rows, int64_t count, const int16_t* w, const int32_t* corr,
                   const float* scale, const Geometry& g, Y* y) {
  for (int64_t r = 0; r < count; ++r) {
    const int16_t* row = rows + r * 2 * g.pairs();
    for (int64_t col = 0; col < g.n; ++col) {
      const int32_t acc = dot_portable(row, w, corr, g, col);
      put(static_cast<float>(acc), scale[col], g.zp_y, g.lo_q, g.hi_q, y + r * g.n + col);
    }
  }
}

#if defined(TFL_X86_AVX512)
// The output step of 8 columns [col, col + 8) of one row: the accumulators (corr included) as
// float, times the scale, then stored (requantized for an 8-bit y); `left` of them are real.
template <class Y>
TFL_AVX2_FMA inline void store_cols(__m256i acc, __m256 s, const Requant8<Y>& q, int64_t left,
                                    Y* out) {
  if (left <= 0) {
    return;
  }
  const __m256 value = _mm256_cvtepi32_ps(acc);  // nearest even, as MLAS converts
  if constexpr (std::is_same<Y, float>::value) {
    _mm256_maskstore_ps(out, lanes8(left), _mm256_mul_ps(value, s));
  } else {
    store8(value, s, q, left, out);
  }
}

// R widened rows against one block of 16 outputs (V = 2), or its first 8 (V = 1: a last block of
// at most 8 real columns): each weight vector loaded once for the R rows, each row's pair
// broadcast once for the block's vectors; the accumulators start at corr.
template <class Y, int R, int V>
TFL_AVX2_FMA inline void block_rows(const int16_t* rows, const int16_t* block, const __m256i (&c)[2],
                                    const __m256 (&s)[2], const Requant8<Y>& q, const Geometry& g,
                                    int64_t col, Y* y) {
  __m256i acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      acc[r][v] = c[v];
    }
  }
  const int64_t pairs = g.pairs();
  const int32_t* words = reinterpret_cast<const int32_t*>(rows);
  for (int64_t p = 0; p < pairs; ++p) {
    __m256i w[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      w[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + p * 32 + 16 * v));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t word;
      std::memcpy(&word, words + r * pairs + p, sizeof word);
      const __m256i b = _mm256_set1_epi32(word);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) {
        acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(b, w[v]));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      store_cols(acc[r][v], s[v], q, g.n - col - 8 * v, y + r * g.n + col + 8 * v);
    }
  }
}

// Rows per register tile: 6 rows x 2 vectors of accumulators, 2 weight vectors and the
// broadcast fill 15 of AVX2's 16 registers. (4 rows ran MobileNetV3's 1x1 convs and ViT-S/16's
// GEMMs 5 to 10 % slower.)
constexpr int kRegisterRows = 6;

// `count` rows (at most kRegisterRows) against one block, V vectors wide.
template <class Y, int V>
TFL_AVX2_FMA void block_tile(const int16_t* rows, int64_t count, int64_t stride,
                             const int16_t* block, const __m256i (&c)[2], const __m256 (&s)[2],
                             const Requant8<Y>& q, const Geometry& g, int64_t col, Y* y) {
  switch (count) {
    case 6:
      return block_rows<Y, 6, V>(rows, block, c, s, q, g, col, y);
    case 5:
      return block_rows<Y, 5, V>(rows, block, c, s, q, g, col, y);
    case 4:
      return block_rows<Y, 4, V>(rows, block, c, s, q, g, col, y);
    case 3:
      return block_rows<Y, 3, V>(rows, block, c, s, q, g, col, y);
    case 2:
      return block_rows<Y, 2, V>(rows, block, c, s, q, g, col, y);
    default:
      for (int64_t r = 0; r < count; ++r) {
        block_rows<Y, 1, V>(rows + r * stride, block, c, s, q, g, col, y + r * g.n);
      }
  }
}

template <class Y>
TFL_AVX2_FMA void tile_avx2(const int16_t* rows, int64_t count, const int16_t* w,
                            const int32_t* corr, const float* scale, const Geometry& g, Y* y) {
  const int64_t stride = 2 * g.pairs();
  const Requant8<Y> q(g.zp_y, g.lo_q, g.hi_q);
  for (int64_t b = 0; b < g.blocks(); ++b) {
    const int16_t* block = w + b * g.block_words() * 2;
    const int64_t col = b * 16;
    __m256i c[2];
    __m256 s[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i mask = lanes8(g.n - col - 8 * h);
      c[h] = _mm256_maskload_epi32(corr + col + 8 * h, mask);
      s[h] = _mm256_maskload_ps(scale + col + 8 * h, mask);
    }
    const bool half = g.n - col <= 8;  // the second vector's columns are all padding
    for (int64_t r = 0; r < count; r += kRegisterRows) {
      const int64_t n = std::min<int64_t>(kRegisterRows, count - r);
      if (half) {
        block_tile<Y, 1>(rows + r * stride, n, stride, block, c, s, q, g, col, y + r * g.n);
      } else {
        block_tile<Y, 2>(rows + r * stride, n, stride, block, c, s, q, g, col, y + r * g.n);
      }
    }
  }
}
#endif

bool fast_form_here() {
#if defined(TFL_X86_AVX512)
  return have_avx2_fma();
#else
  return false;
#endif
}

// Rows [r0, r1) of y, a tile of kTileRows at a time.
template <class T, class Y>
void rows(const T* x, const int16_t* w, const int32_t* corr, const float* scale,
          const Geometry& g, int64_t r0, int64_t r1, Y* y) {
  thread_local std::vector<int16_t> buffer;
  buffer.resize(static_cast<size_t>(kTileRows * 2 * g.pairs()));
  int16_t* widened = buffer.data();
  const bool fast = g.form == 0 && fast_form_here();
  for (int64_t t = r0; t < r1; t += kTileRows) {
    const int64_t count = std::min(kTileRows, r1 - t);
    widen_rows(x, g, t, t + count, widened);
    Y* out = y + t * g.n;
#if defined(TFL_X86_AVX512)
    if (fast) {
      tile_avx2(widened, count, w, corr, scale, g, out);
      continue;
    }
#endif
    (void)fast;
    tile_portable(widened, count, w, corr, scale, g, out);
  }
}

// Work for one piece, in multiply-adds (a piece handed to another thread costs a few
// microseconds). It was 2^20, under which MobileNetV3-Small's 1x1 convs at 28x28 and 14x14
// (784 x 72 x 32 = 1.8 M, at batch 1) stayed one piece: by ORT's profiler on a 2-vCPU Zen 3
// EPYC they took 1.02 to 1.05 times as long on 2 threads as on 1. At 2^18 its sim session at
// batch 1 on 2 threads took 0.924 of its time before (median of 40 paired blocks of ten runs, one
// process), and 1.004 on 1 thread, 0.994 at batch 8 on 2, 0.999 for ViT-S/16 at batch 1 on 2:
// those pieces were large already.
constexpr int64_t kMinPieceWork = 1 << 18;

// The pieces the ops' calls split into, counted for tests (torch_fl._C._pair_gemm_pieces).
std::atomic<uint64_t> g_pieces{0};

Status* compute(void* kernel, KernelContext* context) {
  const GemmOp& spec = *static_cast<const GemmOp*>(kernel);
  const char* op = spec.name;
  TensorView x, w, corr, scale, geo;
  TFL_ORT_TRY(read_input(context, 0, &x, op));
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
  const char* type_name = spec.type == kUint8 ? "uint8" : "int8";
  if (x.type != spec.type || x.dims.empty() || x.dims.back() != g.k) {
    return fail(op, std::string("x must be a tensor of ") + type_name + " whose last dimension "
                    "is K = " + std::to_string(g.k) + ", got " + shape_text(x.dims) +
                    " of ONNX element type " + std::to_string(x.type));
  }
  const int64_t lo = spec.type == kUint8 ? 0 : -128, hi = spec.type == kUint8 ? 255 : 127;
  const bool float_out = spec.out_type == kFloat;
  g.lo_q = bounded ? v[2] : lo, g.hi_q = bounded ? v[3] : hi;
  if (g.k < 1 || g.form < 0 || g.form > 1 || (!float_out && (g.zp_y < lo || g.zp_y > hi)) ||
      g.lo_q < lo || g.hi_q > hi || g.lo_q > g.hi_q || (bounded && float_out)) {
    return fail(op, "geometry out of range (K >= 1, y's zero point in the 8-bit type's range, "
                    "output bytes lo <= hi inside it, for an 8-bit y only; form 0 or 1)");
  }
  if (corr.type != kInt32 || g.n < 1) {
    return fail(op, "corr must be N >= 1 int32 values");
  }
  if (scale.type != kFloat || scale.count != corr.count) {
    return fail(op, "scale must be N = " + std::to_string(g.n) + " floats");
  }
  const int64_t expect = g.blocks() * g.block_words() * 2;
  if (w.type != kInt16 || w.count != static_cast<size_t>(expect)) {
    return fail(op, "weights must be " + std::to_string(expect) +
                        " int16 values ([N16 / 16, K2, 16, 2]), got " + std::to_string(w.count));
  }
  std::vector<int64_t> dims = x.dims;
  dims.back() = g.n;
  g.m = static_cast<int64_t>(x.count) / g.k;
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, dims, &out));
  if (g.m == 0) {
    return nullptr;
  }
  const int16_t* wt = static_cast<const int16_t*>(w.data);
  const int32_t* cf = static_cast<const int32_t*>(corr.data);
  const float* sf = static_cast<const float*>(scale.data);
  const int64_t row_work = g.k * g.blocks() * 16;
  g_pieces.fetch_add(static_cast<uint64_t>(row_piece_count(g.m, row_work, kMinPieceWork)),
                     std::memory_order_relaxed);
  return run_row_parts(context, g.m, row_work, kMinPieceWork,
                       [&](int64_t r0, int64_t r1) {
                         const bool u8 = spec.type == kUint8;
                         if (float_out) {
                           float* y = static_cast<float*>(out);
                           u8 ? rows(static_cast<const uint8_t*>(x.data), wt, cf, sf, g, r0, r1, y)
                              : rows(static_cast<const int8_t*>(x.data), wt, cf, sf, g, r0, r1, y);
                         } else if (u8) {
                           rows(static_cast<const uint8_t*>(x.data), wt, cf, sf, g, r0, r1,
                                static_cast<uint8_t*>(out));
                         } else {
                           rows(static_cast<const int8_t*>(x.data), wt, cf, sf, g, r0, r1,
                                static_cast<int8_t*>(out));
                         }
                       });
}

int input_type(const CustomOp* op, size_t index) {
  static const int types[] = {kUndefined, kInt16, kInt32, kFloat, kInt64};
  return index == 0 ? gemm_op(op).type : types[index];
}
size_t input_count(const CustomOp*) { return 5; }

GemmOp g_ops[] = {
    gemm_spec("PairGemmU8", kUint8, kUint8, input_type, input_count, compute),
    gemm_spec("PairGemmI8", kInt8, kInt8, input_type, input_count, compute),
    gemm_spec("PairGemmU8F", kUint8, kFloat, input_type, input_count, compute),
    gemm_spec("PairGemmI8F", kInt8, kFloat, input_type, input_count, compute),
};

}  // namespace
}  // namespace ort_pair_gemm

std::vector<const ort::CustomOp*> ort::pair_gemm_ops() {
  return ort::op_list(ort_pair_gemm::g_ops);
}

const char* pair_gemm_kernel() { return ort_pair_gemm::fast_form_here() ? "avx2" : "portable"; }

uint64_t pair_gemm_pieces() { return ort_pair_gemm::g_pieces.load(std::memory_order_relaxed); }

}  // namespace torch_fl
