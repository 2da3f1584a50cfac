"""The 5-bit, K-quant and low-bit weight types (Q5_0 .. Q6_K; Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 and the IQ2/IQ3 grid
types) against gguf-py's dequantize and, for the low-bit ones, against llama.cpp's own quantizer and dequantizer
(tests/data/llamacpp_low_bit.npz, bench/llamacpp_quant_fixture.py), for every kernel ISA this CPU can run: the
embedding lookup (GetRows) and the integer-dot matmul."""
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType
from support.tiny_model import LOW_BIT_TYPES, random_blocks
from support.op_cases import offset_correction
from test_ops import q8a_reference, run_single

ISAS = _core.available_isas().split(",")
NEW_TYPES = [Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K] + LOW_BIT_TYPES
INTEGER_DOT = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K] + LOW_BIT_TYPES
LLAMACPP_BLOCKS = Path(__file__).parent / "data" / "llamacpp_low_bit.npz"
def test_row_bytes_match_gguf():
    for qt in NEW_TYPES:
        block_elems, block_bytes = GGML_QUANT_SIZES[qt]
        assert _core.row_bytes(DType(int(qt)), 4 * block_elems) == 4 * block_bytes


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", NEW_TYPES)
def test_get_rows_dequantizes_like_gguf(isa, qtype):
    rng = np.random.default_rng(int(qtype))
    rows, cols = 6, 512
    w = random_blocks(qtype, rows, cols, rng)
    want = quants.dequantize(w, qtype).reshape(rows, cols)
    ids = np.array([5, 0, 3], dtype=np.int32)

    def build(b):
        table = b.weight("table", int(qtype), cols, rows, w)
        return b.get_rows(table, b.weight("ids", int(DType.I32), 1, len(ids), ids), "rows")

    eng, out = run_single(build, len(ids), isa)
    np.testing.assert_allclose(eng.tensor(out.id, len(ids)), want[ids], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", NEW_TYPES)
@pytest.mark.parametrize("n_tok", [1, 3, 4, 9])
def test_matmul_matches_dequantized_reference(isa, qtype, n_tok):
    rng = np.random.default_rng(100 + int(qtype) * 10 + n_tok)
    rows, k = 37, 512  # rows not a multiple of the row tiles; two K-quant super-blocks per row
    w = random_blocks(qtype, rows, k, rng)
    wd = quants.dequantize(w, qtype).reshape(rows, k).astype(np.float64)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)

    def build(b):
        return b.matmul(b.weight("w", int(qtype), k, rows, w), b.weight("x", int(DType.F32), k, n_tok, x), "y")

    eng, y = run_single(build, n_tok, isa)
    q, d = q8a_reference(x, qtype)
    want = (q * d).reshape(n_tok, k).astype(np.float64) @ wd.T  # the integer dot is exact up to float sums
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q8_0])
@pytest.mark.parametrize("k,n_tok", [(256, 2), (96, 5), (96, 1)])
def test_quantized_by_gguf_roundtrip(isa, qtype, k, n_tok):
    """Weights quantized by gguf-py (not just random bits) give the same products; an odd number of blocks
    per row and a token count that leaves a remainder after the tiles."""
    rng = np.random.default_rng(7)
    rows = 16
    w = rng.standard_normal((rows, k)).astype(np.float32)
    wq = quants.quantize(w, qtype)
    wd = quants.dequantize(wq, qtype).reshape(rows, k)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    eng, y = run_single(lambda b: b.matmul(b.weight("w", int(qtype), k, rows, wq),
                                           b.weight("x", int(DType.F32), k, n_tok, x), "y"), n_tok, isa)
    q, d = q8a_reference(x, qtype)
    want = (q * d).reshape(n_tok, k) @ wd.T + offset_correction(x, wq, qtype, rows, k)
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_k_quant_row_length_must_be_a_multiple_of_256():
    from pyinfer.runtime.graph_builder import GraphBuilder

    b = GraphBuilder()
    with pytest.raises(ValueError, match="multiple of 256"):
        b.weight("w", int(Q.Q4_K), 128, 2, np.zeros((2, 72), dtype=np.uint8))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", INTEGER_DOT)
def test_a_token_gets_the_same_bits_alone_and_in_a_batch(isa, qtype):
    """Decode's GEMV (one token) and the many-token tiles sum the same products in the same order: a sequence's
    logits do not depend on what else shares its batch. 70 rows: 4-row tiles and a remainder."""
    from support.tiny_model import random_k_blocks

    rng = np.random.default_rng(int(qtype))
    rows, k, n_tok = 70, 1024, 5
    w = random_k_blocks(qtype, rows, k, rng)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)

    def matmul(xs):
        def build(b):
            return b.matmul(b.weight("w", int(qtype), k, rows, w),
                            b.weight("x", int(DType.F32), k, len(xs), np.ascontiguousarray(xs)), "y")
        eng, y = run_single(build, len(xs), isa)
        return eng.tensor(y.id, len(xs))

    batch = matmul(x)
    np.testing.assert_array_equal(np.concatenate([matmul(x[t:t + 1]) for t in range(n_tok)]), batch)


@pytest.mark.parametrize("qtype", INTEGER_DOT)
@pytest.mark.parametrize("rows,k,n_tok", [(70, 1024, 1), (70, 1024, 13), (20, 512, 300), (9, 22528, 6), (5, 67584, 1)])
def test_every_kernel_table_gives_the_scalar_bits(qtype, rows, k, n_tok):
    """Every path sums a row's products in one order (exact integer dots per block, then one fused float step per
    block), so every x86 table gives the scalar reference's bits, for decode (one token; rows past 65,536 elements
    take the generic tiles) and prefill (lane groups of 8 rows with a short last group; token tails; slabs of 256
    tokens; rows too long for a chunk of several groups). NEON keeps an order of its own (tests/cpp/neon_vs_scalar.cpp checks it against the scalar
    one within rounding)."""
    isas = [i for i in ISAS if i in ("avx2", "avx512")]
    if not isas:
        pytest.skip("no x86 SIMD table on this CPU")
    rng = np.random.default_rng(int(qtype) + k)
    w = random_blocks(qtype, rows, k, rng)  # every bit random: Q8_0's -128 too
    x = rng.standard_normal((n_tok, k)).astype(np.float32)

    def matmul(isa):
        def build(b):
            return b.matmul(b.weight("w", int(qtype), k, rows, w),
                            b.weight("x", int(DType.F32), k, n_tok, x), "y")
        eng, y = run_single(build, n_tok, isa, max_tokens=max(16, n_tok))
        return eng.tensor(y.id, n_tok)

    want = matmul("scalar")
    for isa in isas:
        np.testing.assert_array_equal(matmul(isa), want, err_msg=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", LOW_BIT_TYPES)
def test_llamacpp_quantized_blocks_decode_as_llamacpp_decodes_them(isa, qtype):
    """Blocks made by llama.cpp's quantizer (not random bits: its grids' real indices, IQ2_XXS's signs with their
    parity, MXFP4's exponents) decode to llama.cpp's own floats, and the matmul over them is the integer dot of
    those floats with the quantized activation."""
    data = np.load(LLAMACPP_BLOCKS)
    w, want = data[f"{qtype.name}.blocks"], data[f"{qtype.name}.dequantized"]
    rows, k = want.shape
    np.testing.assert_array_equal(quants.dequantize(w, qtype).reshape(rows, k), want)  # gguf-py agrees with llama.cpp
    ids = np.arange(rows, dtype=np.int32)

    def lookup(b):
        return b.get_rows(b.weight("table", int(qtype), k, rows, w), b.weight("ids", int(DType.I32), 1, rows, ids), "rows")

    eng, out = run_single(lookup, rows, isa)
    np.testing.assert_allclose(eng.tensor(out.id, rows), want, rtol=1e-6, atol=1e-7)
    x = np.random.default_rng(int(qtype)).standard_normal((3, k)).astype(np.float32)
    eng, y = run_single(lambda b: b.matmul(b.weight("w", int(qtype), k, rows, w),
                                           b.weight("x", int(DType.F32), k, 3, x), "y"), 3, isa)
    q, d = q8a_reference(x, qtype)
    ref = (q * d).reshape(3, k).astype(np.float64) @ want.T.astype(np.float64)
    np.testing.assert_allclose(eng.tensor(y.id, 3), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_low_bit_types_load_by_name():
    """The GGUF loader accepts every low-bit type (they were refused before) and maps it to the kernels' id."""
    from pyinfer.model.gguf_file import SUPPORTED_TYPES

    for qtype in LOW_BIT_TYPES:
        assert SUPPORTED_TYPES[qtype.name] == int(qtype) == int(getattr(DType, qtype.name))
        assert _core.row_bytes(DType(int(qtype)), 256) == GGML_QUANT_SIZES[qtype][1] * 256 // GGML_QUANT_SIZES[qtype][0]
