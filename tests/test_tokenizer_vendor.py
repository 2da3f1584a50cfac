"""llama.cpp's own tokenizer tests, case for case: the vocab files kept in tests/data/llamacpp_vocab (the small
ones), and with PYINFER_LLAMACPP_MODELS=DIR (vendor/llama.cpp/models of the llama-cpp-python 0.3.36 sdist)
every vocabulary there. Each `.inp` case is tokenized without BOS and with special tokens as text, as
llama.cpp's test-tokenizer-0 calls llama_tokenize."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyinfer.errors import UnsupportedModelError
from pyinfer.model.arch import open_model
from pyinfer.model.tokenizer import Tokenizer

HERE = Path(__file__).parent / "data" / "llamacpp_vocab"
SEP = "\n__ggml_vocab_test__\n"
# Every vocabulary with test cases in the sdist; bert-bge is WordPiece (an embedding model), not run.
VOCABS = ["command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe", "llama-spm",
          "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]


def cases(name: str) -> list[tuple[str, list[int]]]:
    texts = (HERE / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEP)
    outs = (HERE / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")[:len(texts)]
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


def vocab_file(name: str) -> Path:
    for d in (HERE, Path(os.environ.get("PYINFER_LLAMACPP_MODELS", "/nonexistent"))):
        if (d / f"ggml-vocab-{name}.gguf").exists():
            return d / f"ggml-vocab-{name}.gguf"
    pytest.skip(f"ggml-vocab-{name}.gguf is not in the repository (too large); set PYINFER_LLAMACPP_MODELS to "
                "vendor/llama.cpp/models of the llama-cpp-python 0.3.36 sdist to run it")


@pytest.mark.parametrize("name", VOCABS)
def test_every_case_equals_llamacpp(name):
    tok = Tokenizer(open_model(vocab_file(name)).metadata)
    got = [(t, tok.encode(t, add_bos=False)) for t, _ in cases(name)]
    failed = [repr(t) for (t, ids), (_, want) in zip(got, cases(name)) if ids != want]
    assert not failed, f"{len(failed)} of {len(got)} cases differ: {', '.join(failed[:5])}"


def test_every_case_file_is_kept():
    assert {p.name.removeprefix("ggml-vocab-").removesuffix(".gguf.inp") for p in HERE.glob("*.inp")} >= set(VOCABS)


def test_an_unknown_pre_tokenizer_names_itself_and_lists_the_known():
    meta = dict(open_model(vocab_file("deepseek-coder")).metadata, **{"tokenizer.ggml.pre": "klingon"})
    with pytest.raises(UnsupportedModelError, match=r"pre-tokenizer 'klingon' is not supported \(supported: .*qwen2"):
        Tokenizer(meta)
