// The plumbing every custom op of the sim's ONNX Runtime sessions shares (ort_lookup.cpp,
// ort_depthwise.cpp, ort_narrow.cpp, ort_mean.cpp): ONNX Runtime's API table, reading inputs,
// making the output, and splitting an op's work over the session's intra-op threads. ort_ops.cpp
// registers the ops.
#pragma once

#include "runtime/ort_abi.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_fl::ort {

extern const void* const* g_api;  // set once by RegisterCustomOps, before any session runs

template <class Fn>
Fn api_fn(int index) {
  return reinterpret_cast<Fn>(g_api[index]);
}

// A status that fails the run with `message` (ONNX Runtime raises it in Python).
Status* error(const std::string& message);

// error() naming the op: "torch_fl.bpu <op>: <what>".
Status* fail(const char* op, const std::string& what);

// Calls an API function that returns a status, and returns from the caller with it on failure.
#define TFL_ORT_TRY(expr)            \
  do {                               \
    if (Status* status_ = (expr)) {  \
      return status_;                \
    }                                \
  } while (0)

struct TensorView {
  int type = kUndefined;
  std::vector<int64_t> dims;
  size_t count = 0;
  void* data = nullptr;
};

// Input `index` of the running op; `op` names it in the error where the input is missing.
Status* read_input(KernelContext* context, size_t index, TensorView* out, const char* op);

// The op's (first) output, shaped `dims`, and its data.
Status* make_output(KernelContext* context, const std::vector<int64_t>& dims, void** data);

std::string shape_text(const std::vector<int64_t>& dims);

// Splitting one op's work over the session's intra-op threads (ORT's KernelContext_ParallelFor:
// a custom op otherwise runs on one thread while the pool waits; MobileNetV3 at batch 8 on 2
// threads spent 1.5 of 4.9 ms in lookups, at the speed of 1 thread). A piece is at least
// `min_piece` outputs, so a small tensor stays one call (handing a piece to another thread
// cost about 2 us here: a byte lookup of 50 000 outputs took 4.6 us whole and 6.6 us in
// pieces on 2 threads), and at most kMaxPieces of them keep the handing-out cheap while
// leaving a 16-thread pool balanced.
constexpr int64_t kMaxPieces = 32;

// `count` outputs as pieces of whole rows of `inner` (or slices of one row, where a row alone
// is larger than a piece): piece i is rows [r0, r1), columns [j0, j1).
struct Pieces {
  int64_t rows, inner, rows_per, slices, cols_per, count;
  Pieces(int64_t total, int64_t inner_, int64_t min_piece)
      : rows(total / inner_), inner(inner_) {
    const int64_t want = std::max<int64_t>(1, std::min(kMaxPieces, total / min_piece));
    const int64_t size = (total + want - 1) / want;
    if (size >= inner) {  // whole rows per piece
      rows_per = std::max<int64_t>(1, size / inner), slices = 1, cols_per = inner;
      count = (rows + rows_per - 1) / rows_per;
    } else {  // slices of each row, 64-byte aligned
      cols_per = std::max<int64_t>(64, (size + 63) / 64 * 64), rows_per = 1;
      slices = (inner + cols_per - 1) / cols_per;
      count = rows * slices;
    }
  }
  void at(int64_t i, int64_t* r0, int64_t* r1, int64_t* j0, int64_t* j1) const {
    *r0 = (i / slices) * rows_per, *r1 = std::min(rows, *r0 + rows_per);
    *j0 = (i % slices) * cols_per, *j1 = std::min(inner, *j0 + cols_per);
  }
};

// Runs body(i) for every i < count, on the session's intra-op threads where count > 1 (inline
// where the session has one thread).
template <class Body>
Status* run_parts(KernelContext* context, int64_t count, const Body& body) {
  if (count <= 1) {
    if (count == 1) {
      body(0);
    }
    return nullptr;
  }
  using Fn = void (*)(void*, size_t);
  using ParallelFor = Status* (*)(const KernelContext*, Fn, size_t, size_t, void*);
  const Fn trampoline = [](void* user, size_t i) {
    (*static_cast<const Body*>(user))(static_cast<int64_t>(i));
  };
  return api_fn<ParallelFor>(slot::kKernelContextParallelFor)(
      context, trampoline, static_cast<size_t>(count), 0,
      const_cast<void*>(static_cast<const void*>(&body)));
}

// The rows in each piece of run_row_parts but the last: at most kMaxPieces runs of consecutive
// rows of at least `min_piece_work` units (one run where the work is less). It depends on the
// work only, not on the session's threads.
inline int64_t rows_per_piece(int64_t total_rows, int64_t row_work, int64_t min_piece_work) {
  const int64_t want = std::max<int64_t>(
      1, std::min<int64_t>({kMaxPieces, total_rows, total_rows * row_work / min_piece_work}));
  return (total_rows + want - 1) / want;
}

// How many pieces run_row_parts makes of the same rows (the depthwise op counts them for tests).
inline int64_t row_piece_count(int64_t total_rows, int64_t row_work, int64_t min_piece_work) {
  const int64_t per = rows_per_piece(total_rows, row_work, min_piece_work);
  return (total_rows + per - 1) / per;
}

// Runs body(r0, r1) over `total_rows` rows of `row_work` units each, in the pieces above: a conv
// op's output rows, for the session's intra-op threads.
template <class Body>
Status* run_row_parts(KernelContext* context, int64_t total_rows, int64_t row_work,
                      int64_t min_piece_work, const Body& body) {
  const int64_t per = rows_per_piece(total_rows, row_work, min_piece_work);
  return run_parts(context, row_piece_count(total_rows, row_work, min_piece_work), [&](int64_t i) {
    const int64_t r0 = i * per, r1 = std::min(total_rows, r0 + per);
    if (r0 < r1) {
      body(r0, r1);
    }
  });
}

// run_row_parts for a conv op whose 8-bit x and y share `type` (kUint8 or kInt8):
// body(x, y, r0, r1) with x and y as pointers to that type (the sim's conv ops).
template <class Body>
Status* run_typed_rows(KernelContext* context, int type, const void* x, void* y,
                       int64_t total_rows, int64_t row_work, int64_t min_piece_work,
                       const Body& body) {
  return run_row_parts(context, total_rows, row_work, min_piece_work, [&](int64_t r0, int64_t r1) {
    if (type == kUint8) {
      body(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), r0, r1);
    } else {
      body(static_cast<const int8_t*>(x), static_cast<int8_t*>(y), r0, r1);
    }
  });
}

// Runs body(piece) for every piece of `pieces`.
template <class Body>
Status* run_pieces(KernelContext* context, const Pieces& pieces, const Body& body) {
  return run_parts(context, pieces.count, body);
}

// Output rows [r0, r1) of N x OH rows (a conv's, OH per batch item), in runs whose input rows
// fit a band of `band_rows` rows (at least one output row a run): run(n, oh0, oh1, ih0, span)
// for output rows [oh0, oh1) of item n, which read input rows [ih0, ih0 + span) (with pads).
template <class Run>
void for_each_band(int64_t r0, int64_t r1, int64_t oh, int64_t kh, int64_t sh, int64_t dh,
                   int64_t pt, int64_t band_rows, const Run& run) {
  const int64_t chunk = std::max<int64_t>(1, (band_rows - (kh - 1) * dh - 1) / sh + 1);
  for (int64_t r = r0; r < r1;) {
    const int64_t n = r / oh, oh0 = r % oh;
    const int64_t oh1 = std::min({oh, oh0 + (r1 - r), oh0 + chunk});
    // the input rows these output rows read: from oh0's first tap to oh1 - 1's last
    run(n, oh0, oh1, oh0 * sh - pt, (oh1 - 1 - oh0) * sh + (kh - 1) * dh + 1);
    r += oh1 - oh0;
  }
}

// The callbacks every op here shares (OrtCustomOp's fields, ort_abi.h): the CPU provider, inputs
// and outputs required, no variadic ones, a stateless kernel (the op's spec is the kernel), and
// every opset.
inline Status* stateless_kernel(const CustomOp* op, const void*, const KernelInfo*, void** kernel) {
  *kernel = const_cast<CustomOp*>(op);
  return nullptr;
}
inline const char* cpu_provider(const CustomOp*) { return "CPUExecutionProvider"; }
inline void no_destroy(void*) {}
inline int required_arg(const CustomOp*, size_t) { return 0; }
inline int default_memory(const CustomOp*, size_t) { return 0; }
inline int single_arity(const CustomOp*) { return 1; }
inline int first_opset(const CustomOp*) { return 1; }
inline int last_opset(const CustomOp*) { return 1 << 30; }
inline size_t one_output(const CustomOp*) { return 1; }

// An op of one output with the callbacks above and its own name, inputs, output type and
// compute.
constexpr CustomOp custom_op(const char* (*name)(const CustomOp*),
                             int (*input_type)(const CustomOp*, size_t),
                             size_t (*input_count)(const CustomOp*),
                             int (*output_type)(const CustomOp*, size_t),
                             Status* (*compute)(void*, KernelContext*)) {
  return CustomOp{kApiVersion,    nullptr,      name,           cpu_provider,
                  input_type,     input_count,  output_type,    one_output,
                  nullptr,        no_destroy,   required_arg,   required_arg,
                  default_memory, single_arity, single_arity,   single_arity,
                  single_arity,   stateless_kernel, compute,    nullptr,
                  first_opset,    last_opset,   nullptr,        nullptr,
                  nullptr,        nullptr};
}

// An op of custom_op() whose output may take over input 1's buffer (an elementwise op over
// bytes of the same size: the byte lookups). Where ONNX Runtime grants it, the op runs with
// x == y, so its kernel must read each block before writing it.
//
// ONNX Runtime's allocation planner grants it only where it knows both tensors' shapes to be
// equal, so the op also gives its output input 1's shape, where ORT knows that one
// (conversion/session_shapes.py declares what it cannot infer: all 35 of MobileNetV2's clamps).
size_t second_input_in_place(int** input_index, int** output_index);
void release_in_place(int* input_index, int* output_index);
Status* shape_of_second_input(const CustomOp* op, ShapeInferContext* context);
constexpr CustomOp in_place_op(CustomOp op) {
  op.version = kInplaceOpVersion;
  op.infer_output_shape = shape_of_second_input;
  op.get_may_inplace = second_input_in_place;
  op.release_may_inplace = release_in_place;
  return op;
}

// The spec of an op whose 8-bit x and y share one type (ort_depthwise.cpp, ort_narrow.cpp): its
// CustomOp first, as ONNX Runtime passes back &op, which is then also &spec.
struct TypedOp {
  CustomOp op;
  const char* name;
  int type;  // of x and y
};
inline const TypedOp& typed_op(const CustomOp* op) {
  return *reinterpret_cast<const TypedOp*>(op);
}
inline const char* typed_name(const CustomOp* op) { return typed_op(op).name; }
inline int typed_output(const CustomOp* op, size_t) { return typed_op(op).type; }

// The spec of op `name` over x and y of `type`, with its own inputs and compute.
constexpr TypedOp typed_spec(const char* name, int type,
                             int (*input_type)(const CustomOp*, size_t),
                             size_t (*input_count)(const CustomOp*),
                             Status* (*compute)(void*, KernelContext*)) {
  return TypedOp{custom_op(typed_name, input_type, input_count, typed_output, compute), name, type};
}

// The spec of an op over 8-bit x whose y is float or of x's type (ort_gemv.cpp,
// ort_pair_gemm.cpp): its CustomOp first, as TypedOp's.
struct GemmOp {
  CustomOp op;
  const char* name;
  int type;      // of x
  int out_type;  // of y: kFloat, or type
};
inline const GemmOp& gemm_op(const CustomOp* op) { return *reinterpret_cast<const GemmOp*>(op); }
inline const char* gemm_name(const CustomOp* op) { return gemm_op(op).name; }
inline int gemm_output(const CustomOp* op, size_t) { return gemm_op(op).out_type; }

// The spec of op `name` over x of `type` giving y of `out_type`, with its own inputs and compute.
constexpr GemmOp gemm_spec(const char* name, int type, int out_type,
                           int (*input_type)(const CustomOp*, size_t),
                           size_t (*input_count)(const CustomOp*),
                           Status* (*compute)(void*, KernelContext*)) {
  return GemmOp{custom_op(gemm_name, input_type, input_count, gemm_output, compute), name, type,
                out_type};
}

// The ops of a table of specs whose first member is their CustomOp (each file's OpSpec).
template <class Spec, size_t N>
std::vector<const CustomOp*> op_list(const Spec (&specs)[N]) {
  std::vector<const CustomOp*> out;
  for (const Spec& spec : specs) {
    out.push_back(&spec.op);
  }
  return out;
}

// The ops of each file, for RegisterCustomOps (ort_ops.cpp).
std::vector<const CustomOp*> lookup_ops();     // ort_lookup.cpp
std::vector<const CustomOp*> depthwise_ops();  // ort_depthwise.cpp
std::vector<const CustomOp*> narrow_ops();     // ort_narrow.cpp
std::vector<const CustomOp*> mean_ops();       // ort_mean.cpp
std::vector<const CustomOp*> grouped_dot_ops();  // ort_grouped_dot.cpp
std::vector<const CustomOp*> maxpool_ops();      // ort_maxpool.cpp
std::vector<const CustomOp*> concat_ops();       // ort_concat.cpp
std::vector<const CustomOp*> gemv_ops();         // ort_gemv.cpp
std::vector<const CustomOp*> pair_gemm_ops();    // ort_pair_gemm.cpp

}  // namespace torch_fl::ort
