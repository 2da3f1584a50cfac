// What the binding files share (pybind11 lives only in bindings/; the core never sees Python).
#pragma once
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

namespace pyinfer {
namespace bindings {

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

inline const int32_t* data_or_null(const std::optional<I32Array>& a) { return a ? a->data() : nullptr; }

// The parts of the _core module, one file each.
void bind_stores(py::module_& m);  // stores.cpp: ExpertStore, NeuronStore
void bind_graph(py::module_& m);   // graph.cpp: Graph
void bind_engine(py::module_& m);  // engine.cpp: Engine

}  // namespace bindings
}  // namespace pyinfer
