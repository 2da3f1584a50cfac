"""Bad input: one clear line, exit code 2, never a crash or a traceback."""
import subprocess
import tempfile
import sys

import numpy as np
import pytest

import pyinfer
from tiny_model import write_tiny_llama


def run_cli(*args):
    r = subprocess.run([sys.executable, "-m", "pyinfer.cli", *args], capture_output=True, text=True, timeout=300,
                       cwd=tempfile.gettempdir())  # never import the source tree
    return r.returncode, r.stdout, r.stderr


def assert_one_line_error(rc, err, fragment):
    assert rc == 2, err
    lines = [l for l in err.strip().splitlines() if l]
    assert len(lines) == 1 and lines[0].startswith("pyinfer: error:"), err
    assert fragment in lines[0]
    assert "Traceback" not in err


def test_missing_file(tmp_path):
    rc, _, err = run_cli("generate", "-m", str(tmp_path / "nope.gguf"), "hi")
    assert_one_line_error(rc, err, "not found")


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"this is not a model" * 10)
    rc, _, err = run_cli("generate", "-m", str(p), "hi")
    assert_one_line_error(rc, err, "not a GGUF file")


@pytest.mark.parametrize("keep", [0.05, 0.5, 0.99])
def test_truncated_file(tiny_model_path, tmp_path, keep):
    data = open(tiny_model_path, "rb").read()
    p = tmp_path / "t.gguf"
    p.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(pyinfer.ModelFormatError):
        pyinfer.load(str(p))
    rc, _, err = run_cli("generate", "-m", str(p), "hi")
    assert rc == 2 and "Traceback" not in err


def test_unsupported_tensor_type(tmp_path):
    p = write_tiny_llama(tmp_path / "f64.gguf", override_types={"output_norm.weight": np.float64})
    with pytest.raises(pyinfer.UnsupportedModelError, match="type F64"):
        pyinfer.load(str(p))


def test_unknown_tensor_type_id(tiny_model_path, tmp_path):
    from gguf import GGUFReader

    r = GGUFReader(tiny_model_path)
    t = r.tensors[0]
    # the tensor-info type field is the uint32 just before the uint64 data offset
    data = bytearray(open(tiny_model_path, "rb").read())
    off = t.field.offset + sum(p.nbytes for p in t.field.parts[:-2])
    data[off:off + 4] = (250).to_bytes(4, "little")
    p = tmp_path / "unknown.gguf"
    p.write_bytes(bytes(data))
    rc, _, err = run_cli("generate", "-m", str(p), "hi")
    assert rc == 2 and "Traceback" not in err and "pyinfer: error:" in err


def test_unsupported_architecture(tmp_path):
    from gguf import GGUFWriter

    w = GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    rc, _, err = run_cli("generate", "-m", str(tmp_path / "gpt2.gguf"), "hi")
    assert_one_line_error(rc, err, "architecture 'gpt2' is not supported")


def test_prompt_longer_than_context(tiny_model_path):
    rc, _, err = run_cli("generate", "-m", tiny_model_path, "-c", "16", "the " * 40)
    assert_one_line_error(rc, err, "context")
    m = pyinfer.load(tiny_model_path, n_ctx=16)
    with pytest.raises(pyinfer.ContextOverflowError):
        m.generate("the " * 40)
    # still usable afterwards, and still right: what a fresh model generates
    fresh = pyinfer.load(tiny_model_path, n_ctx=16)
    assert m.generate("the", max_tokens=4, temperature=0) == fresh.generate("the", max_tokens=4, temperature=0)
    assert len(m.tokenize(m.generate("the", max_tokens=4, temperature=0))) >= 1


def test_bad_arguments(tiny_model_path):
    m = pyinfer.load(tiny_model_path, n_ctx=32)
    with pytest.raises(pyinfer.PyinferError):
        m.eval([10 ** 6])
    with pytest.raises(pyinfer.PyinferError):
        m.generate("the", max_tokens=0)
    with pytest.raises(pyinfer.PyinferError):
        m.generate("the", top_p=0)
    with pytest.raises(pyinfer.PyinferError):
        pyinfer.load(tiny_model_path, n_ctx=0)
    rc, _, err = run_cli("perplexity", "-m", tiny_model_path, "-f", "/no/such/file.txt")
    assert_one_line_error(rc, err, "cannot read")
