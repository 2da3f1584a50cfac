// Graph: a graph under construction, holding the buffers its weights point into.
#include "bindings.h"

namespace pyinfer {
namespace bindings {

void bind_graph(py::module_& m) {
  py::class_<PyGraph>(m, "Graph")
      .def(py::init<>())
      .def("add_weight", [](PyGraph& g, const std::string& name, DType type, int64_t cols, int64_t rows, py::buffer data) {
             auto held = std::make_shared<py::buffer_info>(data.request());
             const py::buffer_info& info = *held;
             Tensor t{name, type, cols, rows, RowMode::Fixed, Storage::External};
             if (rows < 1 || cols < 1 || cols > kMaxCols || rows > kMaxRows)
               throw GraphError("weight '" + name + "': shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                "] is out of range");
             if (dtype_is_quantized(type) && cols % kQuantBlock)
               throw GraphError("weight '" + name + "': quantized row length must be a multiple of 32");
             const size_t need = checked_bytes(name, rows, dtype_row_bytes(type, cols));
             size_t have = 0;
             if (info.size < 0 || info.itemsize < 1 || __builtin_mul_overflow(size_t(info.size), size_t(info.itemsize), &have))
               throw GraphError("weight '" + name + "': buffer has an invalid size");
             if (have < need)
               throw GraphError("weight '" + name + "': buffer holds " + std::to_string(have) + " bytes, needs " +
                                std::to_string(need));
             int64_t expect = info.itemsize;
             for (int i = int(info.ndim) - 1; i >= 0; --i) {
               if (info.shape[size_t(i)] > 1 && info.strides[size_t(i)] != expect)
                 throw GraphError("weight '" + name + "': buffer must be C-contiguous");
               expect *= info.shape[size_t(i)];
             }
             t.data = info.ptr;
             const int id = g.graph.add_tensor(t);
             g.keep_alive.push_back(std::move(held));
             return id;
           }, py::arg("name"), py::arg("dtype"), py::arg("cols"), py::arg("rows"), py::arg("data"))
      .def("add_paged_weight", [](PyGraph& g, const std::string& name, DType type, int64_t cols, int64_t rows,
                                  std::shared_ptr<NeuronStore> store, int layer, int part) {
             if (g.store && g.store != store) throw GraphError("a graph reads from one neuron store");
             if (!dtype_is_quantized(type) && type != DType::F32 && type != DType::F16 && type != DType::BF16)
               throw GraphError("weight '" + name + "': a neuron store holds weight rows, not " + dtype_name(type));
             if (layer < 0 || layer >= store->n_layers() || part < 0 || part >= kTables)
               throw GraphError("weight '" + name + "': no such layer or part in the neuron store");
             const BundleLayer& b = store->layer(layer);
             const bool dense = part == int(BundlePart::DenseDown);  // the original down [d, n_ff]
             if (rows != (dense ? b.dense_rows : b.n_ff) || rows < 1 || cols < 1 || cols > kMaxCols ||
                 (dtype_is_quantized(type) && cols % kQuantBlock))
               throw GraphError("weight '" + name + "': shape does not match the neuron store's layer");
             const uint64_t part_bytes = dense ? b.dense_row_bytes
                                               : (part + 1 < kBundleParts ? b.part_offset[size_t(part) + 1]
                                                                           : b.bundle_bytes) - b.part_offset[size_t(part)];
             if (part_bytes < dtype_row_bytes(type, cols))
               throw GraphError("weight '" + name + "': rows are longer than the bundle part that holds them");
             Tensor t{name, type, cols, rows, RowMode::Fixed, Storage::External};
             t.data = const_cast<uint8_t**>(store->table(layer, BundlePart(part)));
             t.paged = true;
             g.store = std::move(store);
             return g.graph.add_tensor(t);
           }, py::arg("name"), py::arg("dtype"), py::arg("cols"), py::arg("rows"), py::arg("store"), py::arg("layer"),
           py::arg("part"), "A weight whose rows a NeuronStore holds (part: 0 gate, 1 up, 2 down, 3 the original down "
           "of dense runs).")
      .def("add_expert_weight", [](PyGraph& g, const std::string& name, DType type, int64_t cols, int64_t rows,
                                   std::shared_ptr<ExpertStore> store, int layer, int part) {
             if (g.experts && g.experts != store) throw GraphError("a graph reads from one expert store");
             if (layer < 0 || layer >= store->n_layers() || part < 0 || part >= kExpertParts)
               throw GraphError("weight '" + name + "': no such layer or part in the expert store");
             const ExpertLayer& l = store->layer(layer);
             if (!dtype_is_integer_dot(type) && type != DType::F32 && type != DType::F16 && type != DType::BF16)
               throw GraphError("weight '" + name + "': experts are matmul weights (integer-dot types, F32, F16, BF16)");
             if (rows < 1 || cols < 1 || cols > kMaxCols || rows % l.n_expert ||
                 (dtype_is_quantized(type) && cols % kQuantBlock) ||
                 uint64_t(rows / l.n_expert) * dtype_row_bytes(type, cols) != l.expert_bytes[size_t(part)])
               throw GraphError("weight '" + name + "': shape does not match the expert store's layer");
             Tensor t{name, type, cols, rows, RowMode::Fixed, Storage::External};
             t.row_bytes = t.row_stride = dtype_row_bytes(type, cols);
             t.data = const_cast<uint8_t**>(store->table(layer, part));
             t.paged = true;
             t.experts = l.n_expert;
             g.experts = std::move(store);
             return g.graph.add_tensor(t);
           }, py::arg("name"), py::arg("dtype"), py::arg("cols"), py::arg("rows"), py::arg("store"), py::arg("layer"),
           py::arg("part"), "Merged experts [n_expert * rows, cols] an ExpertStore holds (part: 0 gate, 1 up, 2 down); "
           "readable after the layer's expert_fetch.")
      .def("add_view", [](PyGraph& g, const std::string& name, int base, int64_t cols, int64_t rows, size_t offset,
                          size_t row_stride) { return g.graph.add_view(name, base, cols, rows, offset, row_stride); },
           py::arg("name"), py::arg("base"), py::arg("cols"), py::arg("rows") = 0, py::arg("offset") = 0,
           py::arg("row_stride") = 0,
           "A view of tensor `base`: `cols` elements per row from byte `offset`, rows `row_stride` bytes apart "
           "(0: the base's). `rows`: for a fixed-row base; per-token views have the base's rows.")
      .def("row_stride", [](const PyGraph& g, int id) {
             if (id < 0 || id >= int(g.graph.tensors.size())) throw GraphError("tensor id out of range");
             return g.graph.tensors[size_t(id)].row_stride;
           }, py::arg("id"), "Bytes from one row of a tensor to the next.")
      .def("add_tensor", [](PyGraph& g, const std::string& name, DType type, int64_t cols, RowMode mode,
                            Storage storage, int64_t rows) {
             if (storage == Storage::External) throw GraphError("use add_weight for external tensors");
             return g.graph.add_tensor(Tensor{name, type, cols, rows, mode, storage});
           }, py::arg("name"), py::arg("dtype"), py::arg("cols"), py::arg("row_mode"), py::arg("storage"),
           py::arg("rows") = 0)
      .def("add_node", [](PyGraph& g, OpKind op, int dst, const py::dict& src, const py::dict& params, RunIf run_if,
                          int32_t max_tokens, int when_list, bool when_sparse, int32_t min_tokens) {
             Node n;
             n.op = op;
             n.dst = dst;
             n.guard = NodeGuard{run_if, max_tokens, when_list, when_sparse, min_tokens};
             const OpSignature& sig = op_signature(op);
             auto names = [](const char* const* list, int count, auto get) {
               std::string out;
               for (int k = 0; k < count; ++k)
                 if (get(list, k)) out += (out.empty() ? "" : ", ") + std::string(get(list, k));
               return out.empty() ? std::string("none") : out;
             };
             for (const auto& kv : src) {
               const std::string key = py::str(kv.first);
               const int slot = op_source_slot(op, key.c_str());
               if (slot < 0)
                 throw GraphError(std::string(op_name(op)) + " has no source '" + key + "'; its sources: " +
                                  names(sig.sources, kMaxSources, [](const char* const* l, int k) { return l[k]; }));
               n.src[size_t(slot)] = kv.second.is_none() ? -1 : kv.second.cast<int>();
             }
             for (const auto& kv : params) {
               const std::string key = py::str(kv.first);
               const ParamField* f = op_param(op, key.c_str());
               if (!f)
                 throw GraphError(std::string(op_name(op)) + " has no parameter '" + key + "'; its parameters: " +
                                  names(nullptr, sig.n_params, [&](const char* const*, int k) { return sig.params[k].name; }));
               auto* at = reinterpret_cast<uint8_t*>(&n.p) + f->offset;
               if (f->is_float) {
                 const float v = kv.second.cast<float>();
                 std::memcpy(at, &v, sizeof v);
               } else {
                 const int32_t v = kv.second.cast<int32_t>();
                 std::memcpy(at, &v, sizeof v);
               }
             }
             return g.graph.add_node(n);
           }, py::arg("op"), py::arg("dst"), py::arg("src"), py::arg("params") = py::dict(),
           py::arg("run_if") = RunIf::Always, py::arg("max_tokens") = 0, py::arg("when_list") = -1,
           py::arg("when_sparse") = true, py::arg("min_tokens") = 0,
           "src: {slot name: tensor id}; params: {name: value} (op_signature(op) lists both). max_tokens: skip "
           "runs with more tokens (0: no cap); min_tokens: skip runs with fewer (0: no floor); when_list: an "
           "ActiveUnion result, the node runs only when it chose the sparse path (when_sparse) or the dense one")
      .def("validate", [](const PyGraph& g) { g.graph.validate(); })
      .def("pin", [](PyGraph& g, int id) { g.graph.pinned.push_back(id); },
           "Keep a scratch tensor's memory private so it can be read after a run.")
      .def_property_readonly("n_tensors", [](const PyGraph& g) { return g.graph.tensors.size(); })
      .def_property_readonly("n_nodes", [](const PyGraph& g) { return g.graph.nodes.size(); })
      .def_property("input_tokens", [](const PyGraph& g) { return g.graph.input_tokens; },
                    [](PyGraph& g, int v) { g.graph.input_tokens = v; })
      .def_property("input_positions", [](const PyGraph& g) { return g.graph.input_positions; },
                    [](PyGraph& g, int v) { g.graph.input_positions = v; })
      .def_property("input_out_ids", [](const PyGraph& g) { return g.graph.input_out_ids; },
                    [](PyGraph& g, int v) { g.graph.input_out_ids = v; })
      .def_property("output_logits", [](const PyGraph& g) { return g.graph.output_logits; },
                    [](PyGraph& g, int v) { g.graph.output_logits = v; })
      .def_property("input_slots", [](const PyGraph& g) { return g.graph.input_slots; },
                    [](PyGraph& g, int v) { g.graph.input_slots = v; })
      .def_property("input_kv_table", [](const PyGraph& g) { return g.graph.input_kv_table; },
                    [](PyGraph& g, int v) { g.graph.input_kv_table = v; })
      .def_property("input_state_rows", [](const PyGraph& g) { return g.graph.input_state_rows; },
                    [](PyGraph& g, int v) { g.graph.input_state_rows = v; });
}

}  // namespace bindings
}  // namespace pyinfer
