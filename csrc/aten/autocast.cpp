// torch.autocast("flagos"): the same op policies CUDA uses (matmuls and convolutions in the
// lower-precision dtype, precision-sensitive ops in float32, mixed inputs promoted), through
// PyTorch's own autocast wrappers. Every other op passes through the Autocast key untouched.
// The kernels then run on the CPU (fallback), which computes float16 and bfloat16 directly.
#include <ATen/autocast_mode.h>
#if __has_include(<ATen/core/Dimname.h>)
#include <ATen/core/Dimname.h>
#define TORCH_FL_HAS_DIMNAMES 1
#endif
#include <torch/library.h>

namespace torch_fl {

// The different-signature list spells its types unqualified, as inside at::.
#ifdef TORCH_FL_HAS_DIMNAMES
using at::DimnameList;  // torches with named tensors (2.11) list a Dimname signature too
#endif
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define FLAGOS_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FLAGOS_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define FLAGOS_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define FLAGOS_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(FLAGOS_LOWER_PRECISION)
  AT_FORALL_FP32(FLAGOS_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(FLAGOS_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(FLAGOS_PROMOTE)
#undef FLAGOS_LOWER_PRECISION
#undef FLAGOS_FP32
#undef FLAGOS_FP32_SET_OPT_DTYPE
#undef FLAGOS_PROMOTE
}

}  // namespace torch_fl
