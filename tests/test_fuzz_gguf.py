"""A seeded subset of the GGUF fuzzer (bench/fuzz_gguf.py runs 10,000 cases): every mutant of the tiny model
and of the real model's header loads and runs one token, or fails with a one-line PyinferError."""
import struct

import pytest
from support.gguf_fuzz import (ALL_KINDS, ARCH_TARGETS, Fuzzer, MutantFile, Mutation, _u64, make_cases, run_case, summarize,
                       write_targets)
from support.tiny_model import write_tiny_arch, write_tiny_llama


def test_300_seeded_mutants(tmp_path, real_model_path):
    sources = {"tiny": str(write_tiny_llama(tmp_path / "tiny.gguf")), "real": real_model_path}
    cases = make_cases(300, seed=1, real_share=0.1, have_real=True)
    s = summarize(Fuzzer(sources, tmp_path, workers=2, timeout=120).run(cases))
    assert s["cases"] == 300
    assert not s["findings"], s["findings"][:5]


def test_every_kind_of_mutant_on_every_architecture(tmp_path):
    """Each kind of mutation once on each tiny architecture besides the plain llama (their own keys: expert
    counts, LongRoPE factors, sliding windows, QK-norms): each loads and runs or fails in one line."""
    cases = make_cases(len(ARCH_TARGETS) * len(ALL_KINDS), seed=3, real_share=0.0, have_real=False,
                       tiny=ARCH_TARGETS)
    assert {(c.target, c.kind) for c in cases} == {(t, k) for t in ARCH_TARGETS for k in ALL_KINDS}
    s = summarize(Fuzzer(write_targets(tmp_path, ARCH_TARGETS), tmp_path, workers=2, timeout=120).run(cases))
    assert not s["findings"], s["findings"][:5]


@pytest.mark.parametrize("rows", [-1, -100])
def test_a_head_of_other_rows_than_the_vocabulary_is_a_one_line_error(tmp_path, rows):
    """A finding of the run over every architecture: output.weight with fewer rows than tokens loaded, and its
    logits, narrower than the vocabulary, failed with a numpy broadcast error on the first token."""
    mf = MutantFile(write_tiny_arch(tmp_path / "llama.gguf", "llama"), tmp_path)
    t = {x.name: x for x in mf.layout.tensors}["output.weight"]
    m = Mutation("shape", "output.weight rows", [(t.dims_off + 8, _u64(t.dims[1] + rows))])
    outcome, detail = run_case(mf.apply(m))
    mf.restore(m)
    assert outcome == "error" and "output.weight" in detail and "vocabulary" in detail, (outcome, detail)


@pytest.mark.parametrize("window", [1 << 31, (1 << 32) - 1])
def test_a_sliding_window_past_32_bits_is_a_one_line_error(tmp_path, window):
    """A finding of the same run: Gemma 3's attention.sliding_window of 2^31 or more reached the attention op,
    whose window is a 32-bit int, and pybind11 refused it with a RuntimeError."""
    mf = MutantFile(write_targets(tmp_path, ["gemma3"])["gemma3"], tmp_path)
    f = {x.key: x for x in mf.layout.fields}["gemma3.attention.sliding_window"]
    m = Mutation("metadata_value", "sliding_window", [(f.value_off, window.to_bytes(4, "little"))])
    outcome, detail = run_case(mf.apply(m))
    mf.restore(m)
    assert outcome == "error" and "sliding_window" in detail, (outcome, detail)


def _explicit(layout, kind):
    """The mutants behind the first run's findings, written out."""
    f = {x.key: x for x in layout.fields}
    t = {x.name: x for x in layout.tensors}
    if kind == "huge_count":  # the gguf reader looped 2^32 times over empty slices: a hang
        return Mutation(kind, "token_type count", [(f["tokenizer.ggml.token_type"].count_off, _u64(2 ** 32 + 1))])
    if kind == "bad_utf8":    # tokens decoded to None: TypeError in the tokenizer
        return Mutation(kind, "token 0", [(f["tokenizer.ggml.tokens"].string_offs[0] + 8, b"\xff")])
    if kind == "nan_norm":    # every logit NaN
        norm = t["output_norm.weight"]
        return Mutation(kind, "output_norm", [(layout.data_start + norm.offset, struct.pack("<f", float("nan")))])
    if kind == "zero_dim":    # GraphError traceback from the graph builder
        return Mutation(kind, "ffn_down dim 0", [(t["blk.0.ffn_down.weight"].dims_off, _u64(0))])
    a, b = layout.tensors[0], layout.tensors[1]
    return Mutation(kind, "overlap", [(b.offset_off, _u64(a.offset))])


@pytest.mark.parametrize("kind", ["huge_count", "bad_utf8", "nan_norm", "zero_dim", "overlap"])
def test_findings_of_the_first_run_are_one_line_errors(tmp_path, kind):
    mf = MutantFile(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path)
    m = _explicit(mf.layout, kind)
    outcome, detail = run_case(mf.apply(m))
    mf.restore(m)
    assert outcome == "error", (kind, outcome, detail)


@pytest.mark.parametrize("target", ["tiny", "real"])
def test_structural_mutants_reach_chat_and_the_server(tmp_path, real_model_path, target):
    """Metadata re-encoded (a chat template of another type or a hostile one, duplicated or all-control
    vocabularies, a huge unused array, vocabulary arrays of the wrong type, special ids out of range): each
    loads and serves or ends in a one-line error, through chat, special-token tokenization and the server."""
    import random

    from support.gguf_fuzz import HOSTILE_TEMPLATES, STRUCTURAL_KINDS, mutate

    src = write_tiny_llama(tmp_path / "tiny.gguf") if target == "tiny" else real_model_path
    mf = MutantFile(src, tmp_path)
    seen = {}
    for kind in STRUCTURAL_KINDS:
        for seed in range(2 if target == "real" else 3):
            m = mutate(mf.layout, mf.data_at, random.Random(seed), kind, tensor_data=False)
            outcome, detail = run_case(mf.apply(m))
            mf.restore(m)
            assert outcome in ("ok", "error"), (kind, m.what, outcome, detail)
            seen.setdefault(kind, set()).add(outcome)
    assert set(seen) == set(STRUCTURAL_KINDS)
    assert seen["huge_array"] == {"ok"} and seen["template_type"] == {"error"}
    assert len(HOSTILE_TEMPLATES) > 10


def test_a_head_count_past_32_bits_is_a_one_line_error(tmp_path):
    """A finding of the structural run: head_count 2^31 reached the graph and pybind11 refused the int."""
    mf = MutantFile(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path)
    f = {x.key: x for x in mf.layout.fields}
    m = Mutation("metadata_value", "head_count 2^31", [(f["llama.attention.head_count"].value_off,
                                                         (1 << 31).to_bytes(4, "little"))])
    outcome, detail = run_case(mf.apply(m))
    mf.restore(m)
    assert outcome == "error" and "head_count" in detail, (outcome, detail)


def test_a_key_name_with_a_newline_is_shown_on_one_line(tmp_path):
    """A finding of the 10,000-case run: bit flips made a key's length swallow the bytes after it (a count of
    0x010A holds a newline) and the error about its value printed the name raw, on two lines."""
    mf = MutantFile(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path)
    first = mf.layout.fields[0]
    start = first.type_off - len(first.key.encode())
    m = Mutation("bitflip", "newline in a key, unknown value type",
                 [(start + 2, b"\n"), (first.type_off, struct.pack("<I", 99))])
    outcome, detail = run_case(mf.apply(m))
    mf.restore(m)
    assert outcome == "error" and "\\n" in detail, (outcome, detail)
