// torch_fl._C: the Python binding. Only glue lives here; the runtime (runtime/) and the ATen
// kernels (aten/) know nothing about Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "aten/cpu_alias.h"
#include "aten/cpu_fallback.h"
#include "runtime/caching_allocator.h"
#include "runtime/device_guard.h"
#include "runtime/fingerprint.h"
#include "runtime/ort_depthwise.h"
#include "runtime/ort_gemv.h"
#include "runtime/ort_maxpool.h"
#include "runtime/ort_narrow.h"
#include "runtime/ort_pair_gemm.h"
#include "runtime/ort_lookup.h"
#include "runtime/hooks.h"
#include "runtime/ucp_runtime.h"
#include "runtime/write_watch.h"

#ifndef TORCH_FL_TORCH_VERSION
#define TORCH_FL_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;

namespace {

struct TensorIdentity {
  struct Mark {
    const void* data;
    uint32_t version;
    std::vector<int64_t> strides;
    size_t storage_nbytes;
  };
  std::vector<py::object> objects;
  // each object's TensorImpl: a tensor object keeps its TensorImpl for life (`p.data = t`
  // changes the impl's storage and metadata, not the impl), and `objects` keeps them alive
  std::vector<c10::TensorImpl*> impls;
  std::vector<Mark> marks;

  static Mark mark(const at::Tensor& t) {
    return {t.unsafeGetTensorImpl()->data(), t._version(), t.strides().vec(),
            t.has_storage() ? t.storage().nbytes() : 0};
  }
  static bool same_mark(const c10::TensorImpl* impl, const Mark& m) {
    if (impl->data() != m.data || impl->version_counter().current_version() != m.version) {
      return false;
    }
    const c10::IntArrayRef strides = impl->strides();
    if (!std::equal(strides.begin(), strides.end(), m.strides.begin(), m.strides.end())) {
      return false;
    }
    return (impl->has_storage() ? impl->storage().nbytes() : 0) == m.storage_nbytes;
  }
  // Called on every call of a partition with baked weights, often after the process idled
  // (a robot's control loop), when these 200-odd scattered objects are out of the caches: the
  // memory is touched in passes whose loads do not wait on each other (the impls, then their
  // storages, prefetched) rather than one chain of misses per tensor, and nothing is allocated.
  // MobileNetV3's 210 weights after 20 ms idle: 0.18 ms before, by hand (see freezing.py).
  bool same(py::handle tensors) const {
    PyObject* fast = PySequence_Fast(tensors.ptr(), "_TensorIdentity.same: expected a sequence");
    if (fast == nullptr) throw py::error_already_set();
    const py::object hold = py::reinterpret_steal<py::object>(fast);
    const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(fast));
    if (n != objects.size()) return false;
    PyObject** items = PySequence_Fast_ITEMS(fast);
    for (size_t i = 0; i < n; ++i) {
      if (items[i] != objects[i].ptr()) return false;
    }
    for (const c10::TensorImpl* impl : impls) {
      const char* at = reinterpret_cast<const char*>(impl);
      __builtin_prefetch(at), __builtin_prefetch(at + 64), __builtin_prefetch(at + 128);
    }
    for (const c10::TensorImpl* impl : impls) {
      if (impl->has_storage()) __builtin_prefetch(impl->storage().unsafeGetStorageImpl());
    }
    for (size_t i = 0; i < n; ++i) {
      if (!same_mark(impls[i], marks[i])) return false;
    }
    return true;
  }
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_fl native extension: flagos device runtime for the RDK BPU";

  m.def("_configure_ucp", &torch_fl::ucp::configure, py::arg("explicit_path"),
        "Set FLAGOS_BPU_UCP_LIB before the first allocation.");
  m.def("_memory_backend", [] { return std::string(torch_fl::ucp::backend_name()); });
  m.def("_ucp_library", &torch_fl::ucp::loaded_path);
  m.def("_ucp_warning", &torch_fl::ucp::load_warning);
  m.def("_page_size", &torch_fl::ucp::page_size);

  m.def("_empty_cache", [] { torch_fl::allocator().empty_cache(); },
        "Return cached blocks to the runtime. Call before exit to release UCP memory cleanly.");
  m.def("_memory_stats", [] {
    const torch_fl::MemoryStats s = torch_fl::allocator().stats();
    py::dict d;
    d["allocated_bytes"] = s.allocated;
    d["max_allocated_bytes"] = s.max_allocated;
    d["reserved_bytes"] = s.reserved;
    d["max_reserved_bytes"] = s.max_reserved;
    d["num_alloc_retries"] = s.num_alloc_retries;
    d["num_ooms"] = s.num_ooms;
    d["num_device_alloc"] = s.alloc_count;
    d["num_device_free"] = s.free_count;
    return d;
  });
  m.def("_reset_peak_memory_stats", [] { torch_fl::allocator().reset_peak_stats(); });

  m.def("_set_fallback_mode", &torch_fl::set_fallback_mode, py::arg("mode"));
  m.def("_fallback_mode", &torch_fl::fallback_mode);

  // Zero-copy CPU views for code that needs CPU tensors (numpy, ONNX Runtime): the compile
  // backend's executors. The view does not own the memory: the caller keeps the flagos tensor
  // alive while the view is in use.
  m.def("_cpu_view", [](py::handle obj) {
    TORCH_CHECK(THPVariable_Check(obj.ptr()), "_cpu_view: expected a torch.Tensor");
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    TORCH_CHECK(torch_fl::is_flagos(t), "_cpu_view: expected a flagos tensor, got ", t.device());
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(torch_fl::cpu_alias(t)));
  });
  // A CPU result as a flagos tensor: adopted without a copy on host memory, copied into a UCP
  // block on a board (the BPU reads only UCP memory).
  m.def("_from_cpu", [](py::handle obj, int index) {
    TORCH_CHECK(THPVariable_Check(obj.ptr()), "_from_cpu: expected a torch.Tensor");
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    TORCH_CHECK(t.device().is_cpu(), "_from_cpu: expected a CPU tensor, got ", t.device());
    c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
    return py::reinterpret_steal<py::object>(
        THPVariable_Wrap(torch_fl::to_device_result(t, device)));
  });

  // Content fingerprints of dense CPU tensors' bytes, 16 bytes each, concatenated: the
  // baked-weight check of torch_fl/bpu/conversion/freezing.py. The hashing runs without the GIL,
  // so a check on the checker thread never takes turns with the caller's Python while ONNX
  // Runtime runs. `portable`: the plain C++ form even where the AVX-512 one would run (tests
  // compare the two); `threads`: how many threads may hash (the caller's among them).
  m.def(
      "_fingerprints",
      [](py::sequence tensors, bool portable, int threads) {
        TORCH_CHECK(threads >= 1, "_fingerprints: threads must be at least 1, got ", threads);
        std::vector<at::Tensor> held;  // references kept while the GIL is released
        held.reserve(py::len(tensors));
        for (py::handle obj : tensors) {
          TORCH_CHECK(THPVariable_Check(obj.ptr()), "_fingerprints: expected torch.Tensor items");
          const at::Tensor& t = THPVariable_Unpack(obj.ptr());
          TORCH_CHECK(t.device().is_cpu(), "_fingerprints: expected CPU tensors, got ", t.device());
          TORCH_CHECK(t.is_contiguous(), "_fingerprints: expected contiguous tensors");
          held.push_back(t);
        }
        std::vector<const unsigned char*> data(held.size());
        std::vector<size_t> sizes(held.size());
        for (size_t i = 0; i < held.size(); ++i) {
          data[i] = static_cast<const unsigned char*>(held[i].const_data_ptr());
          sizes[i] = held[i].nbytes();
        }
        std::vector<torch_fl::Fingerprint128> prints(held.size());
        {
          py::gil_scoped_release nogil;
          torch_fl::fingerprint_many(data.data(), sizes.data(), held.size(), prints.data(),
                                     portable, threads);
        }
        std::string out(16 * held.size(), '\0');
        for (size_t i = 0; i < held.size(); ++i) {
          std::memcpy(&out[16 * i], &prints[i].lo, 8);
          std::memcpy(&out[16 * i + 8], &prints[i].hi, 8);
        }
        return py::bytes(out);
      },
      py::arg("tensors"), py::arg("portable") = false, py::arg("threads") = 1);
  m.def("_fingerprint_kernel", [] { return std::string(torch_fl::fingerprint_kernel()); });

  // Which pages of baked weights were written (csrc/runtime/write_watch.h): the weight check of
  // torch_fl/bpu/conversion/freezing.py hashes only those and the partial pages. `check`: 0
  // unchanged, 1 changed, 2 no longer watching (hash everything), without the GIL.
  namespace ww = torch_fl::write_watch;
  py::class_<ww::Watch>(m, "_WriteWatch")
      .def("check",
           [](ww::Watch& w) {
             py::gil_scoped_release nogil;
             return static_cast<int>(w.check());
           })
      .def_property_readonly("watched_bytes", &ww::Watch::watched_bytes)
      .def_property_readonly("hashed_bytes", &ww::Watch::hashed_bytes)
      .def_property_readonly("runs", &ww::Watch::runs);
  m.def(
      "_write_watch",
      [](const std::vector<std::pair<uintptr_t, size_t>>& ranges) {
        std::string why;
        std::unique_ptr<ww::Watch> w;
        {
          py::gil_scoped_release nogil;  // registers and hashes every page once
          w = ww::Watch::arm(ranges, &why);
        }
        return py::make_tuple(w ? py::cast(std::move(w)) : py::none(), why);
      },
      py::arg("ranges"),
      "Watch the bytes of (address, size) ranges: (watch, '') or (None, why not). The caller "
      "keeps the memory alive while the watch is.");
  m.def("_write_watch_unavailable", &ww::unavailable_reason);

  // The identity half of the baked-weight check (freezing.FrozenWeights.stale): the same tensor
  // objects, with the data pointers, version counters, strides and storage sizes they had when
  // baked. In C++ for MobileNetV3's 210 weights: 57 us as five Python maps, per call.
  py::class_<TensorIdentity>(m, "_TensorIdentity")
      .def(py::init([](py::sequence tensors) {
             auto id = std::make_unique<TensorIdentity>();
             for (py::handle obj : tensors) {
               TORCH_CHECK(THPVariable_Check(obj.ptr()), "_TensorIdentity: expected tensors");
               id->objects.push_back(py::reinterpret_borrow<py::object>(obj));
               const at::Tensor& t = THPVariable_Unpack(obj.ptr());
               id->impls.push_back(t.unsafeGetTensorImpl());
               id->marks.push_back(TensorIdentity::mark(t));
             }
             return id;
           }),
           py::arg("tensors"))
      .def("same", &TensorIdentity::same, py::arg("tensors"));

  // The sim's byte-table lookup (csrc/runtime/ort_lookup.cpp) on Python bytes, for tests that
  // compare its two forms; `_lookup_kernel`: which form ONNX Runtime's lookup ops use here.
  m.def(
      "_lookup_bytes",
      [](py::bytes table, py::bytes x, bool portable) {
        const std::string tab = table, in = x;
        TORCH_CHECK(tab.size() == 256, "_lookup_bytes: the table must have 256 bytes, got ",
                    tab.size());
        std::string out(in.size(), '\0');
        torch_fl::lookup_bytes(reinterpret_cast<const uint8_t*>(tab.data()),
                               reinterpret_cast<const uint8_t*>(in.data()),
                               reinterpret_cast<uint8_t*>(out.data()), in.size(), portable);
        return py::bytes(out);
      },
      py::arg("table"), py::arg("x"), py::arg("portable") = false);
  // The clamp form of a byte lookup (ort_lookup.cpp): None where `table` is no clamp, else x
  // clamped by it (`in_place`: over a copy of x itself, as where ONNX Runtime grants the op its
  // input's buffer).
  m.def(
      "_clamp_bytes",
      [](py::bytes table, py::bytes x, bool portable, bool in_place) -> py::object {
        const std::string tab = table, in = x;
        TORCH_CHECK(tab.size() == 256, "_clamp_bytes: the table must have 256 bytes, got ",
                    tab.size());
        torch_fl::ByteClamp clamp;
        if (!torch_fl::clamp_of(reinterpret_cast<const uint8_t*>(tab.data()), &clamp)) {
          return py::none();
        }
        std::string out = in_place ? in : std::string(in.size(), '\0');
        const uint8_t* src = reinterpret_cast<const uint8_t*>(in_place ? out.data() : in.data());
        torch_fl::clamp_bytes(clamp, src, reinterpret_cast<uint8_t*>(out.data()), in.size(),
                              portable);
        return py::bytes(out);
      },
      py::arg("table"), py::arg("x"), py::arg("portable") = false, py::arg("in_place") = false);
  m.def("_depthwise_pieces", &torch_fl::depthwise_pieces,
        "How many pieces the depthwise / grouped conv ops' calls split into, in this process.");
  m.def("_gemv_pieces", &torch_fl::gemv_pieces,
        "How many pieces the Gemv ops' calls split into, in this process.");
  m.def("_affine_products", &torch_fl::affine_products,
        "How many product-pair runs computed their running operand as a DequantizeLinear.");
  m.def(
      "_dequant_of",
      [](py::bytes table, bool signed_bytes) -> py::object {
        const std::string tab = table;
        if (tab.size() != 256 * sizeof(float)) {
          throw py::value_error("_dequant_of: the table must be 256 float32s (1024 bytes)");
        }
        float scale = 0.0f;
        int zp = 0;
        if (!torch_fl::dequant_of(reinterpret_cast<const float*>(tab.data()), signed_bytes,
                                  &scale, &zp)) {
          return py::none();
        }
        return py::make_tuple(scale, zp);
      },
      "(scale, zero point) where the 256 floats are a DequantizeLinear of the bytes, else None.",
      py::arg("table"), py::arg("signed_bytes") = false);
  m.def("_lookups_in_place", &torch_fl::lookups_in_place,
        "How many times a byte lookup op ran with its output over its input, in this process.");
  m.def(
      "_lookup_floats",
      [](py::bytes table, py::bytes x, bool portable) {
        const std::string tab = table, in = x;
        TORCH_CHECK(tab.size() == 1024, "_lookup_floats: the table must have 256 floats (1024 "
                    "bytes), got ", tab.size(), " bytes");
        std::vector<float> floats(256);
        std::memcpy(floats.data(), tab.data(), 1024);
        std::string out(4 * in.size(), '\0');
        std::vector<float> y(in.size());
        torch_fl::lookup_floats(floats.data(), reinterpret_cast<const uint8_t*>(in.data()),
                                y.data(), in.size(), portable);
        std::memcpy(out.data(), y.data(), out.size());
        return py::bytes(out);
      },
      py::arg("table"), py::arg("x"), py::arg("portable") = false);
  m.def("_lookup_kernel", [] { return std::string(torch_fl::lookup_kernel()); });
  // which form the sim's depthwise conv op (csrc/runtime/ort_depthwise.cpp) uses here
  m.def("_depthwise_kernel", [] { return std::string(torch_fl::depthwise_kernel()); });
  // which form the sim's matrix-vector op (csrc/runtime/ort_gemv.cpp) uses here
  m.def("_gemv_kernel", [] { return std::string(torch_fl::gemv_kernel()); });
  // which form the sim's narrow conv op (csrc/runtime/ort_narrow.cpp) uses here
  m.def("_narrow_kernel", [] { return std::string(torch_fl::narrow_kernel()); });
  m.def("_narrow_packed_rows", &torch_fl::narrow_packed_rows,
        "How many output rows the AVX2 narrow conv form computed over packed rows.");
  m.def("_pair_gemm_kernel", [] { return std::string(torch_fl::pair_gemm_kernel()); });
  m.def("_pair_gemm_pieces", &torch_fl::pair_gemm_pieces,
        "How many pieces the PairGemm ops' calls split into, in this process.");
  m.def("_maxpool_kernel", [] { return std::string(torch_fl::maxpool_kernel()); });

  m.def("_device_count", [] { return static_cast<int>(torch_fl::kDeviceCount); });
  m.def("_current_device", [] { return static_cast<int>(torch_fl::current_device()); });
  m.def("_set_device", [](int index) {
    torch_fl::set_device(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(
        torch_fl::default_generator(static_cast<c10::DeviceIndex>(index))));
  });

  m.def("_compiled_with", [] {
    py::dict d;
    d["torch"] = TORCH_FL_TORCH_VERSION;
#if defined(__clang__)
    d["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    d["compiler"] = std::string("gcc ") + __VERSION__;
#else
    d["compiler"] = "unknown";
#endif
    return d;
  });
}
