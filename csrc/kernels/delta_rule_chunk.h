// The gated delta rule over a run of one sequence's tokens, a chunk at a time (the WY form of llama.cpp's
// build_delta_net_chunking): within a chunk of up to kDeltaChunk tokens, the deltas u_t solve a lower-triangular
// system, and the state, the deltas and the outputs become small matrix products instead of one pass over the state
// per token. Same arithmetic up to rounding as the token-by-token rule (delta_rule_token in recurrent.cpp); used for
// prompts, where a run is long. Decays enter only as exp(G_t - G_s) with s <= t (G: cumulative log decay), never
// above 1, so a long chunk cannot overflow.
#pragma once
#include <cstdint>

namespace pyinfer {

constexpr int kDeltaChunk = 64;

// Floats of scratch one head's chunk needs (per thread).
inline int64_t delta_chunk_scratch_floats(int head_dim) {
  const int64_t C = kDeltaChunk, S = head_dim;
  return 5 * C * S + S * S + 2 * C * C + 3 * C;
}

// One chunk's inputs for one head: rows of n tokens, already l2-normed q (qs) and k (ks), v rows by pointer.
struct DeltaChunk {
  int n;                  // tokens, 1..kDeltaChunk
  const float* const* v;  // [n] pointers to S floats
  const float* beta;      // [n] sigmoid(beta logit)
  const float* log_decay; // [n] g_t (<= 0)
  float* const* out;      // [n] pointers to S floats, written
};

// Rounds the head's state M (S x S, M[j * S + i] = S[i][j]) through one chunk. `qs`, `ks`: [n][S] in the scratch's
// first 2 C S floats (delta_chunk_q / delta_chunk_k); the rest of the scratch is the chunk's work space.
void delta_rule_chunk(float* M, int S, const DeltaChunk& c, float out_scale, float* scratch);
inline float* delta_chunk_q(float* scratch, int /*S*/) { return scratch; }
inline float* delta_chunk_k(float* scratch, int S) { return scratch + int64_t(kDeltaChunk) * S; }

// Whether the chunked form runs heads of this size (its blocks are 32 floats wide).
inline bool delta_chunk_fits(int head_dim) { return head_dim % 32 == 0; }

}  // namespace pyinfer
