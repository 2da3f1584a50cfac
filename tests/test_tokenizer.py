"""Token ids must equal llama.cpp's."""
import hashlib


def test_wikitext_token_count_matches_llamacpp(real_model, data_dir):
    text = (data_dir / "wikitext-2-raw-test.txt").read_text(encoding="utf-8")
    ids = real_model.tokenize(text, add_bos=False)
    assert len(ids) == 301948
    # sha256 of str(list) recorded from llama.cpp in shared/reference
    assert hashlib.sha256(str(ids).encode()).hexdigest() == \
        "232ffdf0b0b01dfbb29f748df598462a3d4eb8ddec3e06fcf474f0df6676ba8a"


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
