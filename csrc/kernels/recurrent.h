// Recurrent layers' kernels (Qwen3.5's gated DeltaNet): a causal conv1d whose state rolls on, and the gated delta
// rule. Each keeps one state row per sequence; tokens are taken in batch order (a sequence's tokens are in order,
// so a prompt is one recurrence), and the channels or heads are split between threads, which never share a row.
// Scalar reference code: llama.cpp's ggml CPU ops (ssm_conv, gated_delta_net, rms_norm) in the same order of
// operations, so F32 models agree to rounding.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pyinfer {

// Which state row each token uses (rows null: row 0) and where sequences start (position 0: the row is zeroed).
// row() throws GraphError for a row outside the state.
struct RecurrentRows {
  const int32_t* positions = nullptr;
  const int32_t* rows = nullptr;
  int64_t n_rows = 1;
  int64_t row(int64_t t) const;
  bool starts(int64_t t) const { return positions[t] == 0; }
  // The end of the run of one sequence's tokens that starts at t: the same row, positions one apart, no restart.
  int64_t run_end(int64_t t, int64_t n_tokens) const;
};

struct SsmConvArgs {
  const float* x; int64_t x_stride;        // [T, C] (strides in floats)
  const float* weight; int64_t w_stride;   // [C, K]: each channel's taps, oldest input first
  int64_t taps;                           // K
  float* state; int64_t state_stride;     // [rows, C * (K - 1)]: channel c's last K - 1 inputs at c * (K - 1)
  float* y; int64_t y_stride;             // [T, C]
  int64_t n_tokens;
  bool silu;
};
// Channels [c0, c1) of every token.
void ssm_conv(const SsmConvArgs& a, const RecurrentRows& rows, int64_t c0, int64_t c1);

struct DeltaNetArgs {
  const float* qkv; int64_t qkv_stride;    // [T, (2 Hk + Hv) S]: q heads, k heads, v heads
  const float* beta; int64_t beta_stride;  // [T, Hv] logits (sigmoid here)
  const float* alpha; int64_t alpha_stride;  // [T, Hv]
  const float* dt_bias; const float* a;   // [Hv] each: decay g = softplus(alpha + dt_bias) * a
  float* state; int64_t state_stride;     // [rows, Hv S S]: head h's S x S matrix by columns at h S S
  float* out; int64_t out_stride;         // [T, Hv S]
  int64_t n_tokens;
  int k_heads, v_heads, head_dim;
  float eps;
  bool grouped;  // v head h reads k head h / (v_heads / k_heads); else h % k_heads
};
// Floats of scratch one thread needs.
// Floats of scratch one thread needs: a chunk's work space (delta_rule_chunk.h), or l2-normed q and k per token.
int64_t delta_net_scratch_floats(int head_dim);
// A run of one sequence's tokens at least this long goes through the chunked form (a prompt); shorter ones (decode,
// a batch of sequences one token each) token by token.
constexpr int64_t kDeltaChunkMinRun = 64;
// v heads [h0, h1) of every token; `scratch`: delta_net_scratch_floats of the calling thread's own.
void delta_net(const DeltaNetArgs& a, const RecurrentRows& rows, int h0, int h1, float* scratch);

}  // namespace pyinfer
