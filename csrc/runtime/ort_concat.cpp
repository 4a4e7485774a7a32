// An 8-bit concat whose inputs each pass through a 256-entry table on the way, for the sim
// executor's ONNX Runtime sessions: ONNX Runtime's QLinearConcat, with the byte lookup that
// feeds each input (a ReLU's clamp) folded into the input's requantization.
//
// ONNX Runtime's QLinearConcat requantizes an input whose scale or zero point differs from the
// output's through a 256-byte table of its own, one byte at a time; an input alike is copied.
// In GoogLeNet's inception blocks every branch ends in a conv, then the ReLU's clamp (a byte
// lookup op: the BPU's symmetric int8 clamps at the zero point, which QLinearConv cannot do),
// then the concat: five ops and three passes over the bytes per block. By ORT's profiler (batch
// 1, 1 thread, AVX512-VNNI EPYC), the sim session spent 315 us in concats and 384 us in its 57
// lookups, of 10.4 ms. Here a table is the lookup's, then the requantization's
// (conversion/concat_lookup.py builds it with ORT's own QLinearConcat over every byte), so the
// concat is one pass: each input's rows looked up into their slice of the output.
//
// Op, in domain "torch_fl.bpu", named by the 8-bit type of the x's and y:
//   ConcatLookup<U8|I8>(tables, geometry, x_0, ..., x_{K-1}) -> y
//     tables    [K, 256] of that type: y's bytes for x_k's byte b are tables[k][b]
//     geometry  [2] int64: axis (negative counts from the end), form (0: the fastest form here;
//               1: the plain loop, for tests that compare them)
//     x_k       of that type, one rank, equal sizes but along `axis`
//     y         the x's joined along `axis`
// An input whose table is the identity is copied.
#include "runtime/ort_kernel.h"
#include "runtime/ort_lookup.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

namespace torch_fl {
namespace ort_concat {
namespace {

using namespace torch_fl::ort;

// Output bytes a piece: below it a concat stays one call (ort_kernel.h).
constexpr int64_t kMinPieceWork = 1 << 16;

// The input whose rows of `width` bytes, `rows` of them from row r0, go into y at `offset` in
// rows of `y_width`.
struct Part {
  const uint8_t* x;
  const uint8_t* table;
  int64_t width, offset;
  bool identity;
};

void copy_rows(const Part& p, uint8_t* y, int64_t y_width, int64_t r0, int64_t r1, bool portable) {
  const uint8_t* src = p.x + r0 * p.width;
  uint8_t* dst = y + r0 * y_width + p.offset;
  if (p.identity) {
    if (p.width == y_width) {
      std::memcpy(dst, src, static_cast<size_t>((r1 - r0) * p.width));
      return;
    }
    for (int64_t r = r0; r < r1; ++r, src += p.width, dst += y_width) {
      std::memcpy(dst, src, static_cast<size_t>(p.width));
    }
    return;
  }
  lookup_byte_rows(p.table, src, static_cast<size_t>(p.width), dst, static_cast<size_t>(y_width),
                   static_cast<size_t>(p.width), static_cast<size_t>(r1 - r0), portable);
}

Status* compute(void* kernel, KernelContext* context) {
  const TypedOp& spec = *static_cast<const TypedOp*>(kernel);
  const char* op = spec.name;
  using InputCount = Status* (*)(const KernelContext*, size_t*);
  size_t count = 0;
  TFL_ORT_TRY(api_fn<InputCount>(slot::kKernelContextGetInputCount)(context, &count));
  if (count < 3) {
    return fail(op, "needs tables, geometry and at least one x");
  }
  const int64_t k = static_cast<int64_t>(count - 2);
  TensorView tables, geo;
  TFL_ORT_TRY(read_input(context, 0, &tables, op));
  TFL_ORT_TRY(read_input(context, 1, &geo, op));
  if (tables.type != spec.type || tables.dims.size() != 2 || tables.dims[0] != k ||
      tables.dims[1] != 256) {
    return fail(op, "tables must be [" + std::to_string(k) + ", 256] of the x's type (one row "
                    "per x), got " + shape_text(tables.dims) + " of ONNX element type " +
                    std::to_string(tables.type));
  }
  if (geo.type != kInt64 || geo.count != 2) {
    return fail(op, "geometry must be 2 int64 values (axis, form)");
  }
  const int64_t* g = static_cast<const int64_t*>(geo.data);
  const int64_t form = g[1];
  if (form < 0 || form > 1) {
    return fail(op, "form must be 0 or 1, got " + std::to_string(form));
  }
  std::vector<TensorView> xs(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    TFL_ORT_TRY(read_input(context, static_cast<size_t>(i) + 2, &xs[i], op));
  }
  const int64_t rank = static_cast<int64_t>(xs[0].dims.size());
  const int64_t axis = g[0] < 0 ? g[0] + rank : g[0];
  if (rank == 0 || axis < 0 || axis >= rank) {
    return fail(op, "axis " + std::to_string(g[0]) + " is out of range for x of shape " +
                        shape_text(xs[0].dims));
  }
  std::vector<int64_t> dims = xs[0].dims;
  dims[axis] = 0;
  for (int64_t i = 0; i < k; ++i) {
    const TensorView& x = xs[i];
    bool same = x.type == spec.type && x.dims.size() == xs[0].dims.size();
    for (int64_t d = 0; same && d < rank; ++d) {
      same = d == axis || x.dims[d] == xs[0].dims[d];
    }
    if (!same) {
      return fail(op, "x_" + std::to_string(i) + " " + shape_text(x.dims) + " (ONNX element type " +
                          std::to_string(x.type) + ") does not join x_0 " +
                          shape_text(xs[0].dims) + " along axis " + std::to_string(axis) +
                          " (one type and rank, equal sizes but along the axis)");
    }
    dims[axis] += x.dims[axis];
  }
  void* out = nullptr;
  TFL_ORT_TRY(make_output(context, dims, &out));
  // rows: everything before the axis; a row of x_i is its axis and all after it
  const int64_t rows = std::accumulate(dims.begin(), dims.begin() + axis, int64_t{1},
                                       std::multiplies<int64_t>());
  const int64_t after = std::accumulate(dims.begin() + axis + 1, dims.end(), int64_t{1},
                                        std::multiplies<int64_t>());
  const int64_t y_width = dims[axis] * after;
  if (rows == 0 || y_width == 0) {
    return nullptr;
  }
  std::vector<Part> parts;
  const uint8_t* table = static_cast<const uint8_t*>(tables.data);
  int64_t offset = 0;
  for (int64_t i = 0; i < k; ++i, table += 256) {
    const int64_t width = xs[i].dims[axis] * after;
    if (width == 0) {
      continue;
    }
    bool identity = true;
    for (int b = 0; b < 256 && identity; ++b) {
      identity = table[b] == b;
    }
    parts.push_back({static_cast<const uint8_t*>(xs[i].data), table, width, offset, identity});
    offset += width;
  }
  uint8_t* y = static_cast<uint8_t*>(out);
  const bool portable = form == 1;
  // each piece runs the inputs one after another over its rows, each input's table loaded once
  return run_row_parts(context, rows, y_width, kMinPieceWork, [&](int64_t r0, int64_t r1) {
    for (const Part& p : parts) {
      copy_rows(p, y, y_width, r0, r1, portable);
    }
  });
}

// Inputs: tables, geometry, then the x's (variadic, one type: ONNX Runtime checks both).
int input_type(const CustomOp* op, size_t index) {
  return index == 1 ? kInt64 : typed_op(op).type;
}
size_t input_count(const CustomOp*) { return 3; }
int input_characteristic(const CustomOp*, size_t index) {
  return index == 2 ? 2 : 0;  // OrtCustomOpInputOutputCharacteristic: 2 variadic, 0 required
}
int variadic_min_arity(const CustomOp*) { return 1; }
int variadic_homogeneous(const CustomOp*) { return 1; }

constexpr TypedOp concat_spec(const char* name, int type) {
  return TypedOp{CustomOp{kApiVersion, nullptr, typed_name, cpu_provider, input_type,
                          input_count, typed_output, one_output, nullptr, no_destroy,
                          input_characteristic, required_arg, default_memory,
                          variadic_min_arity, variadic_homogeneous, single_arity, single_arity,
                          stateless_kernel, compute, nullptr, first_opset, last_opset,
                          nullptr, nullptr, nullptr, nullptr},
                 name, type};
}

TypedOp g_ops[] = {
    concat_spec("ConcatLookupU8", kUint8),
    concat_spec("ConcatLookupI8", kInt8),
};

}  // namespace
}  // namespace ort_concat

std::vector<const ort::CustomOp*> ort::concat_ops() {
  return ort::op_list(ort_concat::g_ops);
}

}  // namespace torch_fl
