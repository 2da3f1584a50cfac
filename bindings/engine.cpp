// Engine: a built graph, run with the GIL released, and what callers may read of it.
#include "bindings.h"

namespace pyinfer {
namespace bindings {

namespace {

// A read-only view: the engine's memory is written only by runs (a write through a view could put an id
// out of range behind the checks).
py::array tensor_view(py::object owner, const Tensor& t, int64_t rows) {
  py::array a;
  if (t.type == DType::F32)
    a = py::array_t<float>({rows, t.cols}, {int64_t(t.row_stride), int64_t(4)}, static_cast<float*>(t.data), owner);
  else if (t.type == DType::I32)
    a = py::array_t<int32_t>({rows, t.cols}, {int64_t(t.row_stride), int64_t(4)}, static_cast<int32_t*>(t.data), owner);
  else if (t.type == DType::F16)
    a = py::array_t<uint16_t>({rows, t.cols}, {int64_t(t.row_stride), int64_t(2)}, static_cast<uint16_t*>(t.data), owner);
  else
    a = py::array_t<uint8_t>({rows, int64_t(t.row_bytes)}, {int64_t(t.row_stride), int64_t(1)},
                             static_cast<uint8_t*>(t.data), owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

// Backend i of an engine from its kind: "cpu" (the engine's own CPU backend) or "cuda:N".
std::vector<EngineConfig::BackendMaker> backend_makers(const std::vector<std::string>& kinds) {
  std::vector<EngineConfig::BackendMaker> out;
  for (const std::string& k : kinds) {
    if (k == "cpu") {
      out.emplace_back();
      continue;
    }
    if (k.rfind("cuda", 0) != 0)
      throw GraphError("backend kind '" + k + "' is not cpu or cuda:N");
#ifdef PYINFER_WITH_CUDA
    const int device = k.size() > 5 && k[4] == ':' ? std::stoi(k.substr(5)) : 0;
    out.emplace_back([device](const Graph& g, int space) { return make_cuda_backend(g, device, space); });
#else
    throw GraphError("this pyinfer was built without CUDA: backend '" + k + "' is not available");
#endif
  }
  return out;
}

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<PyEngine>(m, "Engine")
      .def(py::init([](const PyGraph& g, int64_t max_tokens, int64_t max_outputs, int n_threads, const std::string& isa,
                       const std::vector<int>& backend_threads, const std::vector<int>& placement,
                       const std::vector<int>& backend_memory, const std::vector<std::string>& backend_kinds) {
             auto e = std::make_unique<PyEngine>();
             EngineConfig cfg{max_tokens, max_outputs, n_threads, isa, backend_threads, placement, backend_memory};
             cfg.neuron_store = g.store;
             cfg.expert_store = g.experts;
             cfg.backend_makers = backend_makers(backend_kinds);
             e->engine = std::make_unique<Engine>(g.graph, cfg);
             e->keep_alive = g.keep_alive;
             return e;
           }), py::arg("graph"), py::arg("max_tokens") = 512, py::arg("max_outputs") = 1, py::arg("n_threads") = 1,
           py::arg("isa") = "auto", py::arg("backend_threads") = std::vector<int>{},
           py::arg("placement") = std::vector<int>{}, py::arg("backend_memory") = std::vector<int>{},
           py::arg("backend_kinds") = std::vector<std::string>{},
           "backend_kinds: 'cpu' or 'cuda:N' per backend (default: all CPU); a CUDA backend needs its own memory "
           "space. backend_threads: threads of each CPU backend instance (default: one of n_threads); placement: the "
           "backend of each node (default: all on backend 0). Backends run their nodes concurrently where the "
           "dependencies allow. backend_memory: each backend's memory space (default all 0, host memory); a CPU "
           "backend given its own space stands in for a GPU: its own buffers, weights uploaded, Copy nodes where "
           "tensors cross.")
      .def("run", [](PyEngine& e, int64_t n_tokens, std::optional<I32Array> tokens, std::optional<I32Array> positions,
                     std::optional<I32Array> out_ids, std::optional<I32Array> slots, std::optional<I32Array> kv_table,
                     std::optional<I32Array> state_rows) {
             auto check = [&](const std::optional<I32Array>& a, int64_t n, const char* what) {
               if (a && a->size() != n)
                 throw GraphError(std::string(what) + " has " + std::to_string(a->size()) + " entries, expected " +
                                  std::to_string(n));
             };
             const int64_t n_out = out_ids ? out_ids->size() : 0;
             check(tokens, n_tokens, "tokens");
             check(positions, n_tokens, "positions");
             check(slots, n_tokens, "slots");
             check(state_rows, n_tokens, "state_rows");
             int64_t table_cols = 0;
             if (kv_table) {
               if (kv_table->ndim() != 2 || kv_table->shape(0) != n_tokens)
                 throw GraphError("kv_table must be int32 [n_tokens, max_blocks]");
               table_cols = kv_table->shape(1);
             }
             {
               py::gil_scoped_release release;
               e.engine->run(data_or_null(tokens), data_or_null(positions), n_tokens, data_or_null(out_ids), n_out,
                             data_or_null(slots), data_or_null(kv_table), table_cols, data_or_null(state_rows));
             }
             e.last_outputs = n_out;
           }, py::arg("n_tokens"), py::arg("tokens") = py::none(), py::arg("positions") = py::none(),
           py::arg("out_ids") = py::none(), py::arg("slots") = py::none(), py::arg("kv_table") = py::none(),
           py::arg("state_rows") = py::none(),
           "Computes one batch. Inputs are int32 arrays of n_tokens entries (out_ids: rows whose logits are wanted; "
           "state_rows: each token's recurrent state row, in a hybrid model's paged graph).")
      .def("logits", [](py::object self) {
             auto& e = self.cast<PyEngine&>();
             const Graph& g = e.engine->graph();
             if (g.output_logits < 0) throw GraphError("graph has no logits output");
             return tensor_view(self, g.tensors[size_t(g.output_logits)], e.last_outputs);
           }, "View of the last run's logits, shape [n_outputs, vocab]; overwritten by the next run.")
      .def("tensor", [](py::object self, int id, int64_t rows) {
             auto& e = self.cast<PyEngine&>();
             const Graph& g = e.engine->graph();
             if (id < 0 || id >= int(g.tensors.size())) throw GraphError("tensor id out of range");
             const Tensor& t = g.tensors[size_t(e.engine->host_tensor(id))];  // a device's tensor: its host copy
             if (!t.data) throw GraphError("tensor '" + t.name + "' has no memory (never written)");
             if (rows < 0 || rows > t.rows) throw GraphError("rows out of range");
             return tensor_view(self, t, rows);
           }, py::arg("id"), py::arg("rows"), "View of a tensor's first `rows` rows (for tests and debugging).")
      .def("_inject_fault", [](PyEngine& e, int node, int thread, int backend) {
             std::lock_guard<std::mutex> lock(e.engine->run_mutex());
             if (backend < 0 || size_t(backend) >= e.engine->n_backends()) throw GraphError("backend out of range");
             e.engine->cpu(size_t(backend)).inject_fault(node, thread);
           }, py::arg("node"), py::arg("thread"), py::arg("backend") = 0,
           "Tests only: node `node` throws on pool thread `thread` of `backend` (-1: never).")
      .def("reserve_memory", [](PyEngine& e) {
             py::gil_scoped_release release;
             e.engine->reserve_memory();
           }, "Make the KV cache, state and scratch resident now (a server reserves its KV budget at start).")
      .def_property_readonly("n_copies", [](const PyEngine& e) { return e.engine->copy_plan().copies; },
                             "Copy nodes the engine inserted where tensors cross memory spaces.")
      .def_property_readonly("n_uploads", [](const PyEngine& e) { return e.engine->copy_plan().uploads.size(); },
                             "Weights copied once into a device's memory.")
      .def_property_readonly("device_bytes", [](const PyEngine& e) { return e.engine->device_bytes(); },
                             "Bytes of device memory (state and scratch) the engine holds.")
      .def("node_ops", [](const PyEngine& e) {
             py::list out;
             for (const Node& n : e.engine->graph().nodes) out.append(n.op);
             return out;
           }, "The op of every node the engine runs (its graph after the copies were inserted).")
      .def("node_names", [](const PyEngine& e) {
             py::list out;
             const Graph& g = e.engine->graph();
             for (const Node& n : g.nodes) out.append(g.tensors[size_t(n.dst)].name);
             return out;
           }, "The name of the tensor every node the engine runs writes (as node_ops).")
      .def_property_readonly("n_segments", [](const PyEngine& e) { return e.engine->executor().segments().size(); })
      .def("segments", [](const PyEngine& e) {
             py::list out;
             for (const Segment& s : e.engine->executor().segments()) {
               py::dict d;
               d["backend"] = s.backend; d["nodes"] = s.nodes; d["deps"] = s.deps;
               out.append(d);
             }
             return out;
           }, "The executor's plan: per segment its backend, nodes and the segments it waits for.")
      .def("set_timeline", [](PyEngine& e, bool on) {
             std::lock_guard<std::mutex> lock(e.engine->run_mutex());
             e.engine->executor_mut().set_timeline(on);
           }, py::arg("on"), "Record each segment's start and end in every run (see timeline()).")
      .def("timeline", [](PyEngine& e) {
             std::lock_guard<std::mutex> lock(e.engine->run_mutex());
             py::list out;
             const auto& segs = e.engine->executor().segments();
             const auto& tl = e.engine->executor().timeline();
             for (size_t i = 0; i < tl.size(); ++i)
               out.append(py::make_tuple(int(i), segs[i].backend, tl[i].first, tl[i].second));
             return out;
           }, "(segment, backend, start s, end s) of the last run, from its start; -1 where a segment did not run.")
      .def("set_op_timing", [](PyEngine& e, bool on) { e.engine->cpu().set_op_timing(on); }, py::arg("on"),
           "Start (and reset) or stop accumulating wall time per op kind.")
      .def("op_timing", [](const PyEngine& e) {
             py::dict out;
             const auto& sec = e.engine->cpu().op_seconds();
             const auto& calls = e.engine->cpu().op_calls();
             for (size_t k = 0; k < sec.size(); ++k)
               if (calls[k]) out[op_name(OpKind(k))] = py::make_tuple(sec[k], calls[k]);
             return out;
           }, "{op name: (seconds, calls)} since set_op_timing(True).")
      .def("node_timing", [](const PyEngine& e) {
             const auto& sec = e.engine->cpu().node_seconds();
             py::array_t<double> out(py::ssize_t(sec.size()));
             std::copy(sec.begin(), sec.end(), out.mutable_data());
             return out;
           }, "F64 [nodes]: seconds per graph node (CPU nodes) since set_op_timing(True); empty before a timed run.")
      .def_property_readonly("isa", [](const PyEngine& e) { return std::string(e.engine->cpu().isa()); })
      .def_property_readonly("n_threads", [](const PyEngine& e) { return e.engine->cpu().n_threads(); })
      .def_property_readonly("max_tokens", [](const PyEngine& e) { return e.engine->config().max_tokens; })
      .def_property_readonly("max_outputs", [](const PyEngine& e) { return e.engine->config().max_outputs; })
      .def_property_readonly("scratch_bytes", [](const PyEngine& e) { return e.engine->scratch_bytes(); })
      .def_property_readonly("state_bytes", [](const PyEngine& e) { return e.engine->state_bytes(); });
}

}  // namespace bindings
}  // namespace pyinfer
