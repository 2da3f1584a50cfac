"""Token ids must equal llama.cpp's (the whole WikiText-2 test file: bench/tokenizer_check.py)."""
import hashlib
import json

import pytest


@pytest.fixture(scope="module")
def llamacpp_ids(data_dir):
    return json.loads((data_dir / "llamacpp_smollm2_ids.json").read_text(encoding="utf-8"))


def test_wikitext_excerpt_ids_match_llamacpp(real_model, data_dir, llamacpp_ids):
    text = (data_dir / "wikitext-2-raw-test.excerpt.txt").read_text(encoding="utf-8")
    ids = real_model.tokenize(text, add_bos=False)
    assert len(ids) == llamacpp_ids["excerpt_tokens"]
    assert hashlib.sha256(str(ids).encode()).hexdigest() == llamacpp_ids["excerpt_sha256"]


def test_edge_cases_match_llamacpp(real_model, llamacpp_ids):
    for text, want in llamacpp_ids["edge_cases"].items():
        assert real_model.tokenize(text, add_bos=False) == want, repr(text)


def test_digits_and_punctuation(real_model):
    assert real_model.tokenize("3.14159 is pi, 2026-11-29") == \
        [35, 30, 33, 36, 33, 37, 41, 314, 16916, 28, 216, 34, 32, 34, 38, 29, 33, 33, 29, 34, 41]


def test_special_tokens_only_when_asked(real_model):
    assert real_model.tokenize("<|im_start|>", special=True) == [1]
    assert real_model.tokenize("<|im_start|>", special=False) != [1]


def test_roundtrip_and_incremental_decoding(real_model):
    from pyinfer.model.tokenizer import IncrementalDecoder

    text = "Héllo wörld — 日本語 🙂 ok"
    ids = real_model.tokenize(text)
    assert real_model.detokenize(ids) == text
    dec = IncrementalDecoder(real_model.tokenizer)
    assert "".join(dec.push(i) for i in ids) == text
