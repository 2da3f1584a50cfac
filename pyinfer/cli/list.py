"""`pyinfer list`: every GGUF file pyinfer can find (model/find.py: its cache and named models, ollama's store, LM
Studio's folder, the Hugging Face cache) with its architecture, type mix, size and whether pyinfer runs it, read
from each file's header."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from gguf import GGMLQuantizationType

from ..errors import ModelFormatError


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    ls = sub.add_parser("list", help="GGUF models found on this machine (pyinfer, ollama, LM Studio, HF cache)",
                        description="Lists the GGUF files in pyinfer's cache, ollama's store ($OLLAMA_MODELS or "
                                    "~/.ollama/models), LM Studio's folder ($LMSTUDIO_MODELS or ~/.lmstudio/models) "
                                    "and the Hugging Face cache, with the -m name that loads each. Only headers are "
                                    "read.", epilog="example: pyinfer list; pyinfer generate -m ollama:qwen2.5:0.5b "
                                                    "\"Hello\"")
    ls.add_argument("--json", action="store_true", help="one JSON object: {\"models\": [...]}")
    return {"list": cmd_list}


def describe(path: Path) -> dict:
    """What the header says: architecture, parameters' type mix (by count), size, and whether pyinfer runs it (its
    architecture and every tensor type known), or why not."""
    from ..model.arch import ARCHITECTURES
    from ..model.gguf_check import read_gguf_header
    from ..model.gguf_file import SUPPORTED_TYPES

    from ..model.shards import SHARD, shard_names

    info = {"path": str(path), "bytes": path.stat().st_size if path.exists() else None}
    if SHARD.match(path.name):  # the whole model: every shard's size and tensors (each shard has a header)
        shards = [path.parent / n for n in shard_names(path.name)]
        info["shards"] = len(shards)
        if not all(s.is_file() for s in shards):
            return dict(info, loads=False, why="some of its shards are missing")
        info["bytes"] = sum(s.stat().st_size for s in shards)
    try:
        header = read_gguf_header(path)
    except (ModelFormatError, OSError) as e:
        return dict(info, loads=False, why=str(e))
    arch = str(header.metadata.get("general.architecture", "?"))
    types = Counter()
    tensors = list(header.tensors)
    for shard in [path.parent / n for n in shard_names(path.name)[1:]] if "shards" in info else []:
        try:
            tensors += read_gguf_header(shard).tensors
        except (ModelFormatError, OSError) as e:
            return dict(info, loads=False, why=f"{shard.name}: {e}")
    for t in tensors:
        try:
            types[GGMLQuantizationType(t.type_id).name] += 1
        except ValueError:
            types[f"type {t.type_id}"] += 1
    unknown = sorted(k for k in types if k not in SUPPORTED_TYPES)
    why = (f"architecture {arch} is not supported" if arch not in ARCHITECTURES else
           f"tensor types {', '.join(unknown)} are not supported" if unknown else None)
    return dict(info, architecture=arch, name=header.metadata.get("general.name"), types=dict(types.most_common()),
                loads=why is None, why=why)


def candidates() -> list[tuple[str, str, Path]]:
    """(source, how to name it with -m, path) of every GGUF file found in the stores and caches."""
    from ..model.find import hf_cache, lmstudio_roots, ollama_models
    from ..model.pull import NAMED_MODELS, cache_dir, installed_model

    found: list[tuple[str, str, Path]] = []
    for m in NAMED_MODELS.values():
        p = installed_model(m)
        if p is not None:
            found.append(("pyinfer", m.name, p))
    seen = {p.resolve() for _, _, p in found}
    for p in sorted(cache_dir().glob("*.gguf")) if cache_dir().is_dir() else []:
        if p.resolve() not in seen:
            found.append(("pyinfer", str(p), p))
    found += [("ollama", ref, p) for ref, p in ollama_models()]
    for root in lmstudio_roots():
        for p in sorted(root.glob("*/*/*.gguf")) if root.is_dir() else []:
            if not _later_shard(p):
                found.append(("lmstudio", "lmstudio:" + "/".join(p.relative_to(root).parts), p))
    for p in sorted(hf_cache().glob("models--*/snapshots/*/**/*.gguf")) if hf_cache().is_dir() else []:
        if _later_shard(p):
            continue
        snapshot = next(a for a in p.parents if a.parent.name == "snapshots")
        repo = snapshot.parent.parent.name[len("models--"):].replace("--", "/", 1)
        found.append(("huggingface", f"hf://{repo}/{p.relative_to(snapshot).as_posix()}", p))
    return found


def _later_shard(path: Path) -> bool:
    """A shard after the first of a split model: the first one names the model (-m joins them all)."""
    from ..model.shards import SHARD

    m = SHARD.match(path.name)
    return m is not None and int(m["index"]) != 1


def cmd_list(args) -> int:
    rows = [dict(describe(path), source=source, model=name) for source, name, path in candidates()]
    if args.json:
        print(json.dumps({"models": rows}))
        return 0
    if not rows:
        print("no GGUF models found (pyinfer pull, ollama pull, LM Studio or huggingface-cli download add some)")
        return 0
    for r in rows:
        size = f"{r['bytes'] / 2**30:.2f} GiB" if r.get("bytes") else "?"
        types = ", ".join(f"{k} {v}" for k, v in list(r.get("types", {}).items())[:4])
        status = "runs" if r["loads"] else f"does not run: {r['why']}"
        shards = f" in {r['shards']} shards" if r.get("shards") else ""
        print(f"{r['model']}\n    {r['source']}, {r.get('architecture', '?')}, {size}{shards}, {types}; {status}")
    return 0
