#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "kernels/ops_float.h"

namespace pyinfer {

namespace {

template <typename T>
T* row_ptr(const Tensor& t, int64_t row) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(t.data) + row * int64_t(t.row_bytes));
}

// Contiguous share [begin, end) of n items for thread ith, in multiples of `align`.
inline void share(int64_t n, int ith, int nth, int64_t align, int64_t& begin, int64_t& end) {
  const int64_t units = (n + align - 1) / align;
  const int64_t per = units / nth, extra = units % nth;
  const int64_t u0 = ith * per + std::min<int64_t>(ith, extra);
  const int64_t u1 = u0 + per + (ith < extra ? 1 : 0);
  begin = std::min(n, u0 * align);
  end = std::min(n, u1 * align);
}

}  // namespace

struct CpuBackend::Job {
  CpuBackend* self;
  const Graph* graph;
  const std::vector<int>* nodes;
  RunShape shape;
};

CpuBackend::CpuBackend(const Graph& graph, int n_threads, const std::string& isa)
    : kernels_(select_kernels(isa)), pool_(n_threads) {
  for (const Node& n : graph.nodes)
    if (n.op == OpKind::Attention)
      scratch_per_thread_ = std::max(scratch_per_thread_, graph.tensors[size_t(n.src[1])].rows);
  scratch_per_thread_ = (scratch_per_thread_ + 15) / 16 * 16;  // keep each thread's slice on its own lines
  scratch_.assign(size_t(scratch_per_thread_ * pool_.size()), 0.f);
}

bool CpuBackend::supports(const Graph&, const Node&) const { return true; }

void CpuBackend::compute(const Graph& graph, const std::vector<int>& nodes, const RunShape& shape) {
  Job job{this, &graph, &nodes, shape};
  pool_.run(&CpuBackend::run_job, &job);
}

void CpuBackend::run_job(void* p, int ith, int nth) {
  auto* job = static_cast<Job*>(p);
  for (int id : *job->nodes) {
    job->self->compute_node(*job->graph, job->graph->nodes[size_t(id)], job->shape, ith, nth);
    job->self->pool_.barrier();
  }
}

void CpuBackend::compute_node(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  const Tensor* s0 = n.src[0] >= 0 ? &g.tensors[size_t(n.src[0])] : nullptr;
  const Tensor* s1 = n.src[1] >= 0 ? &g.tensors[size_t(n.src[1])] : nullptr;
  // KvStore writes into a fixed-size cache; its work is one row per source token.
  const int64_t rows = rows_in_run(n.op == OpKind::KvStore ? *s0 : dst, shape);
  int64_t r0, r1;

  switch (n.op) {
    case OpKind::MatMul: {
      // Split weight rows; every thread does all tokens of its rows.
      share(s0->rows, ith, nth, 16, r0, r1);
      if (r0 >= r1) return;
      MatMulArgs a{s0->type, static_cast<const uint8_t*>(s0->data), s0->row_bytes, s0->cols, r0, r1,
                   s1->data, s1->row_bytes, rows_in_run(*s1, shape), static_cast<float*>(dst.data), dst.cols};
      kernels_.matmul(a);
      return;
    }
    case OpKind::Attention: {
      const Tensor& kc = g.tensors[size_t(n.src[1])];
      const Tensor& vc = g.tensors[size_t(n.src[2])];
      const Tensor& pos = g.tensors[size_t(n.src[3])];
      const int heads = n.i[0], kv_heads = n.i[1], hd = n.i[2];
      const int group = heads / kv_heads;
      float* scratch = scratch_.data() + ith * scratch_per_thread_;
      share(rows * heads, ith, nth, 1, r0, r1);
      for (int64_t item = r0; item < r1; ++item) {
        const int64_t t = item / heads;
        const int h = int(item % heads);
        const int64_t n_kv = int64_t(static_cast<const int32_t*>(pos.data)[t]) + 1;  // causal
        const int64_t kv_off = int64_t(h / group) * hd;
        attention_head(kernels_, row_ptr<const float>(*s0, t) + int64_t(h) * hd,
                       static_cast<const uint16_t*>(kc.data) + kv_off, static_cast<const uint16_t*>(vc.data) + kv_off,
                       kc.cols, n_kv, hd, n.f[0], scratch, row_ptr<float>(dst, t) + int64_t(h) * hd);
      }
      return;
    }
    default: break;
  }

  // Row-parallel ops.
  share(rows, ith, nth, 1, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    switch (n.op) {
      case OpKind::GetRows: {
        const int32_t id = static_cast<const int32_t*>(s1->data)[r];
        dequantize_row(s0->type, row_ptr<const uint8_t>(*s0, id), row_ptr<float>(dst, r), dst.cols);
        break;
      }
      case OpKind::RmsNorm:
        rms_norm_row(row_ptr<const float>(*s0, r), static_cast<const float*>(s1->data), row_ptr<float>(dst, r),
                     dst.cols, n.f[0]);
        break;
      case OpKind::Quantize:
        kernels_.quantize_q8a(row_ptr<const float>(*s0, r), row_ptr<BlockQ8A>(dst, r), dst.cols);
        break;
      case OpKind::Rope:
        rope_row(row_ptr<const float>(*s0, r), row_ptr<float>(dst, r), static_cast<const int32_t*>(s1->data)[r],
                 n.i[0], n.i[1], n.f[0]);
        break;
      case OpKind::KvStore: {
        const int32_t p = static_cast<const int32_t*>(s1->data)[r];
        kernels_.f32_to_f16(row_ptr<const float>(*s0, r), row_ptr<uint16_t>(dst, p), dst.cols);
        break;
      }
      case OpKind::Add:
        add_row(row_ptr<const float>(*s0, r), row_ptr<const float>(*s1, r), row_ptr<float>(dst, r), dst.cols);
        break;
      case OpKind::SiluMul:
        silu_mul_row(row_ptr<const float>(*s0, r), row_ptr<const float>(*s1, r), row_ptr<float>(dst, r), dst.cols);
        break;
      case OpKind::SelectRows: {
        const int32_t src_row = static_cast<const int32_t*>(s1->data)[r];
        std::memcpy(row_ptr<float>(dst, r), row_ptr<const float>(*s0, src_row), size_t(dst.cols) * 4);
        break;
      }
      default: break;
    }
  }
}

}  // namespace pyinfer
