#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fp16.h"

namespace pyinfer {
namespace {

// Bytes from a cache row's start to kv head g's slice.
size_t head_offset(DType type, int g, int head_dim) {
  return type == DType::Q8_0 ? size_t(g) * size_t(head_dim / kQuantBlock) * sizeof(BlockQ8_0)
                             : size_t(g) * size_t(head_dim) * (type == DType::F32 ? 4 : 2);
}

// Per-thread scratch, carved from the workspace slice in this order. Per-row arrays hold the padded rows.
struct ThreadScratch {
  float* q;       // [max rows, hd]
  float* qt;      // [hd, padded max rows]
  float* k;       // [kAttnKeyTile, hd]
  float* v;       // [kAttnKeyTile, hd]
  float* kt;      // [hd, kAttnKeyTile]: the keys transposed (decode's tile)
  float* acc;     // [max rows, hd]
  float* m;       // [padded max rows]
  float* l;       // [padded max rows]
  float* scores;  // [attn_scores_floats(max rows)]
  int32_t* lo;    // [padded max rows]: absolute key ranges
  int32_t* hi;
  int32_t* tile_lo;  // [padded max rows]: ranges within the current tile
  int32_t* tile_hi;
};

int64_t max_rows(int heads, int kv_heads) {
  const int group = heads / kv_heads;
  return std::max<int64_t>(kAttnBlockRows / group, 1) * group;
}

int64_t scratch_floats(int64_t rows, int hd) {
  const int64_t padded = attn_padded_rows(rows);
  return 2 * rows * hd + padded * hd + 3 * int64_t(kAttnKeyTile) * hd + 6 * padded +
         std::max<int64_t>(2 * kAttnKeyTile, attn_scores_floats(rows));
}

ThreadScratch carve(float* p, int64_t rows, int hd) {
  const int64_t padded = attn_padded_rows(rows);
  ThreadScratch s;
  s.q = p; p += rows * hd;
  s.qt = p; p += padded * hd;
  s.k = p; p += int64_t(kAttnKeyTile) * hd;
  s.v = p; p += int64_t(kAttnKeyTile) * hd;
  s.kt = p; p += int64_t(kAttnKeyTile) * hd;
  s.acc = p; p += rows * hd;
  s.m = p; p += padded;
  s.l = p; p += padded;
  s.scores = p; p += std::max<int64_t>(2 * kAttnKeyTile, attn_scores_floats(rows));
  s.lo = reinterpret_cast<int32_t*>(p); p += padded;
  s.hi = reinterpret_cast<int32_t*>(p); p += padded;
  s.tile_lo = reinterpret_cast<int32_t*>(p); p += padded;
  s.tile_hi = reinterpret_cast<int32_t*>(p);
  return s;
}

class Runner {
 public:
  Runner(const KernelTable& k, const AttentionArgs& a, const AttentionWorkspace& ws)
      : k_(k), a_(a), ws_(ws), s_(carve(ws.thread, max_rows(a.heads, a.kv_heads), a.head_dim)) {}

  // End of the query block that starts at token t0: consecutive positions of one sequence.
  int64_t block_end(int64_t t0, int64_t block_tokens) const {
    int64_t t = t0 + 1;
    for (; t < a_.n_tokens && t - t0 < block_tokens; ++t) {
      if (a_.positions[t] != a_.positions[t - 1] + 1) break;
      if (a_.table) {
        const int64_t used = int64_t(a_.positions[t]) / a_.block_size + 1;
        if (std::memcmp(a_.table + t * a_.table_cols, a_.table + t0 * a_.table_cols, size_t(used) * 4)) break;
      }
    }
    return t;
  }

  void run_item(int64_t t0, int64_t t1, int g, int64_t chunk, int64_t splits, int64_t slot) {
    const int hd = a_.head_dim, vd = a_.v_dim ? a_.v_dim : hd, group = a_.heads / a_.kv_heads;
    const int qd = hd - a_.rope_dim;  // query values from q (the rest, MLA's rotary part, from q_rope)
    const int64_t rows = (t1 - t0) * group, padded = attn_padded_rows(rows);
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t p = a_.positions[t];
      const int32_t lo = a_.window > 0 ? std::max(0, p - a_.window + 1) : 0;
      for (int hh = 0; hh < group; ++hh) {
        const int64_t r = (t - t0) * group + hh;
        const int64_t head = g * group + hh;
        const float* src = a_.q + t * a_.q_stride + head * qd;
        for (int d = 0; d < qd; ++d) s_.q[r * hd + d] = s_.qt[d * padded + r] = src[d] * a_.scale;
        const float* rot = a_.q_rope ? a_.q_rope + t * a_.q_rope_stride + head * a_.rope_dim : nullptr;
        for (int d = qd; d < hd; ++d) s_.q[r * hd + d] = s_.qt[d * padded + r] = rot[d - qd] * a_.scale;
        s_.lo[r] = lo;
        s_.hi[r] = p + 1;
      }
    }
    for (int64_t r = rows; r < padded; ++r) {  // padding rows: no keys, zero queries
      s_.tile_lo[r] = s_.tile_hi[r] = 0;
      for (int d = 0; d < hd; ++d) s_.qt[d * padded + r] = 0.f;
    }
    std::fill(s_.m, s_.m + padded, -INFINITY);
    std::fill(s_.l, s_.l + padded, 0.f);
    std::fill(s_.acc, s_.acc + rows * vd, 0.f);

    // Keys this item covers: the block's whole range, or its chunk of it. Tiles start at multiples of
    // kAttnKeyTile wherever the block starts, so a token's tiles (and so its rounding) are the same in a batch
    // of any size: a tile holding none of a row's keys leaves the row as it was.
    const int64_t first = s_.lo[0];
    int64_t kb = first / kAttnKeyTile * kAttnKeyTile, ke = s_.hi[rows - 1];
    if (splits > 1) {
      const int64_t per = ((ke - kb + splits - 1) / splits + kAttnKeyTile - 1) / kAttnKeyTile * kAttnKeyTile;
      kb = std::min(ke, kb + chunk * per);
      ke = std::min(ke, kb + per);
    }
    const int32_t* table = a_.table ? a_.table + t0 * a_.table_cols : nullptr;
    const size_t k_off = head_offset(a_.k_type, g, hd), v_off = head_offset(a_.v_type, g, vd);
    for (int64_t j0 = kb; j0 < ke; j0 += kAttnKeyTile) {
      const int n = int(std::min<int64_t>(kAttnKeyTile, ke - j0));
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) {
        s_.tile_lo[r] = int32_t(std::clamp<int64_t>(s_.lo[r] - j0, 0, n));
        s_.tile_hi[r] = int32_t(std::clamp<int64_t>(s_.hi[r] - j0, 0, n));
        any |= s_.tile_lo[r] < s_.tile_hi[r];
      }
      if (!any) continue;
      const int below = int(std::clamp<int64_t>(first - j0, 0, n));  // keys before every row's window
      std::fill(s_.k, s_.k + int64_t(below) * hd, 0.f);
      std::fill(s_.v, s_.v + int64_t(below) * vd, 0.f);
      for (int j = below, run; j < n; j += run) {  // runs of consecutive cache rows: the tile, or a page's part
        const int64_t key = j0 + j;
        int64_t row = key;
        run = n - j;
        if (table) {
          row = int64_t(table[key / a_.block_size]) * a_.block_size + key % a_.block_size;
          run = int(std::min<int64_t>(run, a_.block_size - key % a_.block_size));
        }
        k_.kv_to_f32(a_.k_type, a_.k + size_t(row) * a_.k_row_bytes + k_off, a_.k_row_bytes, s_.k + int64_t(j) * hd,
                     run, hd);
        k_.kv_to_f32(a_.v_type, a_.v + size_t(row) * a_.v_row_bytes + v_off, a_.v_row_bytes, s_.v + int64_t(j) * vd,
                     run, vd);
      }
      const int padded = (n + kAttnKeyPad - 1) / kAttnKeyPad * kAttnKeyPad;  // the kernels read whole vectors of keys
      std::fill(s_.k + int64_t(n) * hd, s_.k + int64_t(padded) * hd, 0.f);
      std::fill(s_.v + int64_t(n) * vd, s_.v + int64_t(padded) * vd, 0.f);
      k_.attn_tile(AttnTileArgs{s_.q, s_.qt, rows, hd, s_.k, s_.v, n, s_.tile_lo, s_.tile_hi, s_.m, s_.l, s_.acc, s_.scores,
                                s_.kt, vd});
    }

    if (splits == 1) return finish(t0, g, rows, vd);
    // Split-K: publish this chunk's state; the chunk that completes the pair merges all of them.
    float* part = ws_.partial + slot * attention_split_floats(1, hd);
    for (int64_t r = 0; r < rows; ++r) {
      float* st = part + r * (hd + 2);
      st[0] = s_.m[r];
      st[1] = s_.l[r];
      std::memcpy(st + 2, s_.acc + r * vd, size_t(vd) * 4);
    }
    const int64_t pair_slot = slot - chunk;
    std::atomic<int32_t>& done = ws_.counters[pair_slot / splits];
    if (done.fetch_add(1, std::memory_order_acq_rel) != splits - 1) return;
    done.store(0, std::memory_order_relaxed);  // ready for the next run (which starts after a barrier)
    merge(t0, g, rows, ws_.partial + pair_slot * attention_split_floats(1, hd), splits, hd, vd);
  }

 private:
  // The softmax's denominator with the head's sink (gpt-oss) taken in, as llama.cpp's flash attention takes it:
  // a sink above the running max rescales the keys' part instead of overflowing. Returns the factor of the
  // accumulated values.
  float with_sink(int head, float m, float& sum) const {
    if (!a_.sinks) return 1.f;
    const float s = a_.sinks[head];
    if (s > m) {
      const float ms = std::exp(m - s);
      sum = sum * ms + 1.f;
      return ms;
    }
    sum += std::exp(s - m);
    return 1.f;
  }

  void finish(int64_t t0, int g, int64_t rows, int vd) {
    const int group = a_.heads / a_.kv_heads;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r / group;
      const int head = g * group + int(r % group);
      float* dst = a_.out + t * a_.out_stride + int64_t(head) * vd;
      float sum = s_.l[r];
      const float ms = with_sink(head, s_.m[r], sum);
      const float inv = ms / sum;
      for (int d = 0; d < vd; ++d) dst[d] = s_.acc[r * vd + d] * inv;
    }
  }

  // A chunk's row states are hd + 2 floats apart (the capacity), of which the first vd + 2 are used.
  void merge(int64_t t0, int g, int64_t rows, const float* parts, int64_t splits, int hd, int vd) {
    const int group = a_.heads / a_.kv_heads;
    const int64_t chunk_floats = attention_split_floats(1, hd);
    for (int64_t r = 0; r < rows; ++r) {
      float mx = -INFINITY;
      for (int64_t c = 0; c < splits; ++c) mx = std::fmax(mx, parts[c * chunk_floats + r * (hd + 2)]);
      const int64_t t = t0 + r / group;
      const int head = g * group + int(r % group);
      float* dst = a_.out + t * a_.out_stride + int64_t(head) * vd;
      std::fill(dst, dst + vd, 0.f);
      float sum = 0.f;
      for (int64_t c = 0; c < splits; ++c) {
        const float* st = parts + c * chunk_floats + r * (hd + 2);
        if (st[1] == 0.f) continue;  // a chunk with no key of this row
        const float w = std::exp(st[0] - mx);
        sum += st[1] * w;
        for (int d = 0; d < vd; ++d) dst[d] += st[2 + d] * w;
      }
      const float inv = with_sink(head, mx, sum) / sum;
      for (int d = 0; d < vd; ++d) dst[d] *= inv;
    }
  }

  const KernelTable& k_;
  const AttentionArgs& a_;
  const AttentionWorkspace& ws_;
  ThreadScratch s_;
};

}  // namespace

int64_t attention_thread_floats(int heads, int kv_heads, int head_dim) {
  return scratch_floats(max_rows(heads, kv_heads), head_dim);
}

int64_t attention_split_floats(int64_t items, int head_dim) { return items * kAttnSplitRows * (head_dim + 2); }

void attention(const KernelTable& k, const AttentionArgs& a, const AttentionWorkspace& ws, int ith, int nth) {
  Runner run(k, a, ws);
  const int group = a.heads / a.kv_heads;
  const int64_t block_tokens = std::max(kAttnBlockRows / group, 1);
  // Every thread walks the same blocks and takes the same decisions (inputs only), so items agree.
  int64_t n_blocks = 0, widest = 0, span = 0;
  for (int64_t t0 = 0, t1; t0 < a.n_tokens; t0 = t1, ++n_blocks) {
    t1 = run.block_end(t0, block_tokens);
    widest = std::max(widest, t1 - t0);
    const int32_t p0 = a.positions[t0];
    span = std::max<int64_t>(span, a.positions[t1 - 1] + 1 - (a.window > 0 ? std::max(0, p0 - a.window + 1) : 0));
  }
  const int64_t pairs = n_blocks * a.kv_heads;
  int64_t splits = 1;
  if (nth > 1 && pairs < 2 * nth && widest * group <= kAttnSplitRows && ws.partial) {
    splits = (int64_t(kAttnItemsPerThread) * nth + pairs - 1) / pairs;
    splits = std::min({splits, ws.max_split_items / pairs, span / (2 * kAttnKeyTile)});
    splits = std::max<int64_t>(splits, 1);
  }
  const int64_t items = pairs * splits;
  int64_t b = 0;
  for (int64_t t0 = 0, t1; t0 < a.n_tokens; t0 = t1, ++b) {
    t1 = run.block_end(t0, block_tokens);
    for (int g = 0; g < a.kv_heads; ++g)
      for (int64_t c = 0; c < splits; ++c) {
        const int64_t slot = (b * a.kv_heads + g) * splits + c;
        if ((items - 1 - slot) % nth != ith) continue;  // latest blocks (the most keys) first
        run.run_item(t0, t1, g, c, splits, slot);
      }
  }
}

void attn_tile_generic(const AttnTileArgs& a) {
  const int hd = a.head_dim, vd = a.v_dim ? a.v_dim : hd;
  float* s = a.scores;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int lo = a.lo[r], hi = a.hi[r];
    if (lo >= hi) continue;
    const float* q = a.q + r * hd;
    float mx = -INFINITY;
    for (int j = lo; j < hi; ++j) {
      const float* key = a.k + int64_t(j) * hd;
      float dot = 0.f;
      for (int d = 0; d < hd; ++d) dot += q[d] * key[d];
      s[j] = dot;
      mx = std::fmax(mx, dot);
    }
    const float m_new = std::fmax(a.m[r], mx);
    const float alpha = std::exp(a.m[r] - m_new);
    float sum = 0.f;
    for (int j = lo; j < hi; ++j) {
      s[j] = std::exp(s[j] - m_new);
      sum += s[j];
    }
    a.l[r] = a.l[r] * alpha + sum;
    a.m[r] = m_new;
    float* acc = a.acc + r * vd;
    for (int d = 0; d < vd; ++d) acc[d] *= alpha;
    for (int j = lo; j < hi; ++j) {
      const float* val = a.v + int64_t(j) * vd;
      for (int d = 0; d < vd; ++d) acc[d] += s[j] * val[d];
    }
  }
}

namespace {
void kv_row_to_f32(DType type, const uint8_t* src, float* dst, int64_t n) {
  if (type == DType::F32) {  // an fp32 cache (llama.cpp's -ctk f32): the row as it is
    std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  if (type == DType::Q8_0) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
    for (int64_t b = 0; b < n / kQuantBlock; ++b) {
      const float d = fp16_to_fp32(blocks[b].d);
      for (int j = 0; j < kQuantBlock; ++j) dst[b * kQuantBlock + j] = d * float(blocks[b].qs[j]);
    }
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}
}  // namespace

void kv_to_f32_generic(DType type, const uint8_t* src, size_t stride, float* dst, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) kv_row_to_f32(type, src + size_t(r) * stride, dst + r * n, n);
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < kQuantBlock; ++j) {
      // lround (half away from zero, as ggml) without its libm call: |v| <= 127, so v - trunc(v) is exact.
      // Clamped first: a subnormal amax makes id infinite, and NaN input stays NaN (0 here, as lround gave).
      float v = xb[j] * id;
      v = v != v ? 0.f : std::fmin(std::fmax(v, -127.f), 127.f);
      int q = int(v);
      const float frac = v - float(q);
      q += (frac >= 0.5f) - (frac <= -0.5f);
      y[b].qs[j] = int8_t(q);
    }
  }
}

}  // namespace pyinfer
