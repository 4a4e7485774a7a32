// The custom-op library ONNX Runtime loads from this extension's shared library
// (SessionOptions.register_custom_ops_library(torch_fl._C.__file__)): every op of domain
// "torch_fl.bpu" (ort_lookup.cpp, ort_depthwise.cpp, ort_narrow.cpp, ort_mean.cpp,
// ort_grouped_dot.cpp, ort_maxpool.cpp, ort_concat.cpp).
#include "runtime/ort_kernel.h"

namespace torch_fl::ort {
namespace {

Status* register_ops(SessionOptions* options, const ApiBase* base) {
  const void* api = base->get_api(kApiVersion);
  if (api == nullptr) {
    return nullptr;  // an ONNX Runtime older than 1.17: the session fails on the unknown ops
  }
  g_api = static_cast<const void* const*>(api);
  using CreateDomain = Status* (*)(const char*, CustomOpDomain**);
  using DomainAdd = Status* (*)(CustomOpDomain*, const CustomOp*);
  using AddDomain = Status* (*)(SessionOptions*, CustomOpDomain*);
  // One domain object per session options: ONNX Runtime keeps a pointer to it for the options'
  // lifetime, and the handful of bytes each is not worth a lifetime scheme of our own.
  CustomOpDomain* domain = nullptr;
  TFL_ORT_TRY(api_fn<CreateDomain>(slot::kCreateCustomOpDomain)("torch_fl.bpu", &domain));
  std::vector<const CustomOp*> ops = lookup_ops();
  for (const auto& more : {depthwise_ops(), narrow_ops(), mean_ops(), grouped_dot_ops(), maxpool_ops(),
                            concat_ops()}) {
    ops.insert(ops.end(), more.begin(), more.end());
  }
  for (const CustomOp* op : ops) {
    TFL_ORT_TRY(api_fn<DomainAdd>(slot::kCustomOpDomainAdd)(domain, op));
  }
  return api_fn<AddDomain>(slot::kAddCustomOpDomain)(options, domain);
}

}  // namespace
}  // namespace torch_fl::ort

// The entry point ONNX Runtime looks up in a custom-op library.
extern "C" __attribute__((visibility("default"))) torch_fl::ort::Status* RegisterCustomOps(
    torch_fl::ort::SessionOptions* options, const torch_fl::ort::ApiBase* base) {
  return torch_fl::ort::register_ops(options, base);
}
