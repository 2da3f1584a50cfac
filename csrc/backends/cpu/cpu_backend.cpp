#include "backends/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/cpu/sparse_ops.h"
#include "executor/guards.h"
#include "kernels/act_quant.h"
#include "kernels/attention.h"
#include "kernels/ops_float.h"
#include "kernels/recurrent.h"

namespace pyinfer {

namespace {

// A recurrent node's state rows: each token's (the `rows` source, else row 0) and its position (0 resets).
RecurrentRows recurrent_rows(const Graph& g, const Tensor& state, int positions, int rows) {
  RecurrentRows r;
  r.positions = static_cast<const int32_t*>(g.tensors[size_t(positions)].data);
  r.rows = rows >= 0 ? static_cast<const int32_t*>(g.tensors[size_t(rows)].data) : nullptr;
  r.n_rows = state.rows;
  return r;
}

}  // namespace

struct CpuBackend::Job {
  CpuBackend* self;
  const Graph* graph;
  const std::vector<int>* nodes;
  RunShape shape;
};

CpuBackend::CpuBackend(const Graph& graph, int n_threads, const std::string& isa, int memory_space,
                       int64_t max_tokens)
    : kernels_(select_kernels(isa)), memory_space_(memory_space), pool_(n_threads) {
  int widest_head = 0;
  for (const Node& n : graph.nodes)
    if (n.op == OpKind::Attention) {
      const AttentionParams& p = n.p.attention;
      scratch_per_thread_ = std::max(scratch_per_thread_, attention_thread_floats(p.heads, p.kv_heads, p.head_dim));
      widest_head = std::max(widest_head, p.head_dim);
    } else if (n.op == OpKind::DeltaNet) {
      scratch_per_thread_ = std::max(scratch_per_thread_, delta_net_scratch_floats(n.p.delta_net.head_dim));
    }
  scratch_per_thread_ = (scratch_per_thread_ + 15) / 16 * 16;  // keep each thread's slice on its own lines
  scratch_.assign(size_t(scratch_per_thread_ * pool_.size()), 0.f);
  if (widest_head > 0) {  // split-K state: a few items per thread (attention.h)
    split_items_ = int64_t(kAttnItemsPerThread) * pool_.size();
    split_partial_.assign(size_t(attention_split_floats(split_items_, widest_head)), 0.f);
    split_done_.reset(new std::atomic<int32_t>[size_t(split_items_)]);
    for (int64_t i = 0; i < split_items_; ++i) split_done_[size_t(i)].store(0);
  }
  for (const Node& n : graph.nodes) {
    if (n.op == OpKind::DownAxpy) {
      const Tensor& down = graph.tensors[size_t(n.src[DownAxpySrc::down])];
      max_neurons_ = std::max(max_neurons_, down.rows);
    }
    if (n.op == OpKind::ActiveUnion) max_neurons_ = std::max(max_neurons_, int64_t(n.p.active_union.n_ff));
  }
  neuron_ids_.assign(size_t(kAxpyTokens * max_neurons_ * pool_.size()), 0);
  neuron_coef_.assign(size_t(kAxpyTokens * max_neurons_ * pool_.size()), 0.f);
  neuron_dense_.assign(size_t(max_neurons_ * pool_.size()), 0.f);
  for (const Node& n : graph.nodes) moe_size_.grow(graph, n, max_tokens);
  moe_ints_.assign(size_t((moe_size_.order + moe_size_.start + moe_size_.ids) * pool_.size()), 0);
  moe_x_.assign(size_t(moe_size_.x_bytes * pool_.size()), 0);
  moe_out_.assign(size_t(moe_size_.out * pool_.size()), 0.f);
}

bool CpuBackend::supports(const Graph&, const Node&) const { return true; }

void* CpuBackend::alloc(size_t bytes) {
  void* p = mmap(nullptr, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;  // zero pages, page aligned
}

void CpuBackend::release(void* p, size_t bytes) {
  if (p) munmap(p, bytes ? bytes : 1);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

void CpuBackend::compute(const Graph& graph, const std::vector<int>& nodes, const RunShape& shape) {
  Job job{this, &graph, &nodes, shape};
  if (op_timing_ && node_seconds_.size() < graph.nodes.size()) node_seconds_.resize(graph.nodes.size(), 0.0);
  failed_step_.store(kNoFailure, std::memory_order_relaxed);
  error_ = nullptr;
  pool_.run(&CpuBackend::run_job, &job);
  if (failed_step_.load(std::memory_order_acquire) != kNoFailure) {
    // A node that stopped part-way may leave split-K attention counters mid-count: the next run starts clean.
    for (int64_t i = 0; i < split_items_; ++i) split_done_[size_t(i)].store(0, std::memory_order_relaxed);
    std::rethrow_exception(error_);
  }
}

void CpuBackend::run_job(void* p, int ith, int nth) {
  auto* job = static_cast<Job*>(p);
  CpuBackend* self = job->self;
  int64_t step = 0;  // nodes computed so far in this job: the same count on every thread
  for (int id : *job->nodes) {
    const Node& node = job->graph->nodes[size_t(id)];
    if (!guard_passes(*job->graph, node.guard, job->shape.n_tokens)) continue;  // same decision on every thread
    const bool timed = self->op_timing_ && ith == 0;
    const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    try {
      if (id == self->fault_node_ && ith == self->fault_thread_)
        throw std::runtime_error("injected fault in node " + std::to_string(id) + " on pool thread " + std::to_string(ith));
      self->compute_node(*job->graph, node, job->shape, ith, nth);
    } catch (...) {
      std::lock_guard<std::mutex> lock(self->error_mutex_);
      if (!self->error_) {
        self->error_ = std::current_exception();
        self->failed_step_.store(step, std::memory_order_release);
      }
    }
    self->pool_.barrier();  // every thread arrives, failed or not, so none waits forever
    // Stop after the step that failed. A thread already past this barrier may fail in the next step before a
    // slower one reads the flag, so the test is "failed at this step or earlier": every thread agrees.
    if (self->failed_step_.load(std::memory_order_acquire) <= step) return;
    if (timed) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      self->op_seconds_[size_t(node.op)] += seconds;
      self->op_calls_[size_t(node.op)] += 1;
      self->node_seconds_[size_t(id)] += seconds;
    }
    ++step;
  }
}

void CpuBackend::compute_node(const Graph& g, const Node& n, const RunShape& shape, int ith, int nth) {
  const Tensor& dst = g.tensors[size_t(n.dst)];
  // Most ops read one or two sources, in slots 0 and 1 (named per op in op_params.h).
  const Tensor* s0 = n.src[0] >= 0 ? &g.tensors[size_t(n.src[0])] : nullptr;
  const Tensor* s1 = n.src[1] >= 0 ? &g.tensors[size_t(n.src[1])] : nullptr;
  // KvStore writes into a fixed-size cache; its work is one row per source token.
  const int64_t rows = rows_in_run(n.op == OpKind::KvStore || n.op == OpKind::Copy ? *s0 : dst, shape);
  int64_t r0, r1;

  switch (n.op) {
    case OpKind::MatMul: {
      if (n.src[MatMulSrc::active] >= 0) return cpu_gather_matmul(kernels_, g, n, shape, ith, nth);
      // Split weight rows; every thread does all tokens of its rows.
      thread_share(s0->rows, ith, nth, 16, r0, r1);
      if (r0 >= r1) return;
      MatMulArgs a{s0->type, static_cast<const uint8_t*>(s0->data), s0->row_stride, s0->cols, r0, r1,
                   s1->data, s1->row_stride, rows_in_run(*s1, shape), static_cast<float*>(dst.data), f32_stride(dst)};
      a.w_rows = weight_rows(*s0);
      kernels_.matmul(a);
      return;
    }
    case OpKind::Attention: {
      using S = AttentionSrc;
      const AttentionParams& p = n.p.attention;
      const Tensor& kc = g.tensors[size_t(n.src[S::k_cache])];
      const Tensor& vc = g.tensors[size_t(n.src[S::v_cache])];
      const Tensor* table = n.src[S::table] >= 0 ? &g.tensors[size_t(n.src[S::table])] : nullptr;  // [T, max blocks]
      AttentionArgs a;
      a.q = static_cast<const float*>(s0->data);
      a.q_stride = f32_stride(*s0);
      a.k = static_cast<const uint8_t*>(kc.data);
      a.v = static_cast<const uint8_t*>(vc.data);
      a.k_type = kc.type;
      a.v_type = vc.type;
      a.k_row_bytes = kc.row_stride;
      a.v_row_bytes = vc.row_stride;
      a.positions = static_cast<const int32_t*>(g.tensors[size_t(n.src[S::positions])].data);
      a.n_tokens = rows;
      if (table) {
        a.table = static_cast<const int32_t*>(table->data);
        a.table_cols = table->cols;
        a.block_size = p.block_size;
      }
      a.heads = p.heads;
      a.kv_heads = p.kv_heads;
      a.head_dim = p.head_dim;
      a.v_dim = p.v_dim ? p.v_dim : p.head_dim;
      if (n.src[S::q_rope] >= 0) {  // MLA: a query head is its q part, then its q_rope part
        const Tensor& qr = g.tensors[size_t(n.src[S::q_rope])];
        a.q_rope = static_cast<const float*>(qr.data);
        a.q_rope_stride = f32_stride(qr);
        a.rope_dim = int(qr.cols / p.heads);
      }
      a.window = p.window;
      a.scale = p.scale;
      if (n.src[S::sinks] >= 0) a.sinks = static_cast<const float*>(g.tensors[size_t(n.src[S::sinks])].data);
      a.out = static_cast<float*>(dst.data);
      a.out_stride = f32_stride(dst);
      return attention(kernels_, a,
                       AttentionWorkspace{scratch_.data() + ith * scratch_per_thread_, split_partial_.data(),
                                          split_done_.get(), split_items_},
                       ith, nth);
    }
    case OpKind::NeuronFetch:
      if (ith == 0) {
        if (!store_) throw GraphError("the graph reads offloaded neurons but no neuron store is attached");
        const int u = n.src[NeuronFetchSrc::union_list];  // the run's active rows (count -1: all)
        const int layer = n.p.neuron_fetch.layer;
        switch (n.p.neuron_fetch.mode) {
          case NeuronFetchMode::Rows:
            store_->fetch(layer, u >= 0 ? static_cast<const int32_t*>(g.tensors[size_t(u)].data) : nullptr);
            break;
          case NeuronFetchMode::Release: store_->release(layer); break;
          case NeuronFetchMode::DenseDown: store_->fetch_dense(layer); break;
        }
      }
      return;
    case OpKind::ActiveSet: return cpu_active_set(g, n, shape, ith, nth);
    case OpKind::GatedAct: return cpu_gated_act(g, n, shape, ith, nth);
    case OpKind::ActiveUnion: return cpu_active_union(g, n, shape, ith, neuron_ids_.data());
    case OpKind::DownAxpy: {
      const int64_t lists = kAxpyTokens * max_neurons_;
      return cpu_down_axpy(kernels_, g, n, shape, ith, nth,
                           SparseScratch{neuron_ids_.data() + ith * lists, neuron_coef_.data() + ith * lists,
                                         max_neurons_, neuron_dense_.data() + ith * max_neurons_});
    }
    case OpKind::MoeRoute: return cpu_moe_route(g, n, shape, ith, nth);
    case OpKind::SsmConv: {  // channels split between threads, tokens in order (recurrent.h)
      using S = SsmConvSrc;
      const Tensor& w = g.tensors[size_t(n.src[S::weight])];
      const Tensor& st = g.tensors[size_t(n.src[S::state])];
      SsmConvArgs a{static_cast<const float*>(s0->data), f32_stride(*s0), static_cast<const float*>(w.data),
                    f32_stride(w), w.cols, static_cast<float*>(st.data), f32_stride(st),
                    static_cast<float*>(dst.data), f32_stride(dst), rows, n.p.ssm_conv.silu != 0};
      thread_share(dst.cols, ith, nth, 16, r0, r1);
      if (r0 < r1) ssm_conv(a, recurrent_rows(g, st, n.src[S::positions], n.src[S::rows]), r0, r1);
      return;
    }
    case OpKind::DeltaNet: {  // v heads split between threads, tokens in order
      using S = DeltaNetSrc;
      const DeltaNetParams& p = n.p.delta_net;
      const Tensor& beta = g.tensors[size_t(n.src[S::beta])];
      const Tensor& alpha = g.tensors[size_t(n.src[S::alpha])];
      const Tensor& decay = g.tensors[size_t(n.src[S::decay])];
      const Tensor& st = g.tensors[size_t(n.src[S::state])];
      const auto* dt = static_cast<const float*>(decay.data);
      DeltaNetArgs a{static_cast<const float*>(s0->data), f32_stride(*s0), static_cast<const float*>(beta.data),
                     f32_stride(beta), static_cast<const float*>(alpha.data), f32_stride(alpha), dt,
                     dt + f32_stride(decay), static_cast<float*>(st.data), f32_stride(st),
                     static_cast<float*>(dst.data), f32_stride(dst), rows, p.k_heads, p.v_heads, p.head_dim, p.eps,
                     p.grouped != 0};
      thread_share(p.v_heads, ith, nth, 1, r0, r1);
      if (r0 < r1)
        delta_net(a, recurrent_rows(g, st, n.src[S::positions], n.src[S::rows]), int(r0), int(r1),
                  scratch_.data() + ith * scratch_per_thread_);
      return;
    }
    case OpKind::ExpertFetch:
      if (ith == 0) {
        if (!experts_) throw GraphError("the graph reads offloaded experts but no expert store is attached");
        const Tensor& route = g.tensors[size_t(n.src[ExpertFetchSrc::route])];
        const auto* rows = static_cast<const float*>(route.data);
        if (n.p.expert_fetch.prefetch)  // a prediction for a later layer: reads start, nothing waits
          experts_->prefetch(n.p.expert_fetch.layer, rows, rows_in_run(route, shape), int32_t(route.cols / 2),
                             f32_stride(route));
        else
          experts_->fetch(n.p.expert_fetch.layer, rows, rows_in_run(route, shape), int32_t(route.cols / 2),
                          f32_stride(route));
      }
      return;
    case OpKind::MoeCombine: return cpu_moe_combine(g, n, shape, ith, nth);
    case OpKind::MoeRouteSplit: return cpu_moe_route_split(g, n, shape, ith, nth);
    case OpKind::MoeMatMul: {
      int32_t* ints = moe_ints_.data() + ith * (moe_size_.order + moe_size_.start + moe_size_.ids);
      return cpu_moe_matmul(kernels_, g, n, shape, ith, nth,
                            MoeScratch{ints, ints + moe_size_.order, moe_x_.data() + ith * moe_size_.x_bytes,
                                       moe_out_.data() + ith * moe_size_.out, std::max<int64_t>(moe_size_.tokens, 1),
                                       ints + moe_size_.order + moe_size_.start});
    }
    case OpKind::Softcap: {  // a few rows of a vocabulary's logits: every thread takes a share of each row's columns
      int64_t c0, c1;
      thread_share(dst.cols, ith, nth, 64, c0, c1);
      for (int64_t r = 0; r < rows && c0 < c1; ++r)
        softcap_row(row_ptr<const float>(*s0, r) + c0, row_ptr<float>(dst, r) + c0, c1 - c0, n.p.softcap.cap);
      return;
    }
    default: break;
  }

  // Row-parallel ops.
  thread_share(rows, ith, nth, 1, r0, r1);
  for (int64_t r = r0; r < r1; ++r) {
    switch (n.op) {
      case OpKind::GetRows: {
        const int32_t id = static_cast<const int32_t*>(s1->data)[r];
        float* y = row_ptr<float>(dst, r);
        dequantize_row(s0->type, row_ptr<const uint8_t>(*s0, id), y, dst.cols);
        const float scale = n.p.get_rows.scale;
        if (scale != 0.f)
          for (int64_t c = 0; c < dst.cols; ++c) y[c] *= scale;
        break;
      }
      case OpKind::RmsNorm:
      {  // segment > 0: each segment of that many columns is normalised on its own (per-head QK-norm)
        const int64_t seg = n.p.rms_norm.segment > 0 ? n.p.rms_norm.segment : dst.cols;
        for (int64_t c = 0; c < dst.cols; c += seg)
          rms_norm_row(row_ptr<const float>(*s0, r) + c, static_cast<const float*>(s1->data), row_ptr<float>(dst, r) + c,
                       seg, n.p.rms_norm.eps);
        break;
      }
      case OpKind::Quantize:
        quantize_activations(kernels_, ActScheme(n.p.quantize.scheme), row_ptr<const float>(*s0, r),
                             row_ptr<BlockQ8A>(dst, r), dst.cols);
        break;
      case OpKind::Rope:
      {
        const int f = n.src[RopeSrc::factors];
        const auto& P = n.p.rope;
        rope_row(row_ptr<const float>(*s0, r), row_ptr<float>(dst, r), static_cast<const int32_t*>(s1->data)[r],
                 P.heads, P.head_dim, P.base, P.mode, f >= 0 ? static_cast<const float*>(g.tensors[size_t(f)].data) : nullptr,
                 P.freq_scale != 0.f ? P.freq_scale : 1.f, P.attn_factor != 0.f ? P.attn_factor : 1.f, P.n_rot,
                 &P.ext_factor);  // {ext_factor, yarn_low, yarn_high}: consecutive fields
      }
        break;
      case OpKind::KvStore: {
        const int32_t p = static_cast<const int32_t*>(s1->data)[r];
        if (dst.type == DType::Q8_0)
          quantize_row_q8_0(row_ptr<const float>(*s0, r), row_ptr<BlockQ8_0>(dst, p), dst.cols);
        else if (dst.type == DType::F32)
          std::memcpy(row_ptr<float>(dst, p), row_ptr<const float>(*s0, r), size_t(dst.cols) * sizeof(float));
        else
          kernels_.f32_to_f16(row_ptr<const float>(*s0, r), row_ptr<uint16_t>(dst, p), dst.cols);
        break;
      }
      case OpKind::Add:
        // b of one fixed row: a bias for every row
        add_row(row_ptr<const float>(*s0, r), row_ptr<const float>(*s1, is_bias_row(*s1) ? 0 : r), row_ptr<float>(dst, r),
                dst.cols, n.p.add.scale);
        if (n.p.add.post != 0.f && n.p.add.post != 1.f) scale_row(row_ptr<float>(dst, r), dst.cols, n.p.add.post);
        break;
      case OpKind::SiluMul:
        if (n.p.gated_mul.act == Activation::GeluTanh)
          kernels_.gelu_mul(row_ptr<const float>(*s0, r), row_ptr<const float>(*s1, r), row_ptr<float>(dst, r),
                            dst.cols);
        else if (n.p.gated_mul.act == Activation::SiLU)
          kernels_.silu_mul(row_ptr<const float>(*s0, r), row_ptr<const float>(*s1, r), row_ptr<float>(dst, r),
                            dst.cols);
        else
          gated_act_row(n.p.gated_mul.act, row_ptr<const float>(*s0, r), row_ptr<const float>(*s1, r),
                        row_ptr<float>(dst, r), dst.cols);
        break;
      case OpKind::BiasRelu: {
        const float* x = row_ptr<const float>(*s0, r);
        const float* bias = static_cast<const float*>(s1->data);
        float* y = row_ptr<float>(dst, r);
        for (int64_t c = 0; c < dst.cols; ++c) y[c] = std::max(0.f, x[c] + bias[c]);
        break;
      }
      case OpKind::ScatterCols: {
        const float* x = row_ptr<const float>(*s0, r);
        const int32_t* perm = static_cast<const int32_t*>(s1->data);
        float* y = row_ptr<float>(dst, r);
        for (int64_t c = 0; c < dst.cols; ++c) y[perm[c]] = x[c];
        break;
      }
      case OpKind::Copy:  // host memory on both sides: a row copy (a device backend queues its own)
        std::memcpy(row_ptr<uint8_t>(dst, r), row_ptr<const uint8_t>(*s0, r), dst.row_bytes);
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
