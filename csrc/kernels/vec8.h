// 8 floats as one value for the recurrent kernels: GCC's and clang's vector extensions give AVX registers in a clone
// built for AVX2, SSE pairs or NEON elsewhere, with no intrinsics per ISA. Unaligned (aligned(4)): rows of states
// and scratch carry no alignment promise. No v8 crosses a call between files, so GCC's note on the ABI of 32-byte
// vectors without AVX (-Wpsabi) never matters: CMakeLists.txt silences it for the files that include this.
#pragma once

// The kernels that use these lanes are built twice on x86-64 GCC, for x86-64-v3 (AVX2 + FMA) and the baseline,
// and the loader picks one (not under the sanitizers' builds: an ifunc resolver runs before their runtime is up).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define PYI_VEC8_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PYI_VEC8_CLONES
#endif

namespace pyinfer::vec8 {

typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32)));

// Lanes of two vectors picked by constant indices (0-7: a's, 8-15: b's), in either compiler's spelling.
#if defined(__clang__)
#define PYI_V8_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define PYI_V8_SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, ::pyinfer::vec8::v8i{__VA_ARGS__})
#endif

#define PYI_V8_INLINE inline __attribute__((always_inline))
PYI_V8_INLINE v8 load(const float* p) { return *reinterpret_cast<const v8*>(p); }
PYI_V8_INLINE void store(float* p, v8 x) { *reinterpret_cast<v8*>(p) = x; }
// A broadcast: lane 0 shuffled into all (a list {x, x, ...} inserts lane by lane under GCC; 0 + x costs an add).
PYI_V8_INLINE v8 splat(float x) { const v8 v = {x}; return PYI_V8_SHUFFLE2(v, v, 0, 0, 0, 0, 0, 0, 0, 0); }
// The lanes summed as ggml's AVX2 reduction does: halves added, then pairs.
PYI_V8_INLINE float hsum(v8 x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }
#undef PYI_V8_INLINE

}  // namespace pyinfer::vec8
