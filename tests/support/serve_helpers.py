"""A real `pyinfer serve` app on a uvicorn thread in this process, with the server's own uvicorn settings."""
from __future__ import annotations

import socket
import threading
import time


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
