"""Offline placement: which neuron groups go to the fast side (RAM under a budget, or the GPU)."""
