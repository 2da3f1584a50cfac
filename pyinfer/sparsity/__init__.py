"""Activation sparsity: profiling, thresholds, predictor training and the versioned sidecar file."""
