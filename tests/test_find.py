"""Models from where people keep them (issue 54, part): ollama's store and LM Studio's folder by name with -m, and
`pyinfer list` over those, the Hugging Face cache and pyinfer's own cache. Fake stores in temporary folders: no
network, no ollama."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pyinfer.errors import PyinferError
from pyinfer.model.pull import resolve_model


def ollama_store(root: Path, gguf: Path, name: str = "library/tiny", tag: str = "latest") -> Path:
    """An ollama store holding `gguf` as NAME:TAG (a manifest naming its blob, plus a template layer)."""
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob = root / "blobs" / f"sha256-{digest}"
    shutil.copyfile(gguf, blob)
    manifest = root / "manifests" / "registry.ollama.ai" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": blob.stat().st_size}]}))
    return blob


@pytest.fixture
def stores(tmp_path, tiny_model_path, monkeypatch):
    tiny = Path(tiny_model_path)
    blob = ollama_store(tmp_path / "ollama", tiny)
    ollama_store(tmp_path / "ollama", tiny, "someone/other", "q4")
    lms = tmp_path / "lmstudio" / "pub" / "repo"
    lms.mkdir(parents=True)
    shutil.copyfile(tiny, lms / "repo-Q8_0.gguf")
    hf = tmp_path / "hf" / "models--owner--repo" / "snapshots" / "abc123"
    hf.mkdir(parents=True)
    shutil.copyfile(tiny, hf / "model-Q4_K_M.gguf")
    (hf / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 8)
    env = {"OLLAMA_MODELS": str(tmp_path / "ollama"), "LMSTUDIO_MODELS": str(tmp_path / "lmstudio"),
           "HF_HUB_CACHE": str(tmp_path / "hf"), "PYINFER_CACHE": str(tmp_path / "cache")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return blob, lms / "repo-Q8_0.gguf", env


def test_ollama_and_lmstudio_names_resolve(stores):
    blob, lms_file, _ = stores
    assert resolve_model("ollama:tiny") == blob == resolve_model("ollama:tiny:latest")
    assert resolve_model("ollama:someone/other:q4") == blob
    assert resolve_model("lmstudio:pub/repo") == lms_file == resolve_model("lmstudio:pub/repo/repo-Q8_0.gguf")
    with pytest.raises(PyinferError, match=r"ollama model tiny:7b not found .*ollama pull tiny:7b"):
        resolve_model("ollama:tiny:7b")
    for bad in ("ollama:../etc", "ollama:a/b/c", "lmstudio:pub", "lmstudio:pub/../x"):
        with pytest.raises(PyinferError, match="not an"):
            resolve_model(bad)


def test_a_manifest_without_its_blob_is_one_line(stores, tmp_path):
    blob, _, _ = stores
    blob.unlink()
    with pytest.raises(PyinferError, match="its blob sha256-.* is missing"):
        resolve_model("ollama:tiny")


def run(env, *args):
    r = subprocess.run([sys.executable, "-m", "pyinfer.cli", *args], capture_output=True, text=True, timeout=300,
                       cwd=tempfile.gettempdir(), env=dict(os.environ, **env))
    return r.returncode, r.stdout, r.stderr


def test_list_shows_every_store_and_generate_loads_from_ollama(stores):
    _, _, env = stores
    rc, out, err = run(env, "list", "--json")
    assert rc == 0, err
    rows = {r["model"]: r for r in json.loads(out)["models"]}
    assert rows["ollama:tiny:latest"]["source"] == "ollama" and rows["ollama:tiny:latest"]["loads"]
    assert rows["ollama:someone/other:q4"]["architecture"] == "llama"
    assert rows["lmstudio:pub/repo/repo-Q8_0.gguf"]["types"]
    hf = [r for r in rows.values() if r["source"] == "huggingface"]
    assert {Path(r["path"]).name: r["loads"] for r in hf} == {"model-Q4_K_M.gguf": True, "broken.gguf": False}
    assert next(r["why"] for r in hf if not r["loads"])
    rc, out, err = run(env, "list")
    assert rc == 0 and "ollama:tiny:latest" in out and "runs" in out
    rc, out, err = run(env, "generate", "-m", "ollama:tiny", "-n", "3", "--temp", "0", "Hello")
    assert rc == 0, err
    rc, _, err = run(env, "generate", "-m", "ollama:nothing", "-n", "3", "Hello")
    assert rc == 2 and err.strip().count("\n") == 0 and "ollama pull nothing:latest" in err


def write_shards(src: Path, base: Path, n: int) -> list[Path]:
    """`src` split as gguf-split splits: NAME-0000K-of-0000N.gguf, the metadata in the first (gguf-py's writer)."""
    import gguf

    r = gguf.GGUFReader(str(src))
    base.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(base), r.fields["general.architecture"].contents(),
                        split_max_tensors=-(-len(r.tensors) // n))
    for f in r.fields.values():
        if f.name != "general.architecture" and not f.name.startswith("GGUF."):
            w.add_key_value(f.name, f.contents(), f.types[0],
                            sub_type=f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(base.parent.glob(f"{base.stem}-*-of-*.gguf"))


def same_model(a: Path, b: Path) -> bool:
    """Same metadata (split keys aside) and the same tensors, byte for byte."""
    import gguf

    ra, rb = gguf.GGUFReader(str(a)), gguf.GGUFReader(str(b))
    meta = [{k: str(f.contents()) for k, f in r.fields.items() if not k.startswith(("GGUF.", "split."))}
            for r in (ra, rb)]
    return meta[0] == meta[1] and [(t.name, t.tensor_type, bytes(t.data)) for t in ra.tensors] == \
        [(t.name, t.tensor_type, bytes(t.data)) for t in rb.tensors]


def test_a_local_sharded_model_is_joined_once(tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    shards = write_shards(Path(tiny_model_path), tmp_path / "m" / "tiny.gguf", 2)
    assert [p.name for p in shards] == ["tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"]
    joined = resolve_model(str(shards[1]))  # any shard names the model
    assert joined == resolve_model(str(shards[0])) and same_model(joined, Path(tiny_model_path))
    import pyinfer

    a, b = pyinfer.load(str(joined), n_ctx=64), pyinfer.load(tiny_model_path, n_ctx=64)
    assert np.array_equal(a.eval([1, 2, 3]), b.eval([1, 2, 3]))
    bad = tmp_path / "m" / "tiny-00001-of-00000.gguf"
    bad.write_bytes(shards[0].read_bytes())
    with pytest.raises(PyinferError, match="not a shard name"):
        resolve_model(str(bad))
    shards[1].unlink()
    (tmp_path / "cache").rename(tmp_path / "gone")
    with pytest.raises(PyinferError, match="missing beside it: tiny-00002-of-00002.gguf"):
        resolve_model(str(shards[0]))


@pytest.fixture
def hub(tmp_path, tiny_model_path, monkeypatch):
    """A fake Hugging Face hub (support/fake_hub.py) with one repository of two quants and a sharded one; HF_ENDPOINT
    points at it and the hub cache is a temporary folder."""
    from support import fake_hub

    data = Path(tiny_model_path).read_bytes()
    shards = write_shards(Path(tiny_model_path), tmp_path / "shards" / "big-Q4_K_M.gguf", 3)
    fake_hub.FILES.clear()
    fake_hub.FILES.update({("owner/tiny-GGUF", "tiny-Q4_K_M.gguf"): data, ("owner/tiny-GGUF", "tiny-Q8_0.gguf"): data,
                           ("owner/tiny-GGUF", "mmproj-tiny.gguf"): b"GGUF"})
    fake_hub.FILES.update({("owner/big-GGUF", p.name): p.read_bytes() for p in shards})
    server = fake_hub.serve()
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "PYINFER_CACHE": str(tmp_path / "cache")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import huggingface_hub.constants as c  # the library reads its endpoint once, at import

    monkeypatch.setattr(c, "ENDPOINT", env["HF_ENDPOINT"])
    monkeypatch.setattr(c, "HUGGINGFACE_CO_URL_TEMPLATE", env["HF_ENDPOINT"] + "/{repo_id}/resolve/{revision}/{filename}")
    yield env, data
    server.shutdown()


def test_hub_models_download_once_into_the_shared_cache(hub, monkeypatch, tiny_model_path):
    env, data = hub
    p = resolve_model("owner/tiny-GGUF")                       # no quant named: Q4_K_M
    assert p.name == "tiny-Q4_K_M.gguf" and p.read_bytes() == data and str(p).startswith(env["HF_HUB_CACHE"])
    assert resolve_model("owner/tiny-GGUF:q8_0").name == "tiny-Q8_0.gguf"
    assert resolve_model("hf://owner/tiny-GGUF/tiny-Q8_0.gguf").name == "tiny-Q8_0.gguf"
    with pytest.raises(PyinferError, match="has no Q5_K_M file; it has tiny-Q4_K_M.gguf, tiny-Q8_0.gguf"):
        resolve_model("owner/tiny-GGUF:Q5_K_M")
    joined = resolve_model("owner/big-GGUF")  # three shards, fetched and joined once into pyinfer's cache
    assert str(joined).startswith(env["PYINFER_CACHE"]) and same_model(joined, Path(tiny_model_path))
    assert resolve_model("owner/big-GGUF") == joined
    with pytest.raises(PyinferError, match="owner/nothing.*no such repository"):
        resolve_model("owner/nothing:Q4_K_M")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: what the cache holds still resolves
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    assert resolve_model("owner/tiny-GGUF:Q8_0").name == "tiny-Q8_0.gguf"


def test_generate_from_the_hub_on_the_command_line(hub):
    env, _ = hub
    rc, out, err = run(env, "generate", "-m", "owner/tiny-GGUF:Q8_0", "-n", "3", "--temp", "0", "Hello")
    assert rc == 0, err
    resolve_model("owner/big-GGUF")  # its three shards in the cache
    rc, out, err = run(env, "list", "--json")
    rows = {r["model"]: r for r in json.loads(out)["models"] if r["source"] == "huggingface"}
    assert rc == 0 and rows["hf://owner/tiny-GGUF/tiny-Q8_0.gguf"]["loads"]
    big = rows["hf://owner/big-GGUF/big-Q4_K_M-00001-of-00003.gguf"]  # one row for the model, not one per shard
    assert big["shards"] == 3 and big["loads"] and not any("00002-of" in m for m in rows)
    rc, out, err = run(env, "generate", "-m", "hf://owner/big-GGUF/big-Q4_K_M-00001-of-00003.gguf", "-n", "2", "Hi")
    assert rc == 0, err
