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

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return s + "]";
}


}  // namespace torch_fl::ort
