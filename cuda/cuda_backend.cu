// The CUDA backend (cuda_backend.h): device buffers, one stream, pinned staging for the copies the engine
// inserts where tensors cross between host and device, and the kernels (kernels/): the dense ops and the
// neuron-aware ones (active lists, gather-GEMV, gated activation, down axpy, Q4T downs included). A decode
// step's segments are replayed as CUDA graphs (decode_graph.h says when); prefill's dense matmuls may go to
// cuBLAS (cublas_gemm.h). Not here: the active union and nodes guarded by its decision (a guard reads host
// memory) and paged weights; supports() says so, and the engine refuses a placement that puts them here.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cublas_gemm.h"
#include "cuda_backend.h"
#include "decode_graph.h"
#include "executor/guards.h"
#include "kernels/moe.cuh"
#include "kernels/ops.cuh"
#include "kernels/piece_types.cuh"
#include "kernels/recurrent.cuh"

namespace pyinfer {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

bool weight_type_ok(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0:
    case DType::Q5_1: case DType::Q8_0: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return cuda::is_piece_type(t);  // the low-bit types: the CPU's piece decoder, on the device
  }
}

cuda::Rows rows_of(const Tensor& t, int64_t rows) {
  return cuda::Rows{static_cast<uint8_t*>(t.data), rows, t.cols, int64_t(t.row_stride), t.type};
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Graph&, int device, int memory_space)
      : device_(device), space_(memory_space), gemm_(std::make_unique<PrefillGemm>(device, kCublasMinTokens)) {
    if (memory_space <= 0) throw std::runtime_error("a CUDA backend needs a memory space of its own (> 0)");
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = "cuda:" + std::to_string(device) + " " + prop.name;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Blocking sync: the driver thread sleeps while the GPU works instead of spinning on a core the CPU
    // backend needs for its half of the layer.
    const cudaError_t e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming | cudaEventBlockingSync);
    if (e != cudaSuccess) cudaStreamDestroy(stream_);  // the destructor does not run for a throwing constructor
    check(e, "cudaEventCreate");
  }
  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    gemm_.reset();  // its cuBLAS handle knows the stream: gone before the stream is
    if (staging_) cudaFreeHost(staging_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  int memory_space() const override { return space_; }

  bool supports(const Graph& g, const Node& n) const override {
    if (n.guard.when_list >= 0) return false;  // a sparse FFN's path choice reads host memory
    auto src = [&](int slot) -> const Tensor& { return g.tensors[size_t(n.src[size_t(slot)])]; };
    switch (n.op) {
      case OpKind::MatMul:  // dense, or a gather over an active list
        return !src(MatMulSrc::weight).paged && weight_type_ok(src(MatMulSrc::weight).type) &&
               (src(MatMulSrc::x).type == DType::F32 || src(MatMulSrc::x).type == DType::Q8A);
      case OpKind::DownAxpy:  // neuron-major down rows, or Q4T with its groups' scales
        return !src(DownAxpySrc::down).paged &&
               (weight_type_ok(src(DownAxpySrc::down).type) ||
                (src(DownAxpySrc::down).type == DType::Q4T && n.src[DownAxpySrc::scales] >= 0));
      case OpKind::ActiveSet: return n.p.active_set.top_k == 0;  // (a fixed density runs on the CPU)
      case OpKind::GatedAct: return true;
      case OpKind::GetRows: return !src(GetRowsSrc::table).paged && weight_type_ok(src(GetRowsSrc::table).type);
      case OpKind::Attention:
        return src(AttentionSrc::k_cache).type == DType::F16 && src(AttentionSrc::v_cache).type == DType::F16 &&
               n.p.attention.head_dim <= cuda::kMaxAttentionDims && n.p.attention.v_dim <= n.p.attention.head_dim &&
               n.p.attention.kv_heads > 0;  // MLA included: q_rope, value heads shorter than key heads
      case OpKind::KvStore: return g.tensors[size_t(n.dst)].type == DType::F16;
      case OpKind::RmsNorm: case OpKind::Quantize: case OpKind::Rope: case OpKind::Add: case OpKind::SiluMul:
      case OpKind::SelectRows: case OpKind::BiasRelu: case OpKind::ScatterCols: case OpKind::Copy: case OpKind::Softcap:
        return true;
      // Experts: whole merged tensors in device memory (streamed experts stay on the CPU).
      case OpKind::MoeRoute: case OpKind::MoeCombine: case OpKind::MoeRouteSplit: return true;
      // The recurrent layers: their state lives where the node runs (copy_planner.cpp).
      case OpKind::SsmConv: return true;
      case OpKind::DeltaNet: return cuda::delta_net_fits(n.p.delta_net);
      case OpKind::MoeMatMul:  // routed, or slot s on expert s (a matmul per head); with or without expert biases
        return !src(MoeMatMulSrc::weight).paged && weight_type_ok(src(MoeMatMulSrc::weight).type) &&
               (src(MoeMatMulSrc::x).type == DType::F32 || src(MoeMatMulSrc::x).type == DType::Q8A);
      default: return false;
    }
  }

  void* alloc(size_t bytes) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    // On the backend's own stream: the weight uploads and kernels queued after it see the zeros.
    check(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 1), stream_), "cudaMemsetAsync");
    return p;
  }
  void release(void* p, size_t) override {
    if (p) {
      cudaSetDevice(device_);
      cudaFree(p);
    }
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    check(cudaGetLastError(), "a kernel");
  }

  void compute(const Graph& g, const std::vector<int>& nodes, const RunShape& shape) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    staged_ = 0;
    pending_.clear();
    uploads_.clear();
    DecodeGraph* replay = graphs_.find(nodes, shape);
    const std::vector<Pending>* landing = &pending_;
    try {
      if (replay != nullptr && replay->ready()) {
        for (const Upload& u : replay->uploads) stage_rows(u);  // this run's inputs into the same staging bytes
        check(replay->launch(stream_), "cudaGraphLaunch");
        landing = &replay->pending;
      } else if (replay != nullptr && replay->should_capture()) {
        capture(g, nodes, shape, *replay);
      } else {
        run_nodes(g, nodes, shape);
      }
      check(cudaEventRecord(done_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(done_), "the device's work");  // results visible to the other backends
    } catch (...) {
      // Work queued before the failure may still read the staging buffer: the next run starts clean.
      cudaStreamSynchronize(stream_);
      cudaGetLastError();
      pending_.clear();
      throw;
    }
    for (const Pending& p : *landing) land_rows(p);  // copies back to host memory, from the staging buffer
  }

 private:
  void run_nodes(const Graph& g, const std::vector<int>& nodes, const RunShape& shape) {
    for (int id : nodes) {
      const Node& n = g.nodes[size_t(id)];
      if (!guard_passes(g, n.guard, shape.n_tokens)) continue;
      compute_node(g, n, shape);
      check(cudaGetLastError(), op_name(n.op));
    }
  }

  // Records the segment's launches and copies into `slot` while running them once: the copies' host sides
  // (staging in, landing out) are kept as lists a replay repeats around cudaGraphLaunch. Every kernel argument
  // is a pointer or a size fixed by the segment and the run's shape (positions, lists and tables are read on
  // the device), so the recorded graph is this segment's decode step for every later position.
  void capture(const Graph& g, const std::vector<int>& nodes, const RunShape& shape, DecodeGraph& slot) {
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      slot.give_up();
      return run_nodes(g, nodes, shape);
    }
    capturing_ = true;
    cudaGraph_t graph = nullptr;
    bool recorded = true;
    try {
      run_nodes(g, nodes, shape);
    } catch (...) {
      recorded = false;  // something the capture does not allow: run it node by node below
    }
    capturing_ = false;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (recorded && ended == cudaSuccess && graph != nullptr) {
      slot.set(graph, uploads_, pending_);  // instantiates; a failure leaves the slot given up
    } else {
      if (graph) cudaGraphDestroy(graph);
      slot.give_up();
    }
    if (slot.ready()) return check(slot.launch(stream_), "cudaGraphLaunch");
    cudaGetLastError();  // captured work never ran: run it now, where a real error is thrown
    uploads_.clear();
    pending_.clear();
    staged_ = 0;
    run_nodes(g, nodes, shape);
  }

  // Pinned bytes for one copy of this run; the buffer grows (once, on the first runs) to what a run needs.
  uint8_t* stage(size_t bytes) {
    if (staged_ + bytes > staging_bytes_) {
      // Synchronizing is not allowed while capturing; a segment is captured only on a run after one that
      // sized the staging buffer for it, so this is a bug guard rather than a path.
      if (capturing_) throw std::runtime_error("the staging buffer grew while capturing a CUDA graph");
      graphs_.clear();  // they copy from and to the old buffer
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // earlier copies of this run still read it
      for (const Pending& p : pending_) land_rows(p);  // finish them from the old buffer before it goes
      pending_.clear();
      const size_t grown = std::max(staging_bytes_ * 2, staged_ + bytes + (1 << 20));
      void* p = nullptr;  // the new buffer first: a failed allocation leaves the old one valid
      check(cudaHostAlloc(&p, grown, cudaHostAllocDefault), "cudaHostAlloc");
      if (staging_) check(cudaFreeHost(staging_), "cudaFreeHost");
      staging_ = static_cast<uint8_t*>(p);
      staging_bytes_ = grown;
      staged_ = 0;
    }
    uint8_t* out = staging_ + staged_;
    staged_ += (bytes + 255) / 256 * 256;
    return out;
  }

  static void stage_rows(const Upload& u) {
    for (int64_t r = 0; r < u.rows; ++r)
      std::memcpy(u.staged + r * u.row_bytes, u.host + r * u.host_stride, u.row_bytes);
  }
  static void land_rows(const Pending& p) {
    for (int64_t r = 0; r < p.rows; ++r)
      std::memcpy(p.host + r * p.host_stride, p.staged + r * p.row_bytes, p.row_bytes);
  }

  void copy_node(const Tensor& src, const Tensor& dst, int64_t rows) {
    if (rows <= 0) return;
    const size_t rb = dst.row_bytes;
    if (src.memory == 0 && dst.memory != 0) {  // up: through pinned staging, so the copy is truly async
      const Upload u{static_cast<const uint8_t*>(src.data), stage(rb * size_t(rows)), rows, int64_t(src.row_stride),
                     rb};
      stage_rows(u);
      if (capturing_) uploads_.push_back(u);
      check(cudaMemcpy2DAsync(dst.data, dst.row_stride, u.staged, rb, rb, size_t(rows), cudaMemcpyHostToDevice, stream_),
            "copy to the device");
    } else if (src.memory != 0 && dst.memory == 0) {  // down: staged, landed after the run's sync
      uint8_t* st = stage(rb * size_t(rows));
      check(cudaMemcpy2DAsync(st, rb, src.data, src.row_stride, rb, size_t(rows), cudaMemcpyDeviceToHost, stream_),
            "copy to the host");
      pending_.push_back(Pending{static_cast<uint8_t*>(dst.data), st, rows, int64_t(dst.row_stride), rb});
    } else {
      check(cudaMemcpy2DAsync(dst.data, dst.row_stride, src.data, src.row_stride, rb, size_t(rows),
                              cudaMemcpyDefault, stream_), "copy on the device");
    }
  }

  void compute_node(const Graph& g, const Node& n, const RunShape& shape) {
    const Tensor& dst = g.tensors[size_t(n.dst)];
    auto src = [&](int slot) -> const Tensor& { return g.tensors[size_t(n.src[size_t(slot)])]; };
    auto i32 = [&](int slot) { return static_cast<const int32_t*>(src(slot).data); };
    const int64_t rows = rows_in_run(dst, shape);
    switch (n.op) {
      case OpKind::MatMul: {
        const Tensor& x = src(MatMulSrc::x);
        if (n.src[MatMulSrc::active] >= 0) {
          const Tensor& lists = src(MatMulSrc::active);
          return cuda::gather_matmul(rows_of(src(MatMulSrc::weight), src(MatMulSrc::weight).rows),
                                     rows_of(x, rows_in_run(x, shape)), rows_of(dst, rows),
                                     rows_of(lists, rows_in_run(lists, shape)), lists.row_mode == RowMode::Fixed,
                                     stream_);
        }
        const cuda::Rows w = rows_of(src(MatMulSrc::weight), src(MatMulSrc::weight).rows);
        if (gemm_->run(w, rows_of(x, rows_in_run(x, shape)), rows_of(dst, rows), stream_)) return;  // prefill
        return cuda::matmul(w, rows_of(x, rows_in_run(x, shape)), rows_of(dst, rows), stream_);
      }
      case OpKind::GetRows:
        return cuda::get_rows(rows_of(src(GetRowsSrc::table), 0), i32(GetRowsSrc::ids), rows_of(dst, rows),
                              n.p.get_rows.scale, stream_);
      case OpKind::RmsNorm:
        return cuda::rms_norm(rows_of(src(RmsNormSrc::x), rows), static_cast<const float*>(src(RmsNormSrc::weight).data),
                              rows_of(dst, rows), n.p.rms_norm.eps, n.p.rms_norm.segment, stream_);
      case OpKind::Quantize:
        return cuda::quantize_q8a(rows_of(src(QuantizeSrc::x), rows), rows_of(dst, rows), n.p.quantize.scheme, stream_);
      case OpKind::Rope:
        return cuda::rope(rows_of(src(RopeSrc::x), rows), rows_of(dst, rows), i32(RopeSrc::positions),
                          n.src[RopeSrc::factors] >= 0 ? static_cast<const float*>(src(RopeSrc::factors).data) : nullptr,
                          n.p.rope, stream_);
      case OpKind::KvStore: {
        const Tensor& x = src(KvStoreSrc::x);
        return cuda::kv_store_f16(rows_of(x, rows_in_run(x, shape)), i32(KvStoreSrc::rows), rows_of(dst, dst.rows), stream_);
      }
      case OpKind::Attention: {
        using S = AttentionSrc;
        const int t = n.src[S::table];
        cuda::AttentionRows a{rows_of(src(S::q), rows), rows_of(src(S::k_cache), 0), rows_of(src(S::v_cache), 0),
                              rows_of(dst, rows), i32(S::positions), t >= 0 ? i32(S::table) : nullptr,
                              t >= 0 ? g.tensors[size_t(t)].cols : 0,
                              n.src[S::sinks] >= 0 ? static_cast<const float*>(src(S::sinks).data) : nullptr,
                              n.src[S::q_rope] >= 0 ? rows_of(src(S::q_rope), rows) : cuda::Rows{}};
        return cuda::attention(a, n.p.attention, stream_);
      }
      case OpKind::Add:
      {
        cuda::Rows b = rows_of(src(BinarySrc::b), rows);
        if (is_bias_row(src(BinarySrc::b))) b.stride = 0;  // one bias row for every row
        return cuda::add(rows_of(src(BinarySrc::a), rows), b, rows_of(dst, rows), n.p.add.scale, n.p.add.post, stream_);
      }
      case OpKind::Softcap:
        return cuda::softcap(rows_of(src(SoftcapSrc::x), rows), rows_of(dst, rows), n.p.softcap.cap, stream_);
      case OpKind::SiluMul:
        return cuda::gated_mul(rows_of(src(GatedMulSrc::gate), rows), rows_of(src(GatedMulSrc::up), rows),
                               rows_of(dst, rows), n.p.gated_mul.act, stream_);
      case OpKind::SelectRows:
        return cuda::select_rows(rows_of(src(SelectRowsSrc::x), 0), i32(SelectRowsSrc::rows), rows_of(dst, rows), stream_);
      case OpKind::BiasRelu:
        return cuda::bias_relu(rows_of(src(BiasReluSrc::x), rows), static_cast<const float*>(src(BiasReluSrc::bias).data),
                               rows_of(dst, rows), stream_);
      case OpKind::ScatterCols:
        return cuda::scatter_cols(rows_of(src(ScatterColsSrc::x), rows), i32(ScatterColsSrc::perm), rows_of(dst, rows),
                                  stream_);
      case OpKind::Copy: {
        const Tensor& x = src(CopySrc::x);
        return copy_node(x, dst, rows_in_run(x, shape));
      }
      case OpKind::ActiveSet: {
        const int cut = n.src[ActiveSetSrc::cut];
        return cuda::active_set(rows_of(src(ActiveSetSrc::scores), rows),
                                cut >= 0 ? static_cast<const float*>(src(ActiveSetSrc::cut).data) : nullptr,
                                rows_of(dst, rows), n.p.active_set, stream_);
      }
      case OpKind::GatedAct:
        return cuda::gated_act(rows_of(src(GatedActSrc::gate), rows), rows_of(src(GatedActSrc::up), rows),
                               rows_of(src(GatedActSrc::active), rows), rows_of(dst, rows), n.p.gated_act.act,
                               n.p.gated_act.threshold, stream_);
      case OpKind::DownAxpy: {
        const int map = n.src[DownAxpySrc::row_map];
        const Tensor& down = src(DownAxpySrc::down);
        const __half* q4t = down.type == DType::Q4T ? static_cast<const __half*>(src(DownAxpySrc::scales).data) : nullptr;
        return cuda::down_axpy(rows_of(down, down.rows), rows_of(src(DownAxpySrc::act), rows),
                               rows_of(src(DownAxpySrc::active), rows), map >= 0 ? i32(DownAxpySrc::row_map) : nullptr,
                               rows_of(dst, rows), axpy_, stream_, q4t);
      }
      case OpKind::MoeRoute:
        return cuda::moe_route(rows_of(src(MoeRouteSrc::logits), rows), rows_of(dst, rows), n.p.moe_route,
                               n.src[MoeRouteSrc::bias] >= 0 ? static_cast<const float*>(src(MoeRouteSrc::bias).data)
                                                             : nullptr,
                               n.src[MoeRouteSrc::expert_scale] >= 0
                                   ? static_cast<const float*>(src(MoeRouteSrc::expert_scale).data) : nullptr, stream_);
      case OpKind::MoeMatMul: {
        using S = MoeMatMulSrc;
        const Tensor& w = src(S::weight);
        const Tensor& x = src(S::x);
        const bool cut = n.src[S::gate] >= 0, routed = n.src[S::route] >= 0, biased = n.src[S::bias] >= 0;
        cuda::MoeMatMulArgs a{rows_of(w, w.rows), rows_of(x, rows), routed ? rows_of(src(S::route), rows) : cuda::Rows{},
                              rows_of(dst, rows), x.cols != w.cols, int64_t(dtype_row_bytes(x.type, w.cols)),
                              cut ? static_cast<const float*>(src(S::gate).data) : nullptr,
                              cut ? static_cast<const float*>(src(S::cut).data) : nullptr, n.p.moe, 0,
                              biased ? rows_of(src(S::bias), src(S::bias).rows) : cuda::Rows{}};
        return cuda::moe_matmul(a, stream_);
      }
      case OpKind::MoeCombine: {
        using S = MoeCombineSrc;
        const bool shared = n.src[S::shared] >= 0;
        const cuda::Rows sh = shared ? rows_of(src(S::shared), rows) : cuda::Rows{};
        const cuda::Rows sg = shared ? rows_of(src(S::shared_gate), rows) : cuda::Rows{};
        return cuda::moe_combine(rows_of(src(S::experts), rows), rows_of(src(S::route), rows), shared ? &sh : nullptr,
                                 shared ? &sg : nullptr, rows_of(dst, rows), n.p.moe.k, stream_);
      }
      case OpKind::SsmConv: {
        using S = SsmConvSrc;
        const Tensor& st = src(S::state);
        return cuda::ssm_conv(rows_of(src(S::x), rows), rows_of(src(S::weight), src(S::weight).rows),
                              static_cast<float*>(st.data), int64_t(st.row_stride / sizeof(float)), i32(S::positions),
                              n.src[S::rows] >= 0 ? i32(S::rows) : nullptr, rows_of(dst, rows), n.p.ssm_conv.silu != 0,
                              stream_);
      }
      case OpKind::DeltaNet: {
        using S = DeltaNetSrc;
        const Tensor& st = src(S::state);
        const auto* decay = static_cast<const float*>(src(S::decay).data);
        return cuda::delta_net(rows_of(src(S::qkv), rows), rows_of(src(S::beta), rows), rows_of(src(S::alpha), rows),
                               decay, decay + src(S::decay).row_stride / sizeof(float), static_cast<float*>(st.data),
                               int64_t(st.row_stride / sizeof(float)), i32(S::positions),
                               n.src[S::rows] >= 0 ? i32(S::rows) : nullptr, rows_of(dst, rows), n.p.delta_net, stream_);
      }
      case OpKind::MoeRouteSplit: {
        const Tensor& map = src(MoeRouteSplitSrc::map);
        return cuda::moe_route_split(rows_of(src(MoeRouteSplitSrc::route), rows), static_cast<const int32_t*>(map.data),
                                     int32_t(map.cols), n.p.moe.n_expert, rows_of(dst, rows), n.p.moe.k, stream_);
      }
      default: throw std::runtime_error(std::string("the CUDA backend has no kernel for ") + op_name(n.op));
    }
  }

  // Below this many tokens a matmul reads the weight fewer times than cuBLAS's fp16 conversion writes it.
  static constexpr int kCublasMinTokens = 32;

  int device_, space_;
  std::unique_ptr<PrefillGemm> gemm_;  // dense matmuls of prefill (PYINFER_CUBLAS_MIN_TOKENS=0: never)
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  uint8_t* staging_ = nullptr;   // pinned host memory for copies in and out
  size_t staging_bytes_ = 0, staged_ = 0;
  std::vector<Pending> pending_;  // copies to host memory waiting for the run's sync
  std::vector<Upload> uploads_;   // while capturing: the copies to the device, staged again by each replay
  bool capturing_ = false;
  DecodeGraphs graphs_{std::getenv("PYINFER_CUDA_GRAPHS") == nullptr || std::string(std::getenv("PYINFER_CUDA_GRAPHS")) != "0"};
  // PYINFER_CUDA_AXPY=atomics picks PowerInfer's atomic adds for the down axpy; columns (the default) gives
  // each thread its own output columns.
  cuda::AxpyVariant axpy_ = std::getenv("PYINFER_CUDA_AXPY") && std::string(std::getenv("PYINFER_CUDA_AXPY")) == "atomics"
                                ? cuda::AxpyVariant::Atomics : cuda::AxpyVariant::Columns;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Graph& graph, int device, int memory_space) {
  return std::make_unique<CudaBackend>(graph, device, memory_space);
}

double cuda_sync_seconds(int device, size_t bytes, int reps) {
  check(cudaSetDevice(device), "cudaSetDevice");
  void *dev = nullptr, *host = nullptr;
  cudaStream_t s = nullptr;
  check(cudaMalloc(&dev, bytes), "cudaMalloc");
  check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  std::vector<double> t;
  for (int i = 0; i < std::max(reps, 1) + 5; ++i) {  // five warm-up rounds
    const auto t0 = std::chrono::steady_clock::now();
    cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s);
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) break;
    if (i >= 5) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  cudaStreamDestroy(s);
  cudaFreeHost(host);
  cudaFree(dev);
  if (t.empty()) throw std::runtime_error("CUDA error while timing a synchronization");
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace pyinfer
