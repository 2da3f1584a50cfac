"""The NEON kernels, cross-compiled for aarch64 and run under qemu, must equal the scalar reference."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX, QEMU = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")


def test_neon_matches_scalar(tmp_path):
    if not (CXX and QEMU):  # CI installs both (.ci/run) and sets PYINFER_REQUIRE_NEON: there it must run
        msg = ("needs an aarch64 cross compiler and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user); "
               "x86 cannot run NEON natively")
        if os.environ.get("PYINFER_REQUIRE_NEON"):
            pytest.fail(msg)
        pytest.skip(msg)
    src = ROOT / "csrc"
    files = [ROOT / "tests/cpp/neon_vs_scalar.cpp"] + [src / f for f in (
        "kernels/matmul_neon.cpp", "kernels/matmul_scalar.cpp", "kernels/matmul_avx2.cpp", "graph/dtype.cpp",
        "kernels/sparse_ffn_neon.cpp", "kernels/sparse_ffn_scalar.cpp", "kernels/sparse_ffn_avx2.cpp",
        "kernels/attention.cpp", "kernels/attention_avx2.cpp", "kernels/attention_neon.cpp", "kernels/quant_blocks.cpp", "kernels/ops_float.cpp")]
    exe = tmp_path / "neon_vs_scalar"
    subprocess.run([CXX, "-O2", "-std=c++17", "-static", f"-I{src}", *map(str, files), "-o", str(exe)], check=True)
    out = subprocess.run([QEMU, str(exe)], capture_output=True, text=True, check=True, timeout=120).stdout
    assert "quantize mismatches 0" in out  # the same Q8 activations, so the integer dot products are the same
    assert "q8k quantize mismatches 0" in out  # and with one scale per 256 (llama.cpp's Q8_K scheme)
    for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS",
              "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{t} max diff "))
        diff, of = float(line.split()[3]), float(line.split()[5])
        assert of > 0 and diff <= 1e-5 * of, out  # only the float sums of block scales are ordered differently
    for t in ("F32", "F16", "BF16"):  # float weights: the same products, summed in another order
        line = next(ln for ln in out.splitlines() if ln.startswith(f"float {t} max diff "))
        diff, of = float(line.split()[4]), float(line.split()[6])
        assert of > 0 and diff <= 1e-5 * of, out
    assert "f16 equal 1" in out
    assert "silu equal 1" in out, out
    for t in ("Q8_0", "Q4_1", "Q4T"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"axpy {t} "))
        assert float(line.split()[-1]) < 1e-4, out
    assert "axpy Q4T max diff 0\n" in out and "axpy Q4T full max diff 0\n" in out  # integer sums: the same bits
    assert "gather max diff 0" in out
    for case in ("prefill", "decode", "window", "q8_0", "hd24"):  # float sums in another order, exp to ~1 ulp
        line = next(ln for ln in out.splitlines() if ln.startswith(f"attention {case} max diff "))
        diff, of, finite = float(line.split()[4]), float(line.split()[6]), line.split()[8]
        assert of > 0 and diff <= 1e-5 * of and finite == "1", out
