"""`pyinfer relufy` on a tiny random model (CPU, a few steps): the PyTorch model matches the numpy reference,
the chunked loss has the naive loss's gradient, training lowers the loss and raises sparsity, and the exported
GGUF runs in pyinfer as a ReLU model, equal to the numpy reference of that file."""
import json
from pathlib import Path

import numpy as np
import pytest
from support.reference_llama import reference_logits
from support.tiny_model import write_tiny_llama

import pyinfer
from pyinfer.model.config import Activation

torch = pytest.importorskip("torch")
CALIB = str(Path(pyinfer.__file__).parent / "data" / "calibration.txt")  # public-domain excerpt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("relufy") / "tiny.gguf",
                                config={"n_layers": 2, "d_model": 64, "d_ff": 128}))


def test_torch_model_matches_the_numpy_reference(tiny):
    from pyinfer.train.torch_llama import Llama

    m = pyinfer.load(tiny, n_threads=1, n_ctx=64)
    ids = m.tokenize("the cat in the hat is a thing")
    t = Llama(m.gguf, "silu")
    with torch.no_grad():
        got = (t(torch.tensor([ids])) @ t.head.T)[0].numpy()
    np.testing.assert_allclose(got, reference_logits(m.gguf, ids), rtol=1e-4, atol=1e-4)


def test_chunked_loss_has_the_naive_gradient(monkeypatch):
    import pyinfer.train.distill as d

    monkeypatch.setattr(d, "VOCAB_CHUNK", 7)  # chunks that do not divide the vocabulary
    g = torch.Generator().manual_seed(0)
    head, ht = torch.randn(30, 8, generator=g), torch.randn(5, 8, generator=g)
    hs = torch.randn(5, 8, generator=g, requires_grad=True)
    y = torch.tensor([0, 29, 7, 13, 6])
    loss, kl, nll = d.ChunkedDistillLoss.apply(hs, ht, head, y, 0.5)
    loss.backward()
    hs2 = hs.detach().clone().requires_grad_(True)
    ls, lt = torch.log_softmax(hs2 @ head.T, -1), torch.log_softmax(ht @ head.T, -1)
    want = (lt.exp() * (lt - ls)).sum(-1).mean() + 0.5 * torch.nn.functional.nll_loss(ls, y)
    want.backward()
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    torch.testing.assert_close(hs.grad, hs2.grad, rtol=1e-4, atol=1e-6)


def test_relufy_trains_and_exports_a_relu_model(tiny, tmp_path, capsys):
    from pyinfer.cli import main

    out = tmp_path / "tiny-relu.gguf"
    rc = main(["relufy", "-m", tiny, "-t", "1", "-c", "64", "-o", str(out), "--data", CALIB, "--tokens", "4096",
               "--seq-len", "32", "--batch", "4", "--lr", "3e-3", "--l1", "0.1", "--json"])
    assert rc == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    curve = json.loads((tmp_path / "tiny-relu.gguf.curve.json").read_text())
    assert np.mean(curve["loss"][-4:]) < np.mean(curve["loss"][:4])
    assert np.mean(curve["sparsity"][-4:]) > np.mean(curve["sparsity"][:4]) + 0.02
    assert figures["tokens"] == 4096 and len(figures["sha256"]) == 64
    m = pyinfer.load(str(out), n_threads=1, n_ctx=64)
    assert m.config.activation == Activation.RELU
    ids = m.tokenize("the cat in the hat is a thing")
    got, want = m.eval(ids, all_logits=True), reference_logits(m.gguf, ids)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.9995
    assert (tmp_path / "tiny-relu.gguf.ckpt").exists()  # --resume continues from it


def test_ffn_only_file_merges_into_the_full_export(tiny, tmp_path):
    from gguf import GGUFReader

    from pyinfer.train.export import export, merge
    from pyinfer.train.torch_llama import dequant

    m = pyinfer.load(tiny, n_threads=1, n_ctx=64)
    rng = np.random.default_rng(1)
    ffn = {f"blk.{il}.{n}.weight": dequant(m.gguf, f"blk.{il}.{n}.weight") + 0.01 * rng.standard_normal(1)
           for il in range(2) for n in ("ffn_gate", "ffn_up", "ffn_down")}
    export(tiny, ffn, tmp_path / "full.gguf")
    export(tiny, ffn, tmp_path / "ffn.gguf", ffn_only=True)
    merge(tiny, str(tmp_path / "ffn.gguf"), tmp_path / "merged.gguf")
    full, merged = GGUFReader(str(tmp_path / "full.gguf")), GGUFReader(str(tmp_path / "merged.gguf"))
    assert [t.name for t in full.tensors] == [t.name for t in merged.tensors]
    for a, b in zip(full.tensors, merged.tensors):
        assert a.tensor_type == b.tensor_type and np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    assert (tmp_path / "ffn.gguf").stat().st_size < (tmp_path / "full.gguf").stat().st_size
    with pytest.raises(pyinfer.errors.PyinferError, match="not an FFN-only file"):
        merge(tiny, str(tmp_path / "full.gguf"), tmp_path / "bad.gguf")


def test_resume_continues_and_refuses_other_settings(tiny, tmp_path, capsys):
    from pyinfer.cli import main

    args = ["relufy", "-m", tiny, "-t", "1", "-c", "64", "-o", str(tmp_path / "r.gguf"), "--data", CALIB,
            "--tokens", "1024", "--seq-len", "32", "--batch", "4", "--json"]
    assert main(args) == 0
    steps = len(json.loads((tmp_path / "r.gguf.curve.json").read_text())["steps"])
    assert main(args + ["--resume"]) == 0  # nothing left to train: the same curve, exported again
    assert len(json.loads((tmp_path / "r.gguf.curve.json").read_text())["steps"]) == steps
    capsys.readouterr()
    assert main(args[:-3] + ["--batch", "2", "--json", "--resume"]) == 2
    assert "resume with those" in capsys.readouterr().err
