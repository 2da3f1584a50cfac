"""Writes a model with SmolLM2-135M's shapes and weight types (30 layers, d 576, FFN 1536, 9/3 heads, 49152
tokens, Q4_1 matrices) and random weights: for decode speed on a GPU machine, where the real 92 MB file cannot
travel (64 MiB in all). Speed depends on shapes and types, not values; correctness is the op tests' and the
real model's (on the CPU) business.

    python bench/gpu/shaped_model.py OUT.gguf
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

SMOLLM2 = {"n_layers": 30, "d_model": 576, "d_ff": 1536, "n_heads": 9, "n_kv_heads": 3, "rope_base": 100000.0,
           "eps": 1e-5}


def main() -> int:
    from gguf import GGMLQuantizationType as Q
    from support.tiny_model import write_tiny_llama

    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    path = write_tiny_llama(Path(sys.argv[1]), matrix_type=Q.Q4_1, embed_type=Q.Q8_0, config=SMOLLM2,
                            pad_vocab=49152)
    print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
