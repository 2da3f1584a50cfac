// pybind11 lives only here. The core never sees Python; every run releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "engine/engine.h"
#include "executor/read_roof.h"
#include "kernels/kernels.h"
#include "kernels/ops_float.h"
#include "kernels/repack.h"
#ifdef PYINFER_WITH_CUDA
#include "cuda_backend.h"
#include "cuda_info.h"
#endif

namespace py = pybind11;
using namespace pyinfer;

namespace {

// A weight's buffer export, held for as long as any graph or engine points into it: while it is held the
// exporter (a numpy array, an mmap) can neither free nor move the memory (mmap.close() raises instead).
using HeldBuffer = std::shared_ptr<py::buffer_info>;

// A graph under construction plus the buffers its weights point into.
struct PyGraph {
  Graph graph;
  std::vector<HeldBuffer> keep_alive;
  std::shared_ptr<NeuronStore> store;  // of the paged weights, if any
  std::shared_ptr<ExpertStore> experts;  // of the offloaded experts, if any
};

struct PyEngine {
  std::unique_ptr<Engine> engine;
  std::vector<HeldBuffer> keep_alive;
  int64_t last_outputs = 0;
};

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

const int32_t* data_or_null(const std::optional<I32Array>& a) { return a ? a->data() : nullptr; }

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
          if (gate_fn != int(GateFn::SiLU) && gate_fn != int(GateFn::GeluTanh))
            throw GraphError("gate_cut_bounds: gate_fn must be 1 (SiLU) or 2 (GELU)");
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
        "lo < g < mid (act: SiLU for gate_fn 1, GELU for 2); the `cut` of an expert matmul with a gate.");
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

  py::class_<ExpertStore, std::shared_ptr<ExpertStore>>(m, "ExpertStore")
      .def(py::init([](const std::string& path, const py::list& layers, int64_t cache_slots, const std::string& policy,
                       int io_threads, bool io_uring, bool direct_io) {
             std::vector<ExpertLayer> ls;
             for (const auto& item : layers) {
               const py::dict d = item.cast<py::dict>();
               ExpertLayer l;
               l.n_expert = d["n_expert"].cast<int32_t>();
               const auto offs = d["file_offsets"].cast<std::vector<uint64_t>>();
               const auto bytes = d["expert_bytes"].cast<std::vector<uint64_t>>();
               if (offs.size() != size_t(kExpertParts) || bytes.size() != size_t(kExpertParts))
                 throw GraphError("file_offsets and expert_bytes need 3 entries (gate, up, down)");
               std::copy(offs.begin(), offs.end(), l.file_offset.begin());
               std::copy(bytes.begin(), bytes.end(), l.expert_bytes.begin());
               if (d.contains("expert_strides")) {
                 const auto strides = d["expert_strides"].cast<std::vector<uint64_t>>();
                 if (strides.size() != size_t(kExpertParts)) throw GraphError("expert_strides needs 3 entries");
                 std::copy(strides.begin(), strides.end(), l.expert_stride.begin());
               }
               l.resident = d["resident"].cast<std::vector<int32_t>>();
               ls.push_back(std::move(l));
             }
             if (policy != "lru" && policy != "lfu") throw GraphError("the expert cache policy is 'lru' or 'lfu'");
             py::gil_scoped_release release;
             return std::make_shared<ExpertStore>(path, std::move(ls), cache_slots,
                                                  policy == "lfu" ? ExpertPolicy::Lfu : ExpertPolicy::Lru, io_threads,
                                                  io_uring, direct_io);
           }), py::arg("path"), py::arg("layers"), py::arg("cache_slots"), py::arg("policy") = "lru",
           py::arg("io_threads") = 8, py::arg("io_uring") = true, py::arg("direct_io") = true,
           "Opens a model file and reads each layer's resident experts. layers: dicts of n_expert, file_offsets and "
           "expert_bytes (gate, up, down: where expert 0 of each part starts, the bytes of one expert of it), optional "
           "expert_strides (bytes from one expert to the next; default expert_bytes, a GGUF's merged tensors) and "
           "resident (expert ids kept in RAM). cache_slots: experts of any layer kept after a read, 'lru' or 'lfu' out.")
      .def("fetch", [](ExpertStore& s, int layer, F32Array route, int k) {
             if (route.ndim() != 2 || route.shape(1) != 2 * k) throw GraphError("route is [n_tok, 2k]");
             py::gil_scoped_release release;
             s.fetch(layer, route.data(), route.shape(0), k, route.shape(1));
           }, py::arg("layer"), py::arg("route"), py::arg("k"), "Tests: make the experts a route chose readable.")
      .def("prefetch", [](ExpertStore& s, int layer, F32Array route, int k) {
             if (route.ndim() != 2 || route.shape(1) != 2 * k) throw GraphError("route is [n_tok, 2k]");
             py::gil_scoped_release release;
             s.prefetch(layer, route.data(), route.shape(0), k, route.shape(1));
           }, py::arg("layer"), py::arg("route"), py::arg("k"),
           "Tests: start reading the experts a predicted route names; the next fetch or prefetch waits for them.")
      .def("expert", [](const ExpertStore& s, int layer, int part, int expert) -> py::object {
             if (layer < 0 || layer >= s.n_layers() || part < 0 || part >= kExpertParts || expert < 0 ||
                 expert >= s.layer(layer).n_expert)
               throw GraphError("no such expert");
             const uint8_t* p = s.table(layer, part)[expert];
             if (!p) return py::none();
             return py::bytes(reinterpret_cast<const char*>(p), size_t(s.layer(layer).expert_bytes[size_t(part)]));
           }, py::arg("layer"), py::arg("part"), py::arg("expert"), "Tests: an expert's bytes in RAM now, or None.")
      .def("stats", [](const ExpertStore& s) {
             const ExpertStoreStats st = s.stats();
             py::dict d;
             d["fetches"] = st.fetches; d["requests"] = st.requests; d["resident_hits"] = st.resident_hits;
             d["cache_hits"] = st.cache_hits; d["misses"] = st.misses; d["evictions"] = st.evictions;
             d["bytes_read"] = st.bytes_read; d["read_seconds"] = st.read_seconds;
             d["resident_bytes"] = st.resident_bytes; d["cache_bytes"] = st.cache_bytes;
             d["cache_slots"] = st.cache_slots; d["io_engine"] = std::string(st.io_engine);
             d["direct_io"] = st.direct_io;
             d["predicted"] = st.predicted; d["predicted_right"] = st.predicted_right;
             d["prefetched"] = st.prefetched; d["prefetch_used"] = st.prefetch_used;
             d["prefetch_bytes"] = st.prefetch_bytes; d["prefetch_failures"] = st.prefetch_failures;
             d["prefetch_wait_seconds"] = st.prefetch_wait_seconds;
             return d;
           }, "Fetches, hits, misses and bytes read since the last reset_stats().")
      .def("chosen", [](const ExpertStore& s) { return s.chosen(); },
           "Per layer and expert: how many fetches chose it since the last reset_stats() (a routing profile).")
      .def("reset_stats", &ExpertStore::reset_stats)
      .def_property_readonly("n_layers", &ExpertStore::n_layers);

  py::class_<NeuronStore, std::shared_ptr<NeuronStore>>(m, "NeuronStore")
      .def(py::init([](const std::string& path, const py::list& layers, int ring_slots, bool direct_io,
                       int io_threads, uint64_t cache_bytes, bool io_uring, uint64_t merge_gap, uint64_t max_range) {
             std::vector<BundleLayer> ls;
             for (const auto& item : layers) {
               const py::dict d = item.cast<py::dict>();
               BundleLayer b;
               b.n_ff = d["n_ff"].cast<int64_t>();
               b.resident = d["resident"].cast<int64_t>();
               b.file_offset = d["file_offset"].cast<uint64_t>();
               b.bundle_bytes = d["bundle_bytes"].cast<uint64_t>();
               const auto offs = d["part_offsets"].cast<std::vector<uint64_t>>();
               if (offs.size() != size_t(kBundleParts)) throw GraphError("part_offsets needs 3 entries");
               std::copy(offs.begin(), offs.end(), b.part_offset.begin());
               if (d.contains("selective")) b.selective = d["selective"].cast<bool>();
               if (d.contains("window")) b.window = d["window"].cast<int64_t>();
               if (d.contains("dense_offset")) {
                 b.dense_offset = d["dense_offset"].cast<uint64_t>();
                 b.dense_rows = d["dense_rows"].cast<int64_t>();
                 b.dense_row_bytes = d["dense_row_bytes"].cast<uint64_t>();
               }
               if (d.contains("down_rows") && !d["down_rows"].is_none())
                 b.row_of[size_t(BundlePart::Down)] = d["down_rows"].cast<std::vector<int32_t>>();
               ls.push_back(std::move(b));
             }
             py::gil_scoped_release release;
             try {
               return std::make_shared<NeuronStore>(path, std::move(ls), ring_slots, direct_io, io_threads, cache_bytes,
                                                    io_uring, ReadClusters{merge_gap, max_range});
             } catch (const std::invalid_argument& e) {
               throw GraphError(e.what());
             }
           }), py::arg("path"), py::arg("layers"), py::arg("ring_slots") = 2, py::arg("direct_io") = true,
           py::arg("io_threads") = 4, py::arg("cache_bytes") = 0, py::arg("io_uring") = true,
           py::arg("merge_gap") = ReadClusters{}.merge_gap, py::arg("max_range") = ReadClusters{}.max_range,
           "Opens a bundle file and reads each layer's resident bundles. layers: dicts of n_ff, resident, "
           "file_offset, bundle_bytes, part_offsets (gate, up, down), optional down_rows (table row of bundle k) and "
           "selective (decode reads only the listed rows, on demand). cache_bytes: an LRU cache of the selective "
           "layers' cold neurons, for the tokens that follow. io_uring: selective reads through io_uring where the "
           "kernel allows it (else, and with False, pread threads). merge_gap / max_range: listed reads merge page "
           "ranges closer than merge_gap bytes and cut them at max_range bytes.")
      .def("fetch", [](NeuronStore& s, int layer, std::optional<I32Array> ids) {
             std::vector<int32_t> list;
             if (ids) {
               list.push_back(int32_t(ids->size()));
               list.insert(list.end(), ids->data(), ids->data() + ids->size());
             }
             py::gil_scoped_release release;
             s.fetch(layer, ids ? list.data() : nullptr);
           }, py::arg("layer"), py::arg("ids") = py::none(),
           "Tests: make a layer's rows readable (a selective layer's: only `ids`, ascending), as a NeuronFetch does.")
      .def("release", [](NeuronStore& s, int layer) {
             py::gil_scoped_release release;
             s.release(layer);
           }, py::arg("layer"), "Tests: the layer's readers are done, as a release NeuronFetch says.")
      .def("fetch_dense", [](NeuronStore& s, int layer) {
             py::gil_scoped_release release;
             s.fetch_dense(layer);
           }, py::arg("layer"), "Tests: read a layer's original down for a dense run, as a dense-down NeuronFetch does.")
      .def("row", [](const NeuronStore& s, int layer, int part, int64_t row, int64_t n_bytes) {
             if (layer < 0 || layer >= s.n_layers() || part < 0 || part >= kTables || row < 0 ||
                 row >= (part == int(BundlePart::DenseDown) ? s.layer(layer).dense_rows : s.layer(layer).n_ff) ||
                 n_bytes < 0)
               throw GraphError("no such row");
             const uint8_t* p = s.table(layer, BundlePart(part))[row];
             if (!p) throw GraphError("row is not fetched");
             return py::bytes(reinterpret_cast<const char*>(p), size_t(n_bytes));
           }, py::arg("layer"), py::arg("part"), py::arg("row"), py::arg("n_bytes"),
           "Tests: the first n_bytes of a row as the tables point to it now.")
      .def("stats", [](const NeuronStore& s) {
             const NeuronStoreStats st = s.stats();
             py::dict d;
             d["bytes_read"] = st.bytes_read; d["reads"] = st.reads; d["read_seconds"] = st.read_seconds;
             d["wait_seconds"] = st.wait_seconds; d["fetches"] = st.fetches; d["resident_bytes"] = st.resident_bytes;
             d["ring_bytes"] = st.ring_bytes; d["direct_io"] = st.direct_io; d["listed_reads"] = st.listed_reads;
             d["listed_neurons"] = st.listed_neurons; d["listed_hits"] = st.listed_hits;
             d["cache_hits"] = st.cache_hits; d["cache_evictions"] = st.cache_evictions; d["window_hits"] = st.window_hits;
             d["cache_bytes"] = st.cache_bytes; d["io_engine"] = std::string(st.io_engine);
             d["dense_bytes_read"] = st.dense_bytes_read; d["dense_seconds"] = st.dense_seconds;
             return d;
           }, "Reads, bytes and seconds since the last reset_stats().")
      .def("reset_stats", &NeuronStore::reset_stats)
      .def_property_readonly("n_layers", &NeuronStore::n_layers);

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
                                  names(sig.sources, 6, [](const char* const* l, int k) { return l[k]; }));
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
                    [](PyGraph& g, int v) { g.graph.input_kv_table = v; });

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
                     std::optional<I32Array> out_ids, std::optional<I32Array> slots, std::optional<I32Array> kv_table) {
             auto check = [&](const std::optional<I32Array>& a, int64_t n, const char* what) {
               if (a && a->size() != n)
                 throw GraphError(std::string(what) + " has " + std::to_string(a->size()) + " entries, expected " +
                                  std::to_string(n));
             };
             const int64_t n_out = out_ids ? out_ids->size() : 0;
             check(tokens, n_tokens, "tokens");
             check(positions, n_tokens, "positions");
             check(slots, n_tokens, "slots");
             int64_t table_cols = 0;
             if (kv_table) {
               if (kv_table->ndim() != 2 || kv_table->shape(0) != n_tokens)
                 throw GraphError("kv_table must be int32 [n_tokens, max_blocks]");
               table_cols = kv_table->shape(1);
             }
             {
               py::gil_scoped_release release;
               e.engine->run(data_or_null(tokens), data_or_null(positions), n_tokens, data_or_null(out_ids), n_out,
                             data_or_null(slots), data_or_null(kv_table), table_cols);
             }
             e.last_outputs = n_out;
           }, py::arg("n_tokens"), py::arg("tokens") = py::none(), py::arg("positions") = py::none(),
           py::arg("out_ids") = py::none(), py::arg("slots") = py::none(), py::arg("kv_table") = py::none(),
           "Computes one batch. Inputs are int32 arrays of n_tokens entries (out_ids: rows whose logits are wanted).")
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
