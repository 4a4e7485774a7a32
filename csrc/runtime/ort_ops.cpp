// The custom-op library ONNX Runtime loads from this extension's shared library
// (SessionOptions.register_custom_ops_library(torch_fl._C.__file__)): every op of domain
// "torch_fl.bpu" (ort_lookup.cpp, ort_depthwise.cpp, ort_narrow.cpp, ort_mean.cpp,
// ort_grouped_dot.cpp, ort_maxpool.cpp, ort_concat.cpp, ort_gemv.cpp, ort_pair_gemm.cpp).
#include "runtime/ort_kernel.h"

#include <cstdio>

namespace torch_fl::ort {
namespace {

// Whether the running ONNX Runtime ("1.<minor>.<patch>": its API version is the minor one)
// takes ops of `version`.
bool runtime_takes(const ApiBase* base, uint32_t version) {
  const char* text = base->get_version_string();
  unsigned major = 0, minor = 0;
  return text != nullptr && std::sscanf(text, "%u.%u", &major, &minor) == 2 &&
         (major > 1 || minor >= version);
}

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
                            concat_ops(), gemv_ops(), pair_gemm_ops()}) {
    ops.insert(ops.end(), more.begin(), more.end());
  }
  // ONNX Runtime refuses an op whose version is above its own API's ("Unsupported version"),
  // so before 1.18 the in-place ops (in_place_op, version 18) register as version 17: ORT then
  // reads no in-place pairs, and their lookups write a new buffer as before. Once a process.
  static const bool versions_set = [&] {
    if (!runtime_takes(base, kInplaceOpVersion)) {
      for (const CustomOp* op : ops) {  // the ops are the files' mutable spec tables
        if (op->version > kApiVersion) {
          const_cast<CustomOp*>(op)->version = kApiVersion;
        }
      }
    }
    return true;
  }();
  (void)versions_set;
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
