"""Measurement tools behind `pyinfer perplexity` and `pyinfer bench`."""
