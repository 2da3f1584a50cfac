// Causal attention over a KV cache, tiled as flash attention is: a block of queries meets the cache one
// key tile at a time with an online softmax, so no [T, T] score matrix exists and every K/V tile read
// from the cache serves all query heads of its group (GQA) and all tokens of the block.
//
// Work items are (query block, kv head) pairs. When a run has too few of them to keep every thread busy
// (decode: one token), each pair's key range is split into chunks (split-K); each chunk keeps its own
// softmax state and the last chunk to finish merges them, so no barrier is needed inside the op.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "graph/dtype.h"
#include "kernels/kernels.h"

namespace pyinfer {

constexpr int kAttnKeyTile = 64;     // keys per tile
constexpr int kAttnBlockRows = 128;  // query rows (tokens x heads of one group) per work item, at most
constexpr int kAttnSplitRows = 16;   // split-K only for items of at most this many query rows (decode)
constexpr int kAttnItemsPerThread = 4;  // split-K aims at this many items per thread
constexpr int kAttnRowPad = 16;      // per-row arrays (m, l, ranges, qt's columns) hold whole 16-lane vectors
constexpr int kAttnGemmRows = 16;    // blocks of at least this many query rows take the matrix-product tile
constexpr int kAttnKeyPad = 16;      // a tile's keys are zero-padded to whole 16-lane vectors

struct AttentionArgs {
  const float* q = nullptr;          // F32 [T, heads * head_dim], RoPE applied
  int64_t q_stride = 0;              // floats between token rows of q
  const uint8_t* k = nullptr;        // cache rows [n_ctx, kv_heads * head_dim], F16 or Q8_0
  const uint8_t* v = nullptr;
  DType k_type = DType::F16, v_type = DType::F16;
  size_t k_row_bytes = 0, v_row_bytes = 0;
  const int32_t* positions = nullptr;  // I32 [T]: each token sees keys 0..position (its own included)
  int64_t n_tokens = 0;
  // Paged cache: token t's sequence has its j-th key in cache row table[t][j / block] * block + j % block.
  const int32_t* table = nullptr;    // I32 [T, table_cols], or null: key j is cache row j
  int64_t table_cols = 0;
  int block_size = 1;
  int heads = 1, kv_heads = 1, head_dim = 0;
  int v_dim = 0;                     // a value head's size, at most head_dim: each V row's first v_dim values
  // MLA: each query head is head_dim - rope_dim values of q, then rope_dim of q_rope ([T, heads * rope_dim]).
  const float* q_rope = nullptr;
  int64_t q_rope_stride = 0;
  int rope_dim = 0;
  int window = 0;                    // sliding window: keys with position > p - window (0: every key)
  float scale = 1.f;                 // applied to q.k
  const float* sinks = nullptr;      // [heads]: a logit per head in every row's softmax, with no value (or null)
  float* out = nullptr;              // F32 [T, heads * v_dim]
  int64_t out_stride = 0;
};

// Memory the op uses, sized once by attention_thread_floats / attention_split_floats (compute allocates
// nothing).
struct AttentionWorkspace {
  float* thread = nullptr;           // this thread's slice: attention_thread_floats() floats
  float* partial = nullptr;          // split-K partial states, shared by every thread
  std::atomic<int32_t>* counters = nullptr;  // per split pair: chunks finished; zero between runs
  int64_t max_split_items = 0;       // pairs * chunks never exceeds this (the partial/counter capacity)
};

int64_t attention_thread_floats(int heads, int kv_heads, int head_dim);
// Floats of `partial` for `items` split items of a graph whose widest head is head_dim.
int64_t attention_split_floats(int64_t items, int head_dim);

// This thread's share (ith of nth) of one attention node. Every thread must call it with the same args.
void attention(const KernelTable& k, const AttentionArgs& a, const AttentionWorkspace& ws, int ith, int nth);

// Rows rounded up to whole vectors of kAttnRowPad lanes.
inline int64_t attn_padded_rows(int64_t rows) { return (rows + kAttnRowPad - 1) / kAttnRowPad * kAttnRowPad; }

// Online-softmax update of `rows` query rows by one key tile (the per-ISA inner loop).
struct AttnTileArgs {
  const float* q;       // [rows, head_dim], scale applied
  const float* qt;      // [head_dim, padded rows]: q transposed, columns past `rows` zero (the matrix-product tile)
  int64_t rows;         // query rows; the per-row arrays hold attn_padded_rows(rows)
  int head_dim;
  const float* k;       // [n_keys rounded up to kAttnKeyPad, head_dim], rows past n_keys zero
  const float* v;       // [n_keys rounded up to kAttnKeyPad, v_dim]
  int n_keys;
  const int32_t* lo;    // [padded rows]: row r sees tile keys [lo[r], hi[r]); padding rows see none
  const int32_t* hi;
  float* m;             // [padded rows] running max of scores
  float* l;             // [padded rows] running sum of exp(score - m)
  float* acc;           // [rows, v_dim] running sum of exp(score - m) * v
  float* scores;        // scratch: attn_scores_floats(rows) floats
  float* kt = nullptr;  // scratch [head_dim, kAttnKeyTile]: the keys transposed (decode's tile); null: not used
  int v_dim = 0;        // values per key (at most head_dim; MLA's values are a prefix of its keys)
};
inline int attn_v_dim(const AttnTileArgs& a) { return a.v_dim ? a.v_dim : a.head_dim; }
// Scratch floats of AttnTileArgs::scores for a block of `rows` query rows.
inline int64_t attn_scores_floats(int64_t rows) {
  return int64_t(kAttnKeyTile) * attn_padded_rows(rows) + attn_padded_rows(rows);
}
void attn_tile_generic(const AttnTileArgs& a);
void attn_tile_avx2(const AttnTileArgs& a);
void attn_tile_avx512(const AttnTileArgs& a);
void attn_tile_neon(const AttnTileArgs& a);

// A cache row's slice (n elements of F16 or Q8_0) as floats.
void kv_to_f32_generic(DType type, const uint8_t* src, size_t stride, float* dst, int64_t rows, int64_t n);
void kv_to_f32_avx2(DType type, const uint8_t* src, size_t stride, float* dst, int64_t rows, int64_t n);
void kv_to_f32_neon(DType type, const uint8_t* src, size_t stride, float* dst, int64_t rows, int64_t n);
// A row of a Q8_0 cache, as llama.cpp quantizes it (d = amax / 127 stored as fp16, q = round(x / d)).
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);

}  // namespace pyinfer
