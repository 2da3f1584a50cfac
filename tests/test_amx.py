"""The AMX int8 matmul (csrc/kernels/matmul_amx.h), issue 28.

Everywhere: the kernel with its tile instructions emulated in portable code (tests/cpp/amx_emulated.cpp),
against the scalar reference, so CI (no AMX) runs its packing, tiling, scaling and tails. On a CPU with AMX:
the real "amx" kernel table against the dequantized reference and against the AVX-512 table, at token counts
that fill whole 16 x 16 tiles and leave tails (the op tests elsewhere stop at 9 tokens, under one tile)."""
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType
from test_ops import q8a_reference, run_single
from support.tiny_model import random_blocks

ROOT = Path(__file__).resolve().parents[1]
ISAS = _core.available_isas().split(",")
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
needs_amx = pytest.mark.skipif("amx" not in ISAS, reason="needs a CPU with AMX-INT8 (Sapphire Rapids or later), "
                               "a kernel that grants the tile state (Linux 5.16+) and a compiler with -mamx-int8")


def _cpu_has_avx2() -> bool:
    try:
        return " avx2 " in " " + Path("/proc/cpuinfo").read_text().replace("\n", " ") + " "
    except OSError:
        return False


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not CXX or not _cpu_has_avx2(),
                    reason="the emulated AMX kernel is x86 code (AVX2 for its 16-float vectors) built by a C++ compiler")
def test_amx_kernel_emulated_matches_scalar(tmp_path):
    src = ROOT / "csrc"
    files = [ROOT / "tests/cpp/amx_emulated.cpp"] + [src / f for f in (
        "kernels/matmul_scalar.cpp", "kernels/quant_blocks.cpp", "graph/dtype.cpp", "kernels/ops_float.cpp",
        "kernels/attention.cpp", "kernels/sparse_ffn_scalar.cpp")]
    exe = tmp_path / "amx_emulated"
    subprocess.run([CXX, "-O2", "-std=c++17", "-mavx2", "-mfma", "-mf16c", f"-I{src}", *map(str, files), "-o",
                    str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=120).stdout
    for t in TYPES:
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{t} max diff "))
        diff, of = float(line.split()[3]), float(line.split()[5])
        assert of > 0 and diff <= 1e-5 * of, out  # the same integer sums; only the float sums are ordered otherwise
    assert float(next(ln for ln in out.splitlines() if ln.startswith("gather max diff")).split()[-1]) < 1e-5, out
    shapes = [ln.split() for ln in out.splitlines() if ln.startswith("shape ")]
    assert len(shapes) == 7, out  # odd block counts, several packed chunks, paged rows, padded rows
    for f in shapes:
        assert float(f[-1]) > 0 and float(f[-3]) <= 1e-5 * float(f[-1]), out
    assert "integer sums differ 0 of 256" in out, out  # unit scales: the int32 tile sums themselves, bit for bit


@needs_amx
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n_tok", [16, 37, 64])
def test_amx_matmul_matches_reference_and_avx512(qtype, n_tok):
    qt = Q[qtype]
    rng = np.random.default_rng(500 + int(qt) * 10 + n_tok)
    rows, k = 53, 512  # 3 row tiles and 5 rows; two K-quant super-blocks
    if qt in (Q.Q4_0, Q.Q4_1, Q.Q8_0):  # gguf-py quantizes these; random_blocks covers the others
        w = quants.quantize(rng.standard_normal((rows, k)).astype(np.float32) * 0.05, qt)
    else:
        w = random_blocks(qt, rows, k, rng)
    wd = quants.dequantize(w, qt).reshape(rows, k).astype(np.float64)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)

    def build(b):
        return b.matmul(b.weight("w", int(qt), k, rows, w), b.weight("x", int(DType.F32), k, n_tok, x), "y")

    q, d = q8a_reference(x, qt)
    want = (q * d).reshape(n_tok, k).astype(np.float64) @ wd.T
    got = {}
    for isa in ("amx", "avx512"):
        eng, y = run_single(build, n_tok, isa, max_tokens=n_tok)
        got[isa] = eng.tensor(y.id, n_tok).copy()
    np.testing.assert_allclose(got["amx"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(got["amx"], got["avx512"], rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["scalar", "avx512"])
def test_pyinfer_isa_env_picks_the_table(name, tmp_path):
    """PYINFER_ISA=avx512 is how a user turns AMX off: "auto" then takes the named table."""
    if name not in ISAS:
        pytest.skip(f"this CPU cannot run the {name} table")
    env = dict(os.environ, PYINFER_ISA=name)
    code = ("import numpy as np; from pyinfer.runtime.graph_builder import single_op_engine; "
            "from pyinfer._core import DType; "
            "eng, y = single_op_engine(lambda b: b.add(b.weight('a', int(DType.F32), 32, 1, np.ones((1, 32), np.float32)),"
            " b.weight('c', int(DType.F32), 32, 1, np.ones((1, 32), np.float32))), max_tokens=1); print(eng.isa)")
    # cwd elsewhere: the installed pyinfer, not a source tree's (which has no _core)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout
    assert out.strip() == name


@needs_amx
def test_amx_model_logits_agree_with_avx512(tiny_model_path):
    """A whole prefill on AMX against AVX-512. Not bit for bit: the int32 sums are the same, but the block
    scales are summed in another order, and where an activation sits on a rounding boundary of the next
    layer's Q8 quantization, a last-bit difference moves it one step (about 0.4% of that activation)."""
    import pyinfer

    ids = None
    logits = {}
    for isa in ("amx", "avx512"):
        m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, isa=isa)
        ids = (m.tokenize("the theme in the thin hat") * 3)[:40]  # 2 token tiles and a tail
        logits[isa] = m.eval(ids, all_logits=True)
    a, b = logits["amx"], logits["avx512"]
    assert np.abs(a - b).max() <= 0.02 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.95


@pytest.mark.skipif(not {"avx2", "avx512"} <= set(ISAS), reason="needs a CPU with both the AVX2 and AVX-512 tables")
@pytest.mark.parametrize("qtype", TYPES)
def test_avx2_and_avx512_tables_give_the_same_bits(qtype):
    """The emulated AMX build (-DPYINFER_AMX_EMULATE=ON) puts its tails and decode on the AVX2 table, the real one
    on AVX-512: its figures are the hardware's only if those two agree bit for bit (tile shapes differ, the sums
    per output do not)."""
    qt = Q[qtype]
    rng = np.random.default_rng(900 + int(qt))
    rows, k = 37, 512
    w = random_blocks(qt, rows, k, rng) if qt not in (Q.Q4_0, Q.Q4_1, Q.Q8_0) else \
        quants.quantize(rng.standard_normal((rows, k)).astype(np.float32) * 0.05, qt)
    for n_tok in (1, 2, 5, 15):
        x = rng.standard_normal((n_tok, k)).astype(np.float32)

        def build(b):
            return b.matmul(b.weight("w", int(qt), k, rows, w), b.weight("x", int(DType.F32), k, n_tok, x), "y")

        ys = []
        for isa in ("avx2", "avx512"):
            eng, y = run_single(build, n_tok, isa, max_tokens=n_tok)
            ys.append(eng.tensor(y.id, n_tok).copy())
        np.testing.assert_array_equal(ys[0], ys[1])
