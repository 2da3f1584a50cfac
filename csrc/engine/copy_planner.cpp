#include "engine/copy_planner.h"

#include <map>
#include <string>
#include <utility>

namespace pyinfer {

namespace {

// The state a node rewrites in place through a source (a recurrent layer's rows): it lives where that node runs.
int in_place_state(const Node& n) {
  if (n.op == OpKind::SsmConv) return n.src[SsmConvSrc::state];
  if (n.op == OpKind::DeltaNet) return n.src[DeltaNetSrc::state];
  return -1;
}

struct Mirror {
  int tensor = -1;
  int64_t version = -1;  // the write count of its source's root when it was last refreshed
};

class CopyPlanner {
 public:
  CopyPlanner(Graph& g, std::vector<int>& placement, const std::vector<int>& space_of)
      : g_(g), placement_(placement), space_of_(space_of) {
    const size_t nt = g_.tensors.size();
    root_.resize(nt);
    home_.assign(nt, -1);
    version_.assign(nt, 0);
    for (size_t i = 0; i < nt; ++i) {
      const Tensor& t = g_.tensors[i];
      root_[i] = t.view_of >= 0 ? root_[size_t(t.view_of)] : int(i);
      if (t.storage == Storage::External || t.storage == Storage::Input) home_[i] = 0;
    }
    for (size_t b = 0; b < space_of_.size(); ++b)
      if (!backend_of_space_.count(space_of_[b])) backend_of_space_[space_of_[b]] = int(b);
    // A tensor lives where its first writer runs (state read before that writer in graph order, a KV cache
    // read by attention in the run after the one that wrote it, is still read from there).
    for (size_t k = 0; k < g_.nodes.size(); ++k) {
      const int r = root_[size_t(g_.nodes[k].dst)];
      if (home_[size_t(r)] < 0) home_[size_t(r)] = space_of_[size_t(placement_[k])];
      const int st = in_place_state(g_.nodes[k]);
      if (st >= 0 && home_[size_t(root_[size_t(st)])] < 0) home_[size_t(root_[size_t(st)])] = space_of_[size_t(placement_[k])];
    }
  }

  CopyPlan run() {
    std::vector<Node> nodes;
    std::vector<int> placement;
    for (size_t k = 0; k < g_.nodes.size(); ++k) {
      Node n = g_.nodes[k];
      const int backend = placement_[k];
      const int space = space_of_[size_t(backend)];
      const int st = in_place_state(n);
      if (st >= 0 && home_[size_t(root_[size_t(st)])] != space)
        throw GraphError("node " + std::to_string(k) + " (" + op_name(n.op) + ") rewrites state '" +
                         g_.tensors[size_t(st)].name + "' outside its memory space (a state is used in one space only)");
      for (int& s : n.src)
        if (s >= 0) s = readable(s, space, backend, nodes, placement);
      if (n.guard.when_list >= 0) n.guard.when_list = readable(n.guard.when_list, space, backend, nodes, placement);
      const int r = root_[size_t(n.dst)];
      if (home_[size_t(r)] != space)
        throw GraphError("node " + std::to_string(k) + " (" + op_name(n.op) + ") writes '" +
                         g_.tensors[size_t(n.dst)].name + "' in memory space " + std::to_string(space) +
                         "; it lives in space " + std::to_string(home_[size_t(r)]) +
                         " (a tensor is written in one space only)");
      ++version_[size_t(r)];
      nodes.push_back(n);
      placement.push_back(backend);
    }
    // What the caller reads after a run must be in host memory.
    plan_.host_of.resize(g_.tensors.size());
    for (size_t i = 0; i < plan_.host_of.size(); ++i) plan_.host_of[i] = int(i);
    std::vector<int> wanted(g_.pinned);
    if (g_.output_logits >= 0) wanted.push_back(g_.output_logits);
    for (int t : wanted) {
      if (t < 0 || size_t(t) >= root_.size() || home_[size_t(root_[size_t(t)])] <= 0) continue;
      const int host = readable(t, 0, backend_of_space_.at(home_[size_t(root_[size_t(t)])]), nodes, placement);
      plan_.host_of[size_t(t)] = host;
      g_.pinned.push_back(host);
    }
    if (g_.output_logits >= 0) g_.output_logits = plan_.host_of[size_t(g_.output_logits)];
    for (size_t i = 0; i < g_.tensors.size(); ++i)
      if (i < root_.size() && home_[size_t(root_[i])] > 0) g_.tensors[i].memory = home_[size_t(root_[i])];
    g_.nodes = std::move(nodes);
    placement_ = std::move(placement);
    return std::move(plan_);
  }

 private:
  // The tensor a node in `space` (on `backend`) reads for tensor t: t itself, or its mirror there, brought up
  // to date by a Copy node appended before the reader when t was written since the last copy.
  int readable(int t, int space, int backend, std::vector<Node>& nodes, std::vector<int>& placement) {
    const int r = root_[size_t(t)];
    const int home = home_[size_t(r)];
    if (home < 0 || home == space) return t;  // never written: the engine's planner names the error
    const Tensor src = g_.tensors[size_t(t)];
    if (home != 0 && space != 0)
      throw GraphError("tensor '" + src.name + "' crosses between two devices; copies go through host memory");
    if (src.paged) throw GraphError("paged weight '" + src.name + "' is read from host memory only");
    Mirror& m = mirrors_[{t, space}];
    if (m.tensor < 0) {
      Tensor copy{src.name + "@" + std::to_string(space), src.type, src.cols,
                  src.row_mode == RowMode::Fixed ? src.rows : 0, src.row_mode,
                  src.storage == Storage::External ? Storage::State : Storage::Scratch};
      m.tensor = g_.add_tensor(copy);
      g_.tensors[size_t(m.tensor)].memory = space;
      g_.tensors[size_t(m.tensor)].copy_of = t;
      if (src.storage == Storage::External) {  // weights never change: uploaded once, at setup
        plan_.uploads.emplace_back(m.tensor, t);
        m.version = version_[size_t(r)];
      }
    }
    if (m.version != version_[size_t(r)]) {
      Node c;
      c.op = OpKind::Copy;
      c.dst = m.tensor;
      c.src[CopySrc::x] = t;
      nodes.push_back(c);
      // The device side queues the copy, whichever way it goes.
      placement.push_back(space != 0 ? backend : backend_of_space_.at(home));
      m.version = version_[size_t(r)];
      ++plan_.copies;
    }
    return m.tensor;
  }

  Graph& g_;
  std::vector<int>& placement_;
  const std::vector<int>& space_of_;
  std::vector<int> root_, home_;
  std::vector<int64_t> version_;  // per root: writes so far in graph order
  std::map<std::pair<int, int>, Mirror> mirrors_;  // (tensor, space) -> its mirror there
  std::map<int, int> backend_of_space_;
  CopyPlan plan_;
};

}  // namespace

CopyPlan insert_copies(Graph& graph, std::vector<int>& placement, const std::vector<int>& space_of) {
  return CopyPlanner(graph, placement, space_of).run();
}

}  // namespace pyinfer
