"""Input-sparse projections (TEAL, runtime/input_sparse.py): the transposed copies, the plan, and the sparse path
against a numpy reference that zeroes the same inputs."""
import gc

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import pyinfer
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import single_op_engine
from pyinfer.sparsity.input_calibrate import SITES, InputProfile, profile_inputs
from pyinfer.sparsity.plan import SparsityFileError, SparsityPlan
from support.plans import TOKENS, decode_logits
from support.reference_llama import reference_logits
from support.tiny_model import random_k_blocks, write_tiny_llama

CALIBRATION = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 60


@pytest.fixture(scope="module")
def float_model_path(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("f32") / "tiny-f32.gguf", seed=3, matrix_type=Q.F32,
                                embed_type=Q.F32))


@pytest.fixture(scope="module")
def profile(float_model_path):
    m = pyinfer.load(float_model_path, n_threads=2, n_ctx=64)
    window_ids = m.tokenize(CALIBRATION)
    from pyinfer.sparsity.recorder import Recorder
    assert len(window_ids) >= Recorder(m.gguf, m.config, 1).window
    return profile_inputs(m.gguf, m.config, window_ids, 512, 2, progress=False)


class OneWeight:  # the piece of GGUFModelFile that runtime/input_major.transposed_weight reads
    def __init__(self, data, qtype, rows, cols):
        self.t = type("T", (), dict(data=data, type_name=qtype.name, rows=rows, cols=cols, dtype_id=int(qtype),
                                    name="w"))()

    def tensor(self, name):
        return self.t


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_the_input_major_copy_is_the_transpose(qtype):
    """Q8_0 rows of the transpose: one Q8_0 rounding of the weight, each input's row carrying its own scales."""
    from pyinfer.runtime.input_major import transposed_weight

    rows, cols = 64, 512
    rng = np.random.default_rng(0)
    blocks = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype) if qtype == Q.Q8_0 \
        else random_k_blocks(qtype, rows, cols, rng, signed=True)
    want = quants.dequantize(blocks, qtype).reshape(rows, cols)
    dt, data = transposed_weight(OneWeight(blocks, qtype, rows, cols), "w")
    assert dt == DType.Q8_0 and data.shape == (cols, rows // 32 * 34)
    got = quants.dequantize(data, Q.Q8_0).reshape(cols, rows)
    np.testing.assert_allclose(got.T, want, rtol=0, atol=np.abs(want).max() / 127)  # half a step, and fp16's


def _cut(plan):
    def cut(il, site, x, gate=None):
        lp = plan.layers[il]
        t = lp.threshold if site == "ffn_mid" else lp.inputs[SITES.index(site)]
        if site == "ffn_mid" and lp.gate_threshold > 0:  # CATS first: up (so the product) only where the gate passes
            x = np.where(np.abs(gate / (1 + np.exp(-gate))) > lp.gate_threshold, x, 0.0)
        return np.where(np.abs(x) > t, x, 0.0) if t > 0 else x
    return cut


ALL_SITES = dict(attn_in=0.5, attn_out=0.5, ffn_in=0.5, ffn_mid=0.5)
# (attn_out with the gate cut puts a gate value within rounding of its cut at one position: a near-tie, not a
# difference of semantics; each alone matches.)
MIX = dict(attn_in=0.3, ffn_mid=0.6, gate=0.4)


@pytest.mark.parametrize("levels", [ALL_SITES, MIX], ids=["every projection", "gate cut and down"])
def test_the_sparse_path_is_the_reference_with_small_inputs_zeroed(float_model_path, profile, levels):
    dense = pyinfer.load(float_model_path, n_threads=2, n_ctx=64)
    plan = profile.plan(levels, dense.config.d_ff)
    assert all((t > 0) == (levels.get(s, 0) > 0) for lp in plan.layers
               for s, t in zip(SITES, lp.inputs + (lp.threshold, lp.gate_threshold)))
    sparse = pyinfer.load(float_model_path, n_threads=2, n_ctx=64, sparsity=plan)
    got = decode_logits(sparse, TOKENS)
    want = reference_logits(dense.gguf, TOKENS, input_cut=_cut(plan))
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * scale)
    assert np.abs(got - decode_logits(dense, TOKENS)).max() > 2e-2 * scale  # and it really skipped inputs
    # every token as decode computes it (what perplexity of the plan measures), and prefill dense
    emulated = pyinfer.load(float_model_path, n_threads=2, n_ctx=64, sparsity=plan, emulate_prefill=True)
    np.testing.assert_allclose(emulated.eval(TOKENS, all_logits=True), got, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(sparse.eval(TOKENS, all_logits=True), dense.eval(TOKENS, all_logits=True),
                               rtol=1e-4, atol=1e-4 * scale)


def test_a_fixed_density_keeps_each_tokens_largest_inputs(float_model_path, profile):
    """plan.info["fixed_density"]: each token keeps its k largest |x| of a cut site (what speed at a known density
    is measured with on random-weight models), against the reference with the same inputs kept."""
    dense = pyinfer.load(float_model_path, n_threads=2, n_ctx=64)
    plan = profile.plan(dict(attn_in=0.5, ffn_mid=0.6), dense.config.d_ff)
    plan.info["fixed_density"] = {"attn_in": 0.5, "ffn_mid": 0.25}
    keep = {s: plan.fixed_top_k(s, n) for s, n in (("attn_in", dense.config.d_model), ("ffn_mid", dense.config.d_ff))}
    assert keep == {"attn_in": dense.config.d_model // 2, "ffn_mid": round(0.25 * dense.config.d_ff)}

    def cut(il, site, x, gate=None):
        if site not in keep:
            return x
        top = np.argsort(-np.abs(x), axis=-1, kind="stable")[..., :keep[site]]
        out = np.zeros_like(x)
        np.put_along_axis(out, top, np.take_along_axis(x, top, -1), -1)
        return out

    sparse = pyinfer.load(float_model_path, n_threads=2, n_ctx=64, sparsity=plan)
    got = decode_logits(sparse, TOKENS)
    want = reference_logits(dense.gguf, TOKENS, input_cut=cut)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q4_0, Q.Q8_0])
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "neon"])
def test_an_input_sparse_projection_of_each_copy_type(qtype, isa):
    """A projection through runtime/input_sparse.py's copy (Q8_0 rows) against numpy, on every kernel table here,
    and against the scalar reference (the same products, four rows at a time)."""
    from pyinfer import _core

    if isa not in _core.available_isas().split(","):
        pytest.skip(f"no {isa} here")
    from pyinfer.runtime.input_major import transposed_weight

    rows, cols = 96, 512
    rng = np.random.default_rng(1)
    blocks = random_k_blocks(qtype, rows, cols, rng, signed=True) if qtype == Q.Q4_K else \
        quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    w = quants.dequantize(blocks, qtype).reshape(rows, cols)
    dt, data = transposed_weight(OneWeight(blocks, qtype, rows, cols), "w")
    assert dt == DType.Q8_0
    x = rng.standard_normal((1, cols)).astype(np.float32)
    thr = float(np.quantile(np.abs(x), 0.6))

    def build(b):
        tok = b.input("tokens")
        b.graph.input_tokens = tok.id
        xt = b.get_rows(b.weight("x", int(DType.F32), cols, 1, x), tok, "x")
        active = b.active_set(xt, cols, "active", threshold=thr)
        return b.down_axpy(b.weight("wt", int(dt), rows, cols, data), xt, active)

    def run(table):
        eng, y = single_op_engine(build, max_tokens=1, n_threads=2, isa=table)
        eng.run(1, np.zeros(1, np.int32))
        return eng.tensor(y.id, 1).copy()

    got = run(isa)
    want = np.where(np.abs(x) > thr, x, 0) @ w.T
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * np.abs(want).max())
    if isa != "neon":  # (NEON against the reference under qemu: test_neon_cross.py)
        np.testing.assert_allclose(got, run("scalar"), rtol=0, atol=1e-5 * np.abs(want).max())


def test_plan_file_keeps_the_input_thresholds(float_model_path, profile, tmp_path):
    m = pyinfer.load(float_model_path, n_threads=1, n_ctx=64)
    plan = profile.plan(MIX, m.config.d_ff)
    path = plan.save(tmp_path / "input.npz")
    back = SparsityPlan.load(path, m.gguf.fingerprint(), m.config.n_layers, m.config.d_ff)
    assert back.mode == "input" and [lp.inputs for lp in back.layers] == [lp.inputs for lp in plan.layers]
    assert [(lp.threshold, lp.gate_threshold) for lp in back.layers] == \
        [(lp.threshold, lp.gate_threshold) for lp in plan.layers]
    prof_path = profile.save(tmp_path / "profile.npz")
    assert np.array_equal(InputProfile.load(prof_path, m.gguf.fingerprint(), m.config.n_layers).quantiles,
                          profile.quantiles)
    with pytest.raises(SparsityFileError, match="different model"):
        InputProfile.load(prof_path, "0" * 64, m.config.n_layers)


def test_levels_cut_what_they_say(profile):
    """A level's thresholds are the calibration's quantiles: higher levels cut more at every site."""
    q = profile.quantiles
    assert q.shape[1] == len(SITES) and np.all(np.diff(q, axis=2) >= 0)
    lo, hi = profile.plan({s: 0.2 for s in SITES}, 8), profile.plan({s: 0.6 for s in SITES}, 8)
    for a, b in zip(lo.layers, hi.layers):
        assert all(x < y for x, y in zip(a.inputs + (a.threshold, a.gate_threshold),
                                         b.inputs + (b.threshold, b.gate_threshold)))
    with pytest.raises(pyinfer.PyinferError, match="input sparsity"):
        profile.plan({"attn_q": 0.5}, 8)


def test_sparsity_input_chooses_within_the_bound_then_uses_the_cache(tiny_model_path, tmp_path, monkeypatch):
    """`sparsity="input"`: calibrated and scored on held-out calibration text once, the choice and the scores kept
    in the cached plan, which later loads read without calibrating; timed against dense like `auto`."""
    from pyinfer.sparsity import input_choice

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="input", sparsity_quality=50.0, progress=False)
    plan = SparsityPlan.load(input_choice.input_plan_path(m.gguf.fingerprint(), 50.0))
    q = plan.info["quality"]
    assert plan.mode == "input" and q["bound_pct"] == 50.0 and q["dense_ppl"] > 0 and q["rungs"]
    chosen = {k: v for k, v in plan.info["levels"].items() if v > 0}
    kept = [r for r in q["rungs"] if r["levels"] == chosen]
    assert not chosen or (len(kept) == 1 and kept[0]["change"] <= 0.5 and q["change"] == kept[0]["change"])
    assert all(r["change"] > 0.5 for r in q["rungs"] if r["levels"] != chosen and
               input_choice.LADDER.index(r["levels"]) > input_choice.LADDER.index(chosen or input_choice.LADDER[0]))
    assert (m.session.auto_choice is not None and m.session.auto_choice.get("plan") == "input-sparse plan") or \
        (not chosen and m.sparsity is None and m.session.auto_choice is None)  # nothing cut: nothing timed

    def no_choosing(*a, **k):
        raise AssertionError("the cached plan should be used")

    monkeypatch.setattr(input_choice, "choose_input_plan", no_choosing)
    again = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="input", sparsity_quality=50.0,
                         progress=False)
    assert again.session.auto_choice == m.session.auto_choice  # measured once, stored with the plan
    with pytest.raises(pyinfer.PyinferError, match="quality"):
        pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="input", sparsity_quality=0.0, progress=False)


def test_bytes_read_follow_the_cuts(float_model_path, profile):
    from pyinfer.sparsity.input_bytes import bytes_per_token, measure_densities

    m = pyinfer.load(float_model_path, n_threads=1, n_ctx=64)
    ids = m.tokenize(CALIBRATION)
    none = profile.plan({}, m.config.d_ff)
    dens = measure_densities(m.gguf, m.config, none, ids, 1)
    assert all(v == 1.0 for d in dens for v in d.values())
    b = bytes_per_token(m.gguf, m.config, none, dens)
    assert b["sparse"] == b["dense"] > 0
    cut = profile.plan({"ffn_mid": 0.5, "attn_out": 0.5}, m.config.d_ff)
    dens = measure_densities(m.gguf, m.config, cut, ids, 1)
    assert all(0.2 < d["ffn_mid"] < 0.8 and 0.2 < d["attn_out"] < 0.8 and d["attn_in"] == 1.0 for d in dens)
    b = bytes_per_token(m.gguf, m.config, cut, dens)
    assert b["sparse"] < b["dense"]


@pytest.mark.parametrize("quantized", [False, True], ids=["F32 copies", "Q8_0 copies"])
def test_under_a_memory_limit_the_copies_are_mapped_from_files(float_model_path, tiny_model_path, profile,
                                                               quantized, tmp_path, monkeypatch):
    """`mem_limit` with an input-sparse plan: each cut weight's input-major copy is written once to the cache
    and mapped (offload/input_copies.py), so a limit can page it; decode reads the same rows as in RAM. A copy
    file of the wrong size or not an array at all is rebuilt, never read."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    path = tiny_model_path if quantized else float_model_path
    dense = pyinfer.load(path, n_threads=2, n_ctx=64)
    prof = profile if not quantized else profile_inputs(dense.gguf, dense.config, dense.tokenize(CALIBRATION),
                                                        512, 2, progress=False)
    plan = prof.plan(MIX, dense.config.d_ff)  # projection cuts and the gate cut: both readers of the copies
    want = decode_logits(pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=plan), TOKENS)

    limited = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=plan, mem_limit="4G", progress=False)
    copies = limited.session.input_copies
    assert copies.folder.parent.name == "v1"
    files = sorted(copies.folder.glob("*.npy"))
    assert copies.written > 0 and files and copies.folder.is_relative_to(tmp_path)
    assert {f.name.split(".")[2] for f in files} >= {"attn_q", "attn_v", "ffn_down"}
    np.testing.assert_array_equal(decode_logits(limited, TOKENS), want)

    del limited, copies  # (its engine maps the files: rewriting one under it would fault)
    gc.collect()
    files[0].write_bytes(files[0].read_bytes()[:-100])    # truncated
    files[1].write_bytes(b"not an array")                 # foreign
    right = np.load(files[2])
    np.save(files[2], np.asfortranarray(right))           # the right shape and type in the wrong order
    again = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=plan, mem_limit="4G", progress=False)
    rebuilt = sum(np.load(f, mmap_mode="r").nbytes for f in files[:3])
    assert again.session.input_copies.written == rebuilt   # those three rebuilt, the rest mapped as they were
    np.testing.assert_array_equal(decode_logits(again, TOKENS), want)


def test_an_input_plan_with_a_ram_budget_is_refused_in_one_line(float_model_path, profile, tmp_path):
    m = pyinfer.load(float_model_path, n_threads=1, n_ctx=64)
    path = profile.plan(MIX, m.config.d_ff).save(tmp_path / "input.npz")
    with pytest.raises(pyinfer.PyinferError, match="input sparsity runs on the CPU, in RAM or under --mem-limit"):
        pyinfer.load(float_model_path, n_threads=1, n_ctx=64, sparsity=str(path), ram_budget="64M", progress=False)


def test_the_choice_made_in_ram_is_measured_again_under_a_memory_limit(tiny_model_path, tmp_path, monkeypatch):
    """An input plan that decodes faster in RAM may lose under a limit (its rows then come from disk), so the
    timed choice stored with the plan holds for the limit it was measured under only."""
    from pyinfer.sparsity.auto_choice import machine_key

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    free = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="input", sparsity_quality=50.0,
                        progress=False)
    limited = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="input", sparsity_quality=50.0,
                           mem_limit="4G", progress=False)
    assert free.session.auto_choice is not None  # something within the loose bound: timed against dense
    assert free.session.auto_choice["machine"] == machine_key(2)
    assert limited.session.auto_choice["machine"] == machine_key(2, 4 << 30) != machine_key(2)


def test_a_copy_that_cannot_be_written_is_one_line(float_model_path, profile, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("PYINFER_CACHE", str(blocked))
    m = pyinfer.load(float_model_path, n_threads=1, n_ctx=64)
    with pytest.raises(pyinfer.PyinferError, match="could not write the input-sparse plan's copy"):
        pyinfer.load(float_model_path, n_threads=1, n_ctx=64, sparsity=profile.plan(MIX, m.config.d_ff),
                     mem_limit="4G", progress=False)
