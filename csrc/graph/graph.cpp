#include "graph/graph.h"

#include <cmath>
#include <initializer_list>
#include <vector>

namespace pyinfer {

size_t checked_bytes(const std::string& name, int64_t rows, size_t row_bytes) {
  size_t bytes = 0;
  if (rows < 0 || __builtin_mul_overflow(size_t(rows), row_bytes, &bytes) || bytes > (size_t(1) << 48))
    throw GraphError("tensor '" + name + "': " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) +
                     " bytes is too large");
  return bytes;
}

int Graph::add_tensor(Tensor t) {
  if (!dtype_is_known(t.type)) throw GraphError("tensor '" + t.name + "': unknown dtype");
  if (t.cols <= 0 || t.cols > kMaxCols)
    throw GraphError("tensor '" + t.name + "': cols must be in [1, 2^31], got " + std::to_string(t.cols));
  if (t.rows < 0 || t.rows > kMaxRows)
    throw GraphError("tensor '" + t.name + "': rows must be in [0, 2^40], got " + std::to_string(t.rows));
  if (t.cols % dtype_block_elems(t.type) != 0)
    throw GraphError("tensor '" + t.name + "': a " + dtype_name(t.type) + " row length must be a multiple of " +
                     std::to_string(dtype_block_elems(t.type)) + ", got " + std::to_string(t.cols));
  t.row_bytes = dtype_row_bytes(t.type, t.cols);
  t.row_stride = t.row_bytes;
  t.view_of = -1;
  t.offset = 0;
  checked_bytes(t.name, t.rows, t.row_bytes);
  tensors.push_back(std::move(t));
  return static_cast<int>(tensors.size()) - 1;
}

int Graph::add_view(const std::string& name, int base_id, int64_t cols, int64_t rows, size_t offset,
                    size_t row_stride) {
  if (base_id < 0 || base_id >= int(tensors.size())) throw GraphError("view '" + name + "': base tensor id out of range");
  const Tensor base = tensors[size_t(base_id)];
  auto fail = [&](const std::string& why) { throw GraphError("view '" + name + "' of '" + base.name + "': " + why); };
  // Index tensors are checked entry by entry (graph inputs per run, constants once); a view would escape that.
  if (base.type == DType::I32 || base.storage == Storage::Input) fail("ids and inputs cannot be viewed");
  if (base.paged) fail("a paged weight has no contiguous bytes to view");
  Tensor t{name, base.type, cols, base.row_mode == RowMode::Fixed ? rows : 0, base.row_mode, base.storage};
  const int id = add_tensor(t);  // checks cols and the block size
  Tensor& v = tensors[size_t(id)];
  try {
    const size_t block = dtype_row_bytes(v.type, dtype_block_elems(v.type));
    v.row_stride = row_stride ? row_stride : base.row_stride;
    if (v.row_stride < v.row_bytes) fail("rows overlap (stride below the row's bytes)");
    if (offset % block || v.row_stride % block) fail("offset and stride must be whole " + std::string(dtype_name(v.type)) +
                                                     " blocks (" + std::to_string(block) + " bytes)");
    if (base.row_mode == RowMode::Fixed) {
      if (rows < 1) fail("a view of a fixed-row tensor needs rows >= 1");
      const size_t extent = size_t(v.rows - 1) * v.row_stride + v.row_bytes;
      const size_t base_extent = size_t(base.rows - 1) * base.row_stride + base.row_bytes;
      if (base.rows < 1 || offset > base_extent || extent > base_extent - offset) fail("the view ends past its base");
    } else if (v.row_stride != base.row_stride || offset + v.row_bytes > base.row_bytes) {
      fail("a per-token view must lie within each base row (same stride)");
    }
  } catch (...) {
    tensors.pop_back();
    throw;
  }
  v.view_of = base_id;
  v.offset = offset;
  if (base.data) v.data = static_cast<uint8_t*>(base.data) + offset;  // weights: bound now; others by the engine
  return id;
}

int Graph::add_node(const Node& n) {
  nodes.push_back(n);
  return static_cast<int>(nodes.size()) - 1;
}

const char* Graph::input_role(int id) const {
  if (id < 0) return nullptr;
  if (id == input_tokens) return "tokens";
  if (id == input_positions) return "positions";
  if (id == input_out_ids) return "out_ids";
  if (id == input_slots) return "slots";
  if (id == input_kv_table) return "kv_table";
  if (id == input_state_rows) return "state_rows";
  return nullptr;
}

}  // namespace pyinfer
