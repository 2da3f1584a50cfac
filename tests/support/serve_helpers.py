"""A real `pyinfer serve` app on a uvicorn thread in this process, with the server's own uvicorn settings."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_path, api_key: str, **kwargs):
    """(base URL, engine loop, model, uvicorn server, its thread); kwargs go to build_server."""
    import uvicorn

    from pyinfer.serve.http_limits import uvicorn_config
    from pyinfer.serve.server import build_server

    kwargs = dict(dict(kv_budget=1024, n_threads=2), **kwargs)
    app, loop, model = build_server(model_path, api_key=api_key, **kwargs)
    loop.start()
    port = free_port()
    srv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, 64))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    else:
        stop_server(srv, t, loop)
        raise RuntimeError("uvicorn did not start within 10 s")
    return f"http://127.0.0.1:{port}", loop, model, srv, t


def stop_server(srv, t, loop) -> None:
    srv.should_exit = True
    t.join(timeout=10)
    loop.stop()


def concurrent_completions(model_path, prompts: list[str], max_tokens: int = 8, **server_kwargs) -> tuple[list, dict]:
    """Greedy completions of `prompts`, all requested at once through the OpenAI server (their sequences interleave
    in its batches); returns (texts in prompt order, the serving loop's stats)."""
    import concurrent.futures

    import httpx

    base, loop, model, srv, t = start_server(model_path, "k", **server_kwargs)
    try:
        def one(p):
            r = httpx.post(base + "/v1/completions", headers={"Authorization": "Bearer k"}, timeout=60,
                           json={"model": Path(model_path).stem, "prompt": p, "max_tokens": max_tokens, "temperature": 0})
            return r.json()["choices"][0]["text"]

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            return list(ex.map(one, prompts)), dict(loop.stats)
    finally:
        stop_server(srv, t, loop)


def assert_interleaved_equal_alone(model_path, load, **server_kwargs) -> None:
    """Four greedy completions requested at once through the server are each what the model (`load(path)`)
    generates alone, and all four finish."""
    prompts = ["ab", "hello world", "the cat", "xyz xyz"]
    texts, stats = concurrent_completions(model_path, prompts, **server_kwargs)
    alone = load(model_path)
    assert texts == [alone.generate(p, max_tokens=8, temperature=0) for p in prompts]
    assert stats["finished_total"] == 4
