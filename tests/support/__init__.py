"""What the tests share, importable as `support` (tests/ is on sys.path when pytest runs them; bench/conftest.py
puts it there for the benchmarks): tiny models written as GGUF files (tiny_model), the numpy reference model
(reference_llama), fuzzed GGUF cases (gguf_fuzz), a server fixture's helpers (serve_helpers), sparsity plans made
for tests (plans) and the op harness's cases (op_cases, run by tests/test_backend_ops.py and timed by
bench/test_bench_backend_ops.py)."""
