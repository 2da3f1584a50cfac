"""A backend with memory of its own: a CPU backend given memory space 1 stands in for a GPU. The engine
allocates that space's buffers through it, uploads the weights its nodes read once, and inserts Copy nodes
where tensors cross; results must equal the host run bit for bit."""
import numpy as np
import pytest

from pyinfer import _core
from pyinfer.runtime.graph_builder import GraphBuilder
from test_engine_safety import ffn_halves_graph, ffn_on_second_backend, tiny_engine


def decode(engine, prompt=4, steps=3):
    """A prompt, then single-token steps that read the KV cache the earlier runs wrote."""
    out = []
    engine.run(prompt, np.arange(1, prompt + 1, dtype=np.int32), np.arange(prompt, dtype=np.int32),
               np.array([prompt - 1], np.int32))
    out.append(np.array(engine.logits()))
    for s in range(steps):
        pos = prompt + s
        engine.run(1, np.array([7 + s], np.int32), np.array([pos], np.int32), np.array([0], np.int32))
        out.append(np.array(engine.logits()))
    return np.concatenate(out)


def copies_in(engine) -> int:
    return sum(op == _core.Op.COPY for op in engine.node_ops())


@pytest.mark.parametrize("threads", [[1, 1], [2, 1]])
def test_ffn_in_another_memory_space_equals_host(tiny_model_path, threads):
    engines = []
    for device in (False, True):
        _, b = tiny_engine(tiny_model_path)
        if device:  # the FFN but its residual add: the stream is written in place, in host memory only
            ffn_on_second_backend(b, residual=False)
        engines.append(_core.Engine(b.graph, max_tokens=8, max_outputs=8, backend_threads=threads if device
                                    else [sum(threads)], placement=b.placement, backend_memory=[0, 1][:1 + device]))
    want, eng = decode(engines[0]), engines[1]
    # Per layer: the normed input goes in, the FFN output comes back; the FFN weights are uploaded once.
    assert eng.n_copies == copies_in(eng) > 0 and eng.n_uploads > 0 and eng.device_bytes > 0
    for _ in range(2):
        np.testing.assert_array_equal(decode(eng), want)


def test_whole_model_on_the_device_keeps_its_kv_cache_there(tiny_model_path):
    """Every node on the device: the KV cache lives in its memory across runs, and the logits come back to host
    memory at the end of each run."""
    _, b1 = tiny_engine(tiny_model_path)
    want = decode(_core.Engine(b1.graph, max_tokens=8, max_outputs=8, n_threads=1))
    _, b2 = tiny_engine(tiny_model_path)
    for k in range(len(b2.placement)):
        b2.place(k, 1)
    eng = _core.Engine(b2.graph, max_tokens=8, max_outputs=8, backend_threads=[1, 1], placement=b2.placement,
                       backend_memory=[0, 1])
    # Inputs in (tokens, positions, output rows), logits out; nothing else crosses.
    assert copies_in(eng) <= 4
    np.testing.assert_array_equal(decode(eng), want)


def test_views_of_weights_upload_and_the_halves_overlap():
    b1, out1, _, _ = ffn_halves_graph(False)
    e1 = _core.Engine(b1.graph, max_tokens=4, max_outputs=4, n_threads=1)
    e1.run(4)
    b2, out2, _, _ = ffn_halves_graph(True)
    e2 = _core.Engine(b2.graph, max_tokens=4, max_outputs=4, backend_threads=[1, 1], placement=b2.placement,
                      backend_memory=[0, 1])
    # The hot up rows and down columns of 3 layers (strided views, packed on upload) and the input x.
    assert e2.n_uploads == 2 * 3 + 1
    for _ in range(5):
        e2.run(4)
        np.testing.assert_array_equal(e2.tensor(out2.id, 4), e1.tensor(out1.id, 4))


def test_a_tensor_is_written_in_one_memory_space_only():
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.weight("x", int(_core.DType.F32), 32, 4, rng.standard_normal((4, 32)).astype(np.float32))
    w = b.weight("w", int(_core.DType.F32), 32, 32, rng.standard_normal((32, 32)).astype(np.float32))
    y = b.matmul(w, x, "y")
    b.matmul(w, x, "y_again", out=y)
    b.place(1, 1)
    with pytest.raises(ValueError, match="writes 'y' in memory space 1; it lives in space 0"):
        _core.Engine(b.graph, max_tokens=4, max_outputs=4, backend_threads=[1, 1], placement=b.placement,
                     backend_memory=[0, 1])
    with pytest.raises(ValueError, match="memory space for each backend"):
        _core.Engine(b.graph, max_tokens=4, backend_threads=[1, 1], backend_memory=[0])
    with pytest.raises(ValueError, match="placement names a backend for 1 nodes"):
        _core.Engine(b.graph, max_tokens=4, placement=[0])
