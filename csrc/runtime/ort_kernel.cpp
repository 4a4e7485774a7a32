// The shared custom-op plumbing (ort_kernel.h).
#include "runtime/ort_kernel.h"

namespace torch_fl::ort {

const void* const* g_api = nullptr;

Status* error(const std::string& message) {
  using Create = Status* (*)(int, const char*);
  return api_fn<Create>(slot::kCreateStatus)(kInvalidArgument, message.c_str());
}

Status* fail(const char* op, const std::string& what) {
  return error(std::string("torch_fl.bpu ") + op + ": " + what);
}

Status* read_input(KernelContext* context, size_t index, TensorView* out, const char* op) {
  using GetInput = Status* (*)(const KernelContext*, size_t, const Value**);
  using TypeShape = Status* (*)(const Value*, TypeShapeInfo**);
  using ElemType = Status* (*)(const TypeShapeInfo*, int*);
  using DimCount = Status* (*)(const TypeShapeInfo*, size_t*);
  using Dims = Status* (*)(const TypeShapeInfo*, int64_t*, size_t);
  using Release = void (*)(TypeShapeInfo*);
  using Data = Status* (*)(Value*, void**);
  const Value* value = nullptr;
  TFL_ORT_TRY(api_fn<GetInput>(slot::kKernelContextGetInput)(context, index, &value));
  if (value == nullptr) {
    return error(std::string("torch_fl.bpu ") + op + ": input " + std::to_string(index) +
                 " is missing");
  }
  TypeShapeInfo* info = nullptr;
  TFL_ORT_TRY(api_fn<TypeShape>(slot::kGetTensorTypeAndShape)(value, &info));
  size_t rank = 0;
  Status* status = api_fn<ElemType>(slot::kGetTensorElementType)(info, &out->type);
  if (status == nullptr) {
    status = api_fn<DimCount>(slot::kGetDimensionsCount)(info, &rank);
  }
  if (status == nullptr) {
    out->dims.assign(rank, 0);
    status = api_fn<Dims>(slot::kGetDimensions)(info, out->dims.data(), rank);
  }
  if (status == nullptr) {
    status = api_fn<DimCount>(slot::kGetTensorShapeElementCount)(info, &out->count);
  }
  api_fn<Release>(slot::kReleaseTensorTypeAndShapeInfo)(info);
  TFL_ORT_TRY(status);
  // the API's accessor is declared for mutable values; inputs are only read here
  return api_fn<Data>(slot::kGetTensorMutableData)(const_cast<Value*>(value), &out->data);
}

Status* make_output(KernelContext* context, const std::vector<int64_t>& dims, void** data) {
  using GetOutput = Status* (*)(KernelContext*, size_t, const int64_t*, size_t, Value**);
  using Data = Status* (*)(Value*, void**);
  Value* value = nullptr;
  TFL_ORT_TRY(
      api_fn<GetOutput>(slot::kKernelContextGetOutput)(context, 0, dims.data(), dims.size(),
                                                       &value));
  return api_fn<Data>(slot::kGetTensorMutableData)(value, data);
}

size_t second_input_in_place(int** input_index, int** output_index) {
  // ONNX Runtime frees nothing itself: release_in_place gets both arrays back
  *input_index = new int[1]{1};
  *output_index = new int[1]{0};
  return 1;
}

void release_in_place(int* input_index, int* output_index) {
  delete[] input_index;
  delete[] output_index;
}

Status* shape_of_second_input(const CustomOp* op, ShapeInferContext* context) {
  using GetTypeShape = Status* (*)(const ShapeInferContext*, size_t, TypeShapeInfo**);
  using SetTypeShape = Status* (*)(const ShapeInferContext*, size_t, const TypeShapeInfo*);
  using ElemType = Status* (*)(const TypeShapeInfo*, int*);
  using DimCount = Status* (*)(const TypeShapeInfo*, size_t*);
  // the context owns the info it hands out (releasing it here freed it twice)
  TypeShapeInfo* info = nullptr;
  TFL_ORT_TRY(api_fn<GetTypeShape>(slot::kShapeInferContextGetInputTypeShape)(context, 1, &info));
  int type = kUndefined;
  size_t rank = 0;
  Status* status = api_fn<ElemType>(slot::kGetTensorElementType)(info, &type);
  if (status == nullptr) {
    status = api_fn<DimCount>(slot::kGetDimensionsCount)(info, &rank);
  }
  // Rank 0 is also what the context gives for an input of unknown shape (after another of the
  // extension's ops): a scalar claimed there would break the next op's shape inference. And the
  // info carries input 1's element type, which must be the output's.
  if (status == nullptr && rank > 0 && type == op->get_output_type(op, 0)) {
    status = api_fn<SetTypeShape>(slot::kShapeInferContextSetOutputTypeShape)(context, 0, info);
  }
  return status;
}

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return s + "]";
}


}  // namespace torch_fl::ort
