// pybind11 lives only here. The core never sees Python; every run releases the GIL.
#include "bindings.h"

using namespace pyinfer;
using namespace pyinfer::bindings;

PYBIND11_MODULE(_core, m) {
  m.doc() = "pyinfer C++ core: op graph, executor, CPU kernels";
  py::register_exception<GraphError>(m, "GraphError", PyExc_ValueError);

  // Both enums from the one tables (graph/dtype.h, graph/op_params.cpp): a new type or op needs no edit here.
  py::enum_<DType> dtypes(m, "DType");
  for (const DTypeTraits& t : kDTypeTraits) dtypes.value(t.name, t.type);
  py::enum_<OpKind> ops(m, "Op");
  for (int k = 0; k < kOpKinds; ++k) ops.value(op_signature(OpKind(k)).py_name, OpKind(k));
  m.def("op_signature", [](OpKind op) {
        const OpSignature& sig = op_signature(op);
        py::list sources, params;
        for (const char* name : sig.sources)
          if (name) sources.append(name);
        for (int k = 0; k < sig.n_params; ++k)
          params.append(py::make_tuple(sig.params[k].name, sig.params[k].is_float ? "float" : "int"));
        py::dict d;
        d["sources"] = sources;
        d["params"] = params;
        return d;
      }, py::arg("op"), "An op's source slots and its parameters (name, type), as add_node takes them.");
  py::enum_<RunIf>(m, "RunIf")
      .value("ALWAYS", RunIf::Always).value("SINGLE_TOKEN", RunIf::SingleToken)
      .value("MULTI_TOKEN", RunIf::MultiToken);
  py::enum_<RowMode>(m, "RowMode")
      .value("FIXED", RowMode::Fixed).value("TOKENS", RowMode::Tokens).value("OUTPUTS", RowMode::Outputs);
  py::enum_<Storage>(m, "Storage")
      .value("EXTERNAL", Storage::External).value("SCRATCH", Storage::Scratch)
      .value("STATE", Storage::State).value("INPUT", Storage::Input);

  m.attr("N_OP_KINDS") = kOpKinds;
  m.def("available_isas", &available_isas, "Kernel ISAs usable on this CPU, best first (comma-separated).");
  m.def("read_bandwidth", &read_bandwidth_gbps, py::arg("bytes"), py::arg("threads"), py::arg("repeats") = 5,
        py::call_guard<py::gil_scoped_release>(),
        "Best GB/s of full read passes over a fresh buffer of `bytes`, one contiguous slice per thread: the "
        "memory roof a decode GEMV is measured against.");
  m.def("row_bytes", [](DType t, int64_t n) { return dtype_row_bytes(t, n); });
  // How a Quantize node quantizes activations for weights of this type (graph/dtype.h ActScheme, as an int).
  m.def("act_scheme", [](DType t) { return dtype_traits(t) ? int(dtype_traits(t)->act) : 0; });
  m.def("neuron_major", [](py::array_t<uint8_t, py::array::c_style> src, DType type, int64_t cols,
                           py::array_t<int32_t, py::array::c_style> perm, DType out, int threads) {
          if (src.ndim() != 2) throw GraphError("neuron_major: src must be U8 [rows, row bytes]");
          const int64_t rows = src.shape(0), n = perm.size();
          if (size_t(src.shape(1)) != dtype_row_bytes(type, cols))
            throw GraphError("neuron_major: a row of " + std::to_string(cols) + " elements of this type is " +
                             std::to_string(dtype_row_bytes(type, cols)) + " bytes, not " +
                             std::to_string(src.shape(1)));
          if (!dtype_is_integer_dot(type) && type != DType::F32 && type != DType::F16 && type != DType::BF16)
            throw GraphError("neuron_major: no decoder for this weight type");
          const int64_t row_out = out == DType::F32 ? rows * 4 : rows / 32 * 34;
          py::array_t<uint8_t> dst({n, row_out});
          try {
            py::gil_scoped_release release;
            neuron_major(type, src.data(), src.shape(1), rows, cols, perm.data(), n, out, dst.mutable_data(),
                         threads);
          } catch (const std::invalid_argument& e) {
            throw GraphError(std::string("neuron_major: ") + e.what());
          }
          return dst;
        }, py::arg("src"), py::arg("dtype"), py::arg("cols"), py::arg("perm"), py::arg("out"), py::arg("threads") = 1,
        "Rows k = column perm[k] of a [rows, cols] weight, as F32 [n, rows] or Q8_0 bytes [n, rows / 32 * 34] "
        "(load-time repacking of a down matrix for the sparse FFN).");
  m.def("gate_cut_bounds", [](int gate_fn, py::array_t<float, py::array::c_style | py::array::forcecast> t) {
          if (gate_fn != int(GateFn::SiLU) && gate_fn != int(GateFn::GeluTanh) && gate_fn != int(GateFn::ReLU))
            throw GraphError("gate_cut_bounds: gate_fn must be 1 (SiLU), 2 (GELU) or 3 (ReLU)");
          const int64_t n = t.size();
          py::array_t<float> out({n, int64_t(3)});
          float* o = out.mutable_data();
          for (int64_t i = 0; i < n; ++i) {
            const GateCut c(GateFn(gate_fn), t.data()[i]);
            o[3 * i] = c.hi, o[3 * i + 1] = c.lo, o[3 * i + 2] = c.mid;
          }
          return out;
        }, py::arg("gate_fn"), py::arg("thresholds"),
        "F32 [n, 3]: for each threshold t, the bounds (hi, lo, mid) with |act(g)| > t exactly when g > hi or "
        "lo < g < mid (act: SiLU for gate_fn 1, GELU for 2, ReLU for 3); the `cut` of an expert matmul with a gate.");
#ifdef PYINFER_WITH_CUDA
  m.def("cuda_sync_seconds", [](size_t bytes, int reps, int device) {
    py::gil_scoped_release release;
    return cuda_sync_seconds(device, bytes, reps);
  }, py::arg("bytes"), py::arg("reps") = 200, py::arg("device") = 0,
     "Median seconds of `bytes` copied up and back and a stream synchronization on a GPU (the cost a layer split "
     "between CPU and GPU pays each token). Only in CUDA builds.");
  m.def("cublas_error", &cublas_error,
        "Why prefill's matmuls cannot use cuBLAS here ('' when libcublas loads). Only in CUDA builds.");
#endif
  m.def("cuda_built", []() {
#ifdef PYINFER_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("cuda_devices", []() {
    py::list out;
#ifdef PYINFER_WITH_CUDA
    for (const auto& d : cuda_device_list()) {
      py::dict e;
      e["index"] = d.index; e["name"] = d.name; e["total_memory"] = d.total_memory;
      e["compute_capability"] = py::make_tuple(d.major, d.minor);
      out.append(e);
    }
#endif
    return out;
  }, "Visible CUDA devices (empty when CUDA was not built or no driver/GPU is present).");

  bind_stores(m);
  bind_graph(m);
  bind_engine(m);
}
