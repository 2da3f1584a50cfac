// Op parameters and source slots, by name. A node's sources are six tensor ids in fixed slots, named per
// op below (kernels index them as n.src[DownAxpySrc::scales]); its scalar parameters are one struct per op,
// held in the OpParams union and read as n.p.rope.heads. The tables at the end give both by name, so the
// bindings build nodes from keyword dictionaries and error messages name what is wrong.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pyinfer {

// Source slots a node has at most (Attention uses all of them).
constexpr int kMaxSources = 7;

enum class OpKind : int32_t;

// Gated FFN activations: act(gate) * up. Mirrors pyinfer.model.config.Activation.
enum class Activation : int32_t {
  SiLU = 0,      // LLaMA, Mistral, SmolLM2
  ReLU = 1,      // ReluLLaMA, ProSparse (ReGLU)
  GeluTanh = 2,  // Gemma (GeGLU with the tanh approximation)
  ReLU2 = 3,     // squared ReLU on the gate (Primer, some ProSparse variants)
  DReLU = 4,     // ReLU on both gate and up (TurboSparse)
  SwigluOai = 5,  // gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)
  Sigmoid = 6,    // an output gate, not an FFN: sigmoid(g) * u (Qwen3.5's gated attention)
};
constexpr int32_t kActivations = 7;

// How RoPE pairs a head's elements: GGML's "normal" mode rotates adjacent pairs (the llama architecture,
// whose converter permutes Q and K to match); NEOX mode rotates element i with i + head_dim / 2 (Gemma).
enum class RopeMode : int32_t { Normal = 0, Neox = 1 };

// How ActiveSet picks neurons.
enum class ActiveSetMode : int32_t {
  Predictor = 0,  // [0, hot) + {hot + j : scores[j] > cut[j]}
  Threshold = 1,  // {j : |f(scores[j])| > threshold}, f named by `gate_fn`
};
// The f of a threshold ActiveSet: gate-first (CATS) sets cut |act(gate)| of the FFN's own activation.
// ReLU: only as the cut inside ReGLU experts (|relu(g)| > t: g > t; t = 0 is exact, a ReLU zero adds nothing).
enum class GateFn : int32_t { Identity = 0, SiLU = 1, GeluTanh = 2, ReLU = 3 };

// ---- source slots ----------------------------------------------------------------------------------
struct GetRowsSrc { enum : int { table = 0, ids = 1 }; };
struct RmsNormSrc { enum : int { x = 0, weight = 1 }; };
struct QuantizeSrc { enum : int { x = 0 }; };
// With `active` (an active list per token, or one shared list): only the listed weight rows (gather-GEMV).
struct MatMulSrc { enum : int { weight = 0, x = 1, active = 2 }; };
// `factors` (optional): F32 [1, head_dim / 2], each pair's frequency divisor (Llama 3.1's rope_freqs, Phi-3's
// long/short factors).
struct RopeSrc { enum : int { x = 0, positions = 1, factors = 2 }; };
struct KvStoreSrc { enum : int { x = 0, rows = 1 }; };
// `table` (paged KV, many sequences): I32 [T, max blocks], each token's sequence's block table.
// `sinks` (optional): F32 [1, heads], one logit per head that joins every row's softmax and adds no value
// (gpt-oss's attention sinks).
// `q_rope` (optional, MLA): F32 [T, heads * r], each head's last r query values (its rotary part, which rides
// beside q's latent part: a query head is its q segment followed by its q_rope segment, head_dim in all).
struct AttentionSrc { enum : int { q = 0, k_cache = 1, v_cache = 2, positions = 3, table = 4, sinks = 5, q_rope = 6 }; };
// Add: `b` may also be one fixed row (a bias), added to every row of `a`.
struct BinarySrc { enum : int { a = 0, b = 1 }; };
struct GatedMulSrc { enum : int { gate = 0, up = 1 }; };  // SiluMul
struct SelectRowsSrc { enum : int { x = 0, rows = 1 }; };
struct BiasReluSrc { enum : int { x = 0, bias = 1 }; };
// `cut`: F32 [1, n_ff - hot] per-neuron cut-offs (predictor mode).
struct ActiveSetSrc { enum : int { scores = 0, cut = 1 }; };
struct GatedActSrc { enum : int { gate = 0, up = 1, active = 2 }; };
// `down`: neuron-major [n_ff, d]; `scales`: F16 [n_ff / 32, 2d] group scales (Q4T only); `row_map`: I32 [1, n_ff]
// list id -> down row; `union`: the batch's ActiveUnion result (sizes column tiles by the rows the batch reads).
struct DownAxpySrc { enum : int { down = 0, act = 1, active = 2, scales = 3, row_map = 4, union_list = 5 }; };
struct ScatterColsSrc { enum : int { x = 0, perm = 1 }; };
struct ActiveUnionSrc { enum : int { lists = 0 }; };
// `union_list` (optional): an ActiveUnion result, the rows this run needs (count -1: all).
struct NeuronFetchSrc { enum : int { union_list = 0 }; };
struct CopySrc { enum : int { x = 0 }; };
// Mixture of Experts. `logits`: F32 [T, n_expert] (the router's matmul). `weight`: the merged experts
// [n_expert * rows_e, cols] (GGUF's *_exps), `x`: [T, cols] read by every slot (gate, up) or [T, k * cols]
// with one segment per slot (down), `route`: a MoeRoute result. `shared` / `shared_gate` (optional, together):
// a shared expert's output F32 [T, d] and its gate logit F32 [T, 1] (Qwen2-MoE).
// `bias` (optional): F32 [1, n_expert] added to the experts' probabilities for choosing them only (GLM-4.5's and
// DeepSeek-V3's exp_probs_b); the weights stay the unbiased probabilities.
// `expert_scale` F32 [1, n_expert] (optional): each chosen expert's weight times its value, last (Gemma 4's per-expert
// output scale, which llama.cpp multiplies into the expert's down output).
struct MoeRouteSrc { enum : int { logits = 0, bias = 1, expert_scale = 2 }; };
// MoeMatMul's `gate` and `cut` (optional, together): CATS inside the experts. `gate`: F32 [T, k * rows_e], the same
// route's gate MoeMatMul before its activation; `cut`: F32 [n_expert, 3], each expert's GateCut bounds (hi, lo, mid;
// _core.gate_cut_bounds). A one-token run then computes only the rows whose |act(gate)| passes their expert's cut
// and leaves the others 0, so up is read only for the neurons that fire; runs of more tokens compute every row.
// `bias` (optional): F32 [n_expert, rows_e], added to each slot's rows by its expert (gpt-oss's expert biases).
// Without `route` every token runs every expert, slot s on expert s (k == n_expert): a batched matmul per head, as
// MLA's absorbed key and value projections (DeepSeek-V2), with x holding one segment per head.
struct MoeMatMulSrc { enum : int { weight = 0, x = 1, route = 2, gate = 3, cut = 4, bias = 5 }; };
struct MoeCombineSrc { enum : int { experts = 0, route = 1, shared = 2, shared_gate = 3 }; };
struct ExpertFetchSrc { enum : int { route = 0 }; };
// `map`: I32 [1, n_expert of the route] -> this side's local expert id, or -1 (another side's).
struct MoeRouteSplitSrc { enum : int { route = 0, map = 1 }; };
// Linear-attention layers with a recurrent state (Qwen3.5's gated DeltaNet). `state`: F32 fixed rows, one per
// sequence, read and rewritten in place by the node (the op's persistent memory, like a KV cache); a token at
// position 0 starts its sequence's row from zeros. `rows` (optional): I32 [T], each token's state row (absent:
// row 0, one sequence). Tokens of one sequence run in batch order, so a prompt is one recurrence.
// SsmConv: `x` F32 [T, C] through a causal depthwise conv1d, `weight` F32 [C, K] (each channel's K taps, the
// oldest first); the state row holds each channel's last K - 1 inputs ([C, K - 1]).
struct SsmConvSrc { enum : int { x = 0, weight = 1, state = 2, positions = 3, rows = 4 }; };
// DeltaNet: `qkv` F32 [T, 2 k_heads S + v_heads S] (q heads, k heads, v heads: the conv's output), `beta` and
// `alpha` F32 [T, v_heads] (the per-head projections), `decay` F32 [2, v_heads] (row 0: dt bias, row 1: A, negative).
// The state row holds v_heads S x S matrices, each stored by column (llama.cpp's layout).
// Softcap: x F32 [T, n] (dst may be x).
struct SoftcapSrc { enum : int { x = 0 }; };
struct DeltaNetSrc { enum : int { qkv = 0, beta = 1, alpha = 2, decay = 3, state = 4, positions = 5, rows = 6 }; };

// ---- scalar parameters -----------------------------------------------------------------------------
struct GetRowsParams { float scale; };            // rows times scale (0: unscaled)
struct RmsNormParams { float eps; int32_t segment; };  // segment > 0: each run of that many columns alone
// theta = pos * base^(-2i / n_rot) * freq_scale / factors[i]; cos and sin times attn_factor (both 0: 1).
// freq_scale is linear RoPE scaling (1 / rope.scaling.factor), attn_factor LongRoPE's magnitude correction.
// n_rot (0: head_dim): only each head's first n_rot values rotate (partial RoPE: GLM-4.5), the rest pass through.
// YaRN (ext_factor != 0, gpt-oss): pair i turns by a mix of the scaled and the unscaled angle, the unscaled share
// ext_factor * (1 - clamp((i - yarn_low) / (yarn_high - yarn_low), 0, 1)), and cos and sin are also times
// 1 + 0.1 ln(1 / freq_scale) (ggml's rope_yarn).
struct RopeParams {
  int32_t heads, head_dim; RopeMode mode; float base, freq_scale, attn_factor; int32_t n_rot;
  float ext_factor, yarn_low, yarn_high;
};
struct AttentionParams {
  int32_t heads, kv_heads, head_dim;
  int32_t block_size;  // paged KV: tokens per block
  int32_t window;      // sliding window (0: every earlier position)
  float scale;         // multiplies q.k
  int32_t v_dim;       // a value head's size (0: head_dim); MLA reads a prefix of each key row as the value
};
struct GatedMulParams { Activation act; };
// dst = (a + scale * b) * post (each 0: 1): Granite's residual multiplier; Gemma 4's layer output scale, applied to
// the layer's last residual sum as llama.cpp's mul after its add.
struct AddParams { float scale, post; };
struct SoftcapParams { float cap; };  // dst = cap * tanh(x * (1 / cap)): Gemma's final logit soft-capping
// Threshold mode with top_k > 0: each token keeps its top_k largest |scores| (a fixed density; the threshold is
// not read).
struct ActiveSetParams { int32_t n_ff, hot; ActiveSetMode mode; GateFn gate_fn; float threshold; int32_t top_k; };
struct GatedActParams { Activation act; float threshold; };  // 0 where |act(gate) * up| <= threshold
// Count -1 ("run dense") when the run has more than max_tokens tokens, when the mean list density exceeds
// max_density or the union's density max_union (one token: its list's density max_single).
struct ActiveUnionParams { int32_t n_ff, max_tokens; float max_density, max_union, max_single; };
// Rows: the layer's paged rows become readable (all, or the union's); Release: its readers are done;
// DenseDown: a dense run's original down matrix is read whole (offload/neuron_store.h).
enum class NeuronFetchMode : int32_t { Rows = 0, Release = 1, DenseDown = 2 };
struct NeuronFetchParams { int32_t layer; NeuronFetchMode mode; };
// How router logits become expert probabilities (llama.cpp's expert_gating_func).
// SoftmaxWeight (gpt-oss): the top k logits, then the softmax over those k only.
enum class MoeGating : int32_t { Softmax = 0, Sigmoid = 1, SoftmaxWeight = 2 };
// `norm`: the k weights are divided by their sum (Mixtral, Qwen3-MoE); `scale` multiplies them (0: 1).
// n_group > 1 (DeepSeek-V3's grouped routing): the experts form n_group equal groups, each scored by the sum of
// its two best selection values (probability plus bias); only the group_used best groups' experts can be chosen.
constexpr int32_t kMoeMaxGroups = 64;
struct MoeRouteParams { int32_t n_expert, k; MoeGating gating; int32_t norm; float scale; int32_t n_group, group_used; };
// MoeMatMul, MoeCombine and MoeRouteSplit (n_expert unused by the combine; gate_fn: the activation of MoeMatMul's
// `gate`, SiLU or GeluTanh).
struct MoeParams { int32_t n_expert, k; GateFn gate_fn; };
// Quantize: the scheme of the weights that read the copy (graph/dtype.h ActScheme; the graph builder sets it).
struct QuantizeParams { int32_t scheme; };
struct ExpertFetchParams { int32_t layer, prefetch; };  // prefetch 1: start reading, do not wait
struct SsmConvParams { int32_t silu; };  // 1: SiLU of the conv's output
// v head h reads q / k head h % k_heads (ggml's repeat: Qwen 3.5, whose converter orders the value heads so), or with
// `grouped` h / (v_heads / k_heads) (repeat-interleave: Qwen3-Next); q and k are L2-normalised per head with `eps` as
// llama.cpp's build_gdn_l2_norm does (rms_norm with eps / S, times 1 / sqrt(S)).
struct DeltaNetParams { int32_t k_heads, v_heads, head_dim; float eps; int32_t grouped; };

union OpParams {
  GetRowsParams get_rows;
  RmsNormParams rms_norm;
  RopeParams rope;
  AttentionParams attention;
  GatedMulParams gated_mul;
  AddParams add;
  ActiveSetParams active_set;
  GatedActParams gated_act;
  ActiveUnionParams active_union;
  NeuronFetchParams neuron_fetch;
  MoeRouteParams moe_route;
  MoeParams moe;
  ExpertFetchParams expert_fetch;
  QuantizeParams quantize;
  SsmConvParams ssm_conv;
  DeltaNetParams delta_net;
  SoftcapParams softcap;
  OpParams() { std::memset(static_cast<void*>(this), 0, sizeof(*this)); }  // every field of every op: 0
};

// ---- by name ---------------------------------------------------------------------------------------
struct ParamField {
  const char* name;
  bool is_float;  // else int32 (enums included)
  size_t offset;  // in OpParams
};
struct OpSignature {
  OpKind op;
  const char* name;     // "mat_mul": errors, op timings
  const char* py_name;  // "MAT_MUL": the member of Python's _core.Op
  const char* sources[kMaxSources];  // slot names (nullptr: unused slot)
  const ParamField* params;
  int n_params;
};
const OpSignature& op_signature(OpKind op);
// The slot of a named source, or -1.
int op_source_slot(OpKind op, const char* name);
const ParamField* op_param(OpKind op, const char* name);

}  // namespace pyinfer
