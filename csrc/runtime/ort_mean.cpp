// The mean of a float table lookup over some axes, in one pass over the bytes, for the sim
// executor's ONNX Runtime sessions: what LookupF32 (ort_lookup.cpp) followed by ONNX Runtime's
// ReduceMean gives, float for float.
//
// A squeeze-excitation block means its hardswish over the spatial axes: ORT ran a LookupF32
// writing the float tensor and a ReduceMean reading it back, 8 times in MobileNetV3-Small; with
// the 8 pairs gone its integer session at batch 1 took 0.60 against 0.73 and 0.75 ms (by hand,
// two runs, medians of nine blocks of 100). ORT's ReduceMean adds in one of two orders, by the
// shape once the axes of size 1 are dropped (reduction_ops.h):
//   - reduced axes first ([1, H, W, C] over H and W, its "RK" form): each output from 0.0, the
//     rows added in turn, then divided by the row count;
//   - kept axes before them too ([N, H, W, C], N > 1, its "KRK" form): per item, a 1-row matrix
//     product with a vector of ones, whose x86 kernel (MlasSgemmKernelM1Avx) adds the rows in
//     groups of 4, then of 2, then 1, each group left to right and then to the sum so far;
//     then the division. Other CPUs' kernels may add otherwise: conversion/lookup_mean.py writes
//     this form only where a probe session on this CPU gave ORT's own floats.
// This op does the same additions in the same order on table[x] (ort_lookup.h, MeanOrder), so
// each output is the same float. MobileNetV3-Small at batch 8 (ORT's profiler, 1 thread, a
// 2-vCPU Zen 3): its nine pairs took 1318 us as LookupF32 and ReduceMean (docs/compile.md).
//
// Op, in domain "torch_fl.bpu":
//   LookupMeanF32(table[256] float, x, axes, options) -> y
//     x         uint8 or int8 (the table is indexed by the raw byte)
//     axes      int64 [k]: the reduced axes, ascending, contiguous, at least two outputs after
//               them
//     options   int64 [2] or [3]: keepdims (1 keeps the reduced axes as size 1, 0 drops them),
//               form (0: the fastest form here; 1: the plain loop, for tests that compare the
//               two), and the order of an item's additions where the axes before the reduced
//               ones hold more than one item (0 or absent: such an x is refused; 1: groups of
//               four, the KRK form above)
#include "runtime/ort_kernel.h"
#include "runtime/ort_lookup.h"

#include <algorithm>
#include <string>
#include <vector>

namespace torch_fl {
namespace ort_mean {
namespace {

using namespace torch_fl::ort;

Status* fail(const std::string& what) {
  return error("torch_fl.bpu LookupMeanF32: " + what);
}

// Table lookups (rows x columns) a piece makes at least: handing a piece to another thread costs
// ~2 us (ort_lookup.cpp, where the bounds were tuned together). Pieces are ranges of 64 columns,
// each added up in row order, so the sums are those of one thread.
constexpr int64_t kMinPieceWork = 8192;

Status* compute(void* kernel, KernelContext* context) {
  const char* op = static_cast<const TypedOp*>(kernel)->name;
  TensorView table, x, axes, options;
  TFL_ORT_TRY(read_input(context, 0, &table, op));
  TFL_ORT_TRY(read_input(context, 1, &x, op));
  TFL_ORT_TRY(read_input(context, 2, &axes, op));
  TFL_ORT_TRY(read_input(context, 3, &options, op));
  if (table.type != kFloat || table.count != 256) {
    return fail("the table must be 256 floats, one per input byte");
  }
  if (x.type != kUint8 && x.type != kInt8) {
    return fail("x must be uint8 or int8 (ONNX element type " + std::to_string(x.type) + ")");
  }
  if (axes.type != kInt64 || axes.count == 0 || options.type != kInt64 ||
      (options.count != 2 && options.count != 3)) {
    return fail("axes must be a non-empty int64 list and options two or three int64 (keepdims, "
                "form[, order])");
  }
  const int64_t* opt = static_cast<const int64_t*>(options.data);
  const int64_t* ax = static_cast<const int64_t*>(axes.data);
  const bool grouped = options.count == 3 && opt[2] == 1;
  if (options.count == 3 && opt[2] != 0 && opt[2] != 1) {
    return fail("the order option must be 0 (row after row) or 1 (groups of four), got " +
                std::to_string(opt[2]));
  }
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  const int64_t first = ax[0], last = ax[axes.count - 1];
  bool sound = first >= 0 && last < rank && last - first + 1 == static_cast<int64_t>(axes.count);
  for (size_t i = 1; sound && i < axes.count; ++i) {
    sound = ax[i] == ax[i - 1] + 1;
  }
  int64_t items = 1, rows = 1, cols = 1;
  for (int64_t d = 0; sound && d < rank; ++d) {
    const int64_t size = x.dims[static_cast<size_t>(d)];
    (d < first ? items : d <= last ? rows : cols) *= size;
  }
  if (!sound || cols < 2 || rows < 1 || (items > 1 && !grouped)) {
    return fail("x " + shape_text(x.dims) +
                " is not reduced over contiguous axes with at least two outputs left after them" +
                (items > 1 && !grouped ? " and only axes of size 1 before them" : "") +
                " (the order in which ONNX Runtime's ReduceMean adds rows); the sim writes this "
                "op only for such a reduction");
  }
  std::vector<int64_t> out_dims;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < first || d > last) {
      out_dims.push_back(x.dims[static_cast<size_t>(d)]);
    } else if (opt[0] != 0) {
      out_dims.push_back(1);
    }
  }
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, out_dims, &out));
  if (items == 0) {
    return nullptr;
  }
  // mean_floats (ort_lookup.cpp): each 64 outputs' sums in registers on AVX512-VBMI, 10.7 us
  // for MobileNetV3's 14x14x240 mean (ORT's profiler); a first form that gathered 16 floats at a
  // time took 43 us there, and its session ran slower than with the separate lookup and
  // ReduceMean (fastest of nine blocks of 100 runs at batch 1: 0.798 and 0.790 against 0.703 and
  // 0.703 ms, by hand). One item (ORT's RK form) is row order even where the option says groups.
  const MeanOrder order = items > 1 ? MeanOrder::kGroupsOfFour : MeanOrder::kRowOrder;
  const float* tab = static_cast<const float*>(table.data);
  const uint8_t* in = static_cast<const uint8_t*>(x.data);
  float* y = static_cast<float*>(out);
  const bool portable = opt[1] != 0;
  // pieces: ranges of whole 64s of one item's columns
  const int64_t chunks = (cols + 63) / 64;
  const int64_t want = std::max<int64_t>(
      1, std::min<int64_t>({kMaxPieces, items * chunks, items * rows * cols / kMinPieceWork}));
  const int64_t per_item = std::max<int64_t>(1, want / items);
  const int64_t per = (chunks + per_item - 1) / per_item * 64;  // columns a piece, whole 64s
  const int64_t pieces_an_item = (cols + per - 1) / per;
  return run_parts(context, items * pieces_an_item, [&](int64_t i) {
    const int64_t item = i / pieces_an_item;
    const int64_t c0 = (i % pieces_an_item) * per, c1 = std::min(cols, c0 + per);
    mean_floats(tab, in + item * rows * cols + c0, static_cast<size_t>(rows),
                static_cast<size_t>(c1 - c0), static_cast<size_t>(cols), y + item * cols + c0,
                order, portable);
  });
}

int input_type(const CustomOp*, size_t index) {
  static const int types[] = {kFloat, kUndefined, kInt64, kInt64};
  return types[index];
}
size_t input_count(const CustomOp*) { return 4; }

TypedOp g_ops[] = {
    typed_spec("LookupMeanF32", kFloat, input_type, input_count, compute),
};

}  // namespace
}  // namespace ort_mean

std::vector<const ort::CustomOp*> ort::mean_ops() {
  return ort::op_list(ort_mean::g_ops);
}

}  // namespace torch_fl
