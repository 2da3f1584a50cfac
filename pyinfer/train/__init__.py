"""Training (optional, PyTorch): ReLU-fication by distillation (`pyinfer relufy`)."""
