// Enumerated op parameters, shared by the graph's checks and the kernels.
#pragma once
#include <cstdint>

namespace pyinfer {

// Gated FFN activations: act(gate) * up. The ids are op parameters (SiluMul and GatedAct i[0]) and
// mirror pyinfer.model.config.Activation.
enum class Activation : int32_t {
  SiLU = 0,      // LLaMA, Mistral, SmolLM2
  ReLU = 1,      // ReluLLaMA, ProSparse (ReGLU)
  GeluTanh = 2,  // Gemma (GeGLU with the tanh approximation)
  ReLU2 = 3,     // squared ReLU on the gate (Primer, some ProSparse variants)
  DReLU = 4,     // ReLU on both gate and up (TurboSparse)
};
constexpr int32_t kActivations = 5;

// How RoPE pairs a head's elements: GGML's "normal" mode rotates adjacent pairs (the llama architecture,
// whose converter permutes Q and K to match); NEOX mode rotates element i with i + head_dim / 2 (Gemma).
enum class RopeMode : int32_t { Normal = 0, Neox = 1 };

}  // namespace pyinfer
