"""Issue 54's check of models from where people keep them, with no internet: the real SmolLM2 GGUF served by an
emulated Hugging Face hub (tests/support/fake_hub.py, reached through HF_ENDPOINT, a fresh HF cache), a fake
ollama store (a manifest naming its sha256 blob) and an LM Studio folder, each loaded by `pyinfer generate -m ...`,
then `pyinfer list`. Every command and what it printed go to the table.

  python bench/model_sources.py     # -> bench/results/serving/model_sources.md
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "serving"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
REPO, FILE = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf"


def main() -> None:
    from pyinfer.model.pull import installed_default_model
    from support import fake_hub

    gguf = Path(installed_default_model())
    tmp = Path(tempfile.mkdtemp(prefix="pyinfer-sources-"))
    fake_hub.FILES[(REPO, FILE)] = gguf.read_bytes()
    hub = fake_hub.serve()
    ollama = tmp / "ollama"
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (ollama / "blobs").mkdir(parents=True)
    shutil.copyfile(gguf, ollama / "blobs" / f"sha256-{digest}")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
         "size": gguf.stat().st_size}]}))
    lmstudio = tmp / "lmstudio" / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
    lmstudio.mkdir(parents=True)
    shutil.copyfile(gguf, lmstudio / FILE)
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{hub.server_address[1]}", HF_HOME=str(tmp / "hf"),
               OLLAMA_MODELS=str(ollama), LMSTUDIO_MODELS=str(tmp / "lmstudio"), HF_HUB_DISABLE_TELEMETRY="1")
    runs = []
    for model in (f"{REPO}:Q4_1", f"hf://{REPO}/{FILE}", "ollama:smollm2:135m", f"lmstudio:{REPO}"):
        runs.append(run(["pyinfer", "generate", "-m", model, "-n", "8", "--temp", "0", "-t", "2",
                         "The capital of France is"], env))
    runs.append(run(["pyinfer", "list"], env))
    hub.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    lines = ["# Models from where people keep them (no internet)", "",
             f"The real {gguf.name} behind an emulated Hugging Face hub (HF_ENDPOINT, a fresh HF_HOME), in a fake "
             "ollama store and in an LM Studio folder (temporary paths shortened to $TMP).", ""]
    for cmd, code, out in runs:
        lines += [f"`{' '.join(cmd[:4]) if cmd[1] == 'generate' else ' '.join(cmd)}` (exit {code})", "", "```",
                  out.replace(str(tmp), "$TMP").rstrip(), "```", ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "model_sources.md").write_text("\n".join(lines))
    print("\n".join(lines))


def run(cmd: list[str], env: dict) -> tuple[list[str], int, str]:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return cmd, p.returncode, (p.stdout + p.stderr)[-3000:]


if __name__ == "__main__":
    main()
