// The offload stores: ExpertStore (a MoE's streamed experts) and NeuronStore (streamed FFN neurons).
#include "bindings.h"

namespace pyinfer {
namespace bindings {

void bind_stores(py::module_& m) {
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
}

}  // namespace bindings
}  // namespace pyinfer
