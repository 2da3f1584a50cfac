"""Bad graphs and bad run inputs are refused with a ValueError (GraphError), never undefined behaviour:
index ranges, weight types, list shapes, KV rows written twice, permutations, sizes, buffer lifetimes."""
import mmap

import numpy as np
import pytest

from pyinfer import _core
from pyinfer._core import DType, RowMode
from pyinfer.runtime.graph_builder import GraphBuilder, single_op_engine

RNG = np.random.default_rng(7)


def f32(b, name, rows, cols, data=None):
    data = RNG.standard_normal((rows, cols)).astype(np.float32) if data is None else data
    return b.weight(name, int(DType.F32), cols, rows, data)


def i32(b, name, values, cols=None):
    v = np.asarray(values, np.int32)
    return b.weight(name, int(DType.I32), cols or v.shape[-1], 1 if v.ndim == 1 else v.shape[0], v)


def test_get_rows_constant_id_out_of_range():
    def build(b):
        return b.get_rows(f32(b, "t", 8, 32), i32(b, "ids", [[3], [8]], cols=1), "e")
    with pytest.raises(ValueError, match="holds 8, out of range"):
        single_op_engine(build)


def test_token_input_out_of_range_at_run():
    b = GraphBuilder()
    tokens = b.input("tokens")
    b.graph.input_tokens = tokens.id
    e = b.get_rows(f32(b, "t", 8, 32), tokens, "e")
    b.graph.pin(e.id)
    eng = _core.Engine(b.graph, max_tokens=4)
    eng.run(2, tokens=np.array([1, 7], np.int32))
    for bad in ([1, 8], [-1, 0]):
        with pytest.raises(ValueError, match="token id .* out of range"):
            eng.run(2, tokens=np.array(bad, np.int32))


def test_matmul_refuses_neuron_major_and_activation_types():
    for dtype in (DType.Q4T, DType.Q8A):
        def build(b):
            w = b.weight("w", int(dtype), 64, 4, np.zeros(4 * _core.row_bytes(dtype, 64), np.uint8))
            return b.matmul(w, f32(b, "x", 2, 64), "y")
        with pytest.raises(ValueError, match="weight 'w' has unsupported type"):
            single_op_engine(build)


def test_per_token_ops_refuse_a_one_row_list():
    n = 64

    def build(b):
        g, u = f32(b, "g", 4, n), f32(b, "u", 4, n)
        union = b.state("union", n + 1, 1, DType.I32)  # one row: reading row t > 0 would run past it
        return b.gated_act(b.add(g, g), u, union, 0.0)
    with pytest.raises(ValueError, match="must be written by ActiveSet|one active list per token"):
        single_op_engine(build)


def test_constant_active_list_is_checked():
    n = 64
    bad = np.zeros((1, n + 1), np.int32)
    bad[0, :3] = [2, 5, 64]  # count 2, ids 5 and 64: 64 is past n_ff

    def build(b):
        w = f32(b, "w", n, 32)
        return b.matmul(w, f32(b, "x", 1, 32), "y", active=b.weight("l", int(DType.I32), n + 1, 1, bad))
    with pytest.raises(ValueError, match="ids must be ascending"):
        single_op_engine(build)


def test_scatter_cols_needs_a_permutation():
    def build(b):
        return b.scatter_cols(f32(b, "x", 2, 4), i32(b, "p", [0, 1, 1, 3]), "y")
    with pytest.raises(ValueError, match="not a permutation"):
        single_op_engine(build)


def test_kv_rows_written_twice_in_one_batch():
    b = GraphBuilder()
    pos = b.input("positions")
    b.graph.input_positions = pos.id
    cache = b.state("k", 32, 16)
    b.kv_store(cache, f32(b, "x", 4, 32), pos)
    eng = _core.Engine(b.graph, max_tokens=4)
    eng.run(3, positions=np.array([0, 1, 2], np.int32))
    with pytest.raises(ValueError, match="position 1 appears twice"):
        eng.run(3, positions=np.array([0, 1, 1], np.int32))
    with pytest.raises(ValueError, match="position 16 out of range"):
        eng.run(1, positions=np.array([16], np.int32))


def test_rows_read_must_exist():
    def build(b):
        return b.add(f32(b, "a", 4, 32), f32(b, "two_rows", 2, 32), name="y")
    eng, _ = single_op_engine(build, max_tokens=8)
    eng.run(2)
    with pytest.raises(ValueError, match="tensor 'two_rows' at every row of the batch; it has 2 rows"):
        eng.run(4)


def test_nodes_never_write_weights_or_inputs():
    def build(b):
        x = f32(b, "x", 2, 32)
        return b.rope(x, i32(b, "p", [[0], [1]], cols=1), 2, 16, 10000.0)  # in place: into the caller's memory
    with pytest.raises(ValueError, match="nodes write only scratch or state"):
        single_op_engine(build)


def test_unbound_input_is_refused():
    def build(b):
        return b.get_rows(f32(b, "t", 8, 32), b.input("stray"), "e")
    with pytest.raises(ValueError, match="not bound by any named input role"):
        single_op_engine(build)


@pytest.mark.parametrize("head_dim", [64, 640, 1024])
def test_rope_rotates_every_pair(head_dim):
    """Head sizes over 512 used to rotate only the first 256 pairs."""
    from support.reference_llama import rope

    heads, n_tok = 2, 3
    x = RNG.standard_normal((n_tok, heads * head_dim)).astype(np.float32)
    pos = np.array([0, 5, 300], np.int32)

    def build(b):
        y = b.add(f32(b, "x", n_tok, heads * head_dim, x), f32(b, "z", n_tok, heads * head_dim, np.zeros_like(x)))
        return b.rope(y, i32(b, "p", pos[:, None], cols=1), heads, head_dim, 10000.0)
    eng, y = single_op_engine(build)
    eng.run(n_tok)
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), rope(x, pos, heads, head_dim, 10000.0), rtol=1e-4, atol=1e-4)


def test_op_timing_has_a_slot_for_every_op():
    assert _core.N_OP_KINDS == len(_core.Op.__members__)


def test_weight_sizes_are_checked_without_overflow():
    g = _core.Graph()
    buf = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="too large"):
        g.add_weight("huge", DType.F32, 2 ** 31, 2 ** 40, buf)
    with pytest.raises(ValueError, match="out of range"):
        g.add_weight("neg", DType.F32, 16, -1, buf)
    with pytest.raises(ValueError, match="holds 64 bytes, needs 128"):
        g.add_weight("short", DType.F32, 16, 2, buf)
    with pytest.raises(ValueError, match="multiple of 32"):
        g.add_weight("q", DType.Q8_0, 40, 1, buf)


def test_engine_keeps_its_weights_memory():
    """A weight in an mmap: while an engine uses it, the map cannot be closed under it."""
    mm = mmap.mmap(-1, 4 * 32 * 8)
    np.frombuffer(mm, np.float32)[:] = 1.0

    def build(b):
        return b.add(b.weight("w", int(DType.F32), 32, 8, mm), f32(b, "z", 8, 32, np.zeros((8, 32), np.float32)))
    eng, y = single_op_engine(build)
    with pytest.raises(BufferError):
        mm.close()
    eng.run(8)
    assert float(eng.tensor(y.id, 8).sum()) == 8 * 32
    del eng
    import gc
    gc.collect()
    mm.close()


def test_tensor_views_are_read_only():
    eng, y = single_op_engine(lambda b: b.add(f32(b, "a", 2, 32), f32(b, "c", 2, 32)))
    eng.run(2)
    with pytest.raises(ValueError):
        eng.tensor(y.id, 2)[0, 0] = 1.0


def test_sidecar_permutation_is_checked(tmp_path):
    from support.plans import all_active_plan

    from pyinfer.sparsity.plan import SparsityFileError, SparsityPlan

    plan = all_active_plan("fp")
    plan.layers[0].perm = plan.layers[0].perm.copy()
    plan.layers[0].perm[1] = plan.layers[0].perm[0]
    plan.save(tmp_path / "bad.npz")
    with pytest.raises(SparsityFileError, match="not a permutation"):
        SparsityPlan.load(tmp_path / "bad.npz")


def test_row_modes_of_inputs():
    assert RowMode.TOKENS != RowMode.FIXED  # the module's enums are exposed (used by the tests above)


def test_the_op_and_type_tables_drive_the_bindings():
    """Python's Op and DType enums come from the one op table and the one type table of the core (graph/
    op_params.cpp, graph/dtype.h); every GGUF type id pyinfer runs is GGML's, and row sizes follow the table."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from pyinfer import _core

    assert len(_core.Op.__members__) == _core.N_OP_KINDS and len({_core.op_signature(op)["sources"][0] for op in _core.Op.__members__.values()}) > 1
    for name, t in _core.DType.__members__.items():
        if name in ("Q8A", "Q4T"):  # pyinfer's own: activations, neuron-major down
            continue
        g = GGMLQuantizationType[name]
        assert int(t) == int(g)
        elems, nbytes = GGML_QUANT_SIZES[g]
        assert _core.row_bytes(t, 256) == 256 // elems * nbytes
