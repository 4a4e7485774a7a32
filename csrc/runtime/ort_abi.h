// The few parts of ONNX Runtime's C ABI that a custom-op library uses (ort_lookup.cpp), declared
// here because ONNX Runtime's Python wheel carries its shared library but not its headers.
//
// The ABI is stable and append-only: `OrtApi` is a table of function pointers whose slots never
// move once released, and `OrtCustomOp` a table of callbacks that ONNX Runtime reads only up to
// the fields its `version` field says exist. The slot numbers below are positions in that table
// (counted in the API of ORT_API_VERSION 29; every slot used here exists from version 17, the
// newest, KernelContext_ParallelFor, since then).
// tests/unit/test_lookups.py runs the ops in real sessions: a wrong slot fails there.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch_fl::ort {

// Opaque handles: ONNX Runtime owns them, this code only passes them back.
struct Status;
struct Value;
struct KernelContext;
struct KernelInfo;
struct SessionOptions;
struct CustomOpDomain;
struct TypeShapeInfo;
struct ShapeInferContext;

// ONNXTensorElementDataType values
enum ElementType : int {
  kUndefined = 0,
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
};

// OrtErrorCode values
enum ErrorCode : int {
  kInvalidArgument = 2,
};

// OrtApiBase: what RegisterCustomOps receives.
struct ApiBase {
  const void* (*get_api)(uint32_t version);
  const char* (*get_version_string)();
};

// The OrtApi version this library asks for: the custom-op callbacks below are those of
// version 17 (KernelComputeV2 from 16, the opset range from 17). ONNX Runtime 1.17 and later.
constexpr uint32_t kApiVersion = 17;

// Slots of the OrtApi function table.
namespace slot {
constexpr int kCreateStatus = 0;  // (int code, const char* msg) -> Status*
constexpr int kCreateCustomOpDomain = 26;
constexpr int kCustomOpDomainAdd = 27;
constexpr int kAddCustomOpDomain = 28;
constexpr int kGetTensorMutableData = 51;
constexpr int kGetTensorElementType = 60;
constexpr int kGetDimensionsCount = 61;
constexpr int kGetDimensions = 62;
constexpr int kGetTensorShapeElementCount = 64;
constexpr int kGetTensorTypeAndShape = 65;
constexpr int kKernelContextGetInputCount = 88;  // (context, size_t* count)
constexpr int kKernelContextGetInput = 90;
constexpr int kKernelContextGetOutput = 91;
constexpr int kReleaseTensorTypeAndShapeInfo = 99;
// (context, index, TypeShapeInfo**): input `index`'s type and shape as ONNX Runtime's graph
// knows it (rank 0 where it knows no shape), owned by the context. Since version 17.
constexpr int kShapeInferContextGetInputTypeShape = 268;
// (context, index, const TypeShapeInfo*): output `index`'s type and shape. Since version 17.
constexpr int kShapeInferContextSetOutputTypeShape = 270;
// (context, fn(user, i), total, max batches (0: no limit), user): fn for every i < total on the
// session's intra-op threads; inline where the session has one thread. Since version 17.
constexpr int kKernelContextParallelFor = 274;
}  // namespace slot

// OrtCustomOp, up to the fields of version 18. ONNX Runtime reads no further than an op's
// `version` says: an op of version 17 (every op here but the in-place ones) ends at
// get_end_version, and an ONNX Runtime of 1.17 reads no further whatever the version.
constexpr uint32_t kInplaceOpVersion = 18;  // the first with get_may_inplace
struct CustomOp {
  uint32_t version;
  void* (*create_kernel)(const CustomOp*, const void* api, const KernelInfo*);
  const char* (*get_name)(const CustomOp*);
  const char* (*get_execution_provider_type)(const CustomOp*);
  int (*get_input_type)(const CustomOp*, size_t index);
  size_t (*get_input_type_count)(const CustomOp*);
  int (*get_output_type)(const CustomOp*, size_t index);
  size_t (*get_output_type_count)(const CustomOp*);
  void (*kernel_compute)(void* kernel, KernelContext*);
  void (*kernel_destroy)(void* kernel);
  int (*get_input_characteristic)(const CustomOp*, size_t index);   // 0: required
  int (*get_output_characteristic)(const CustomOp*, size_t index);  // 0: required
  int (*get_input_memory_type)(const CustomOp*, size_t index);      // 0: the default
  int (*get_variadic_input_min_arity)(const CustomOp*);
  int (*get_variadic_input_homogeneity)(const CustomOp*);
  int (*get_variadic_output_min_arity)(const CustomOp*);
  int (*get_variadic_output_homogeneity)(const CustomOp*);
  Status* (*create_kernel_v2)(const CustomOp*, const void* api, const KernelInfo*, void** kernel);
  Status* (*kernel_compute_v2)(void* kernel, KernelContext*);
  // null: ONNX Runtime knows the output's type only (and plans no in-place reuse for it)
  Status* (*infer_output_shape)(const CustomOp*, ShapeInferContext*);
  int (*get_start_version)(const CustomOp*);
  int (*get_end_version)(const CustomOp*);
  // Since version 18: pairs (input, output) whose buffer the output may take over where this op
  // is the input's last reader (ONNX Runtime's allocation planner decides, from the graph's
  // shapes); the two arrays are allocated by the op and handed back to release_may_inplace.
  size_t (*get_may_inplace)(int** input_index, int** output_index);
  void (*release_may_inplace)(int* input_index, int* output_index);
  size_t (*get_alias_map)(int** input_index, int** output_index);
  void (*release_alias_map)(int* input_index, int* output_index);
};

}  // namespace torch_fl::ort
