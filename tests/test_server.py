"""The OpenAI-compatible server, in process, with the real model, through the official `openai` client."""
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from pyinfer.serve.metrics import parse_metrics  # noqa: E402

KEY = "test-key"


@pytest.fixture(scope="module")
def server(real_model_path):
    from support.serve_helpers import start_server, stop_server

    base, loop, model, srv, t = start_server(real_model_path, KEY, policy="hedge")
    yield base, loop, model
    stop_server(srv, t, loop)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)


def model_id(server):
    return httpx.get(server[0] + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]["id"]


def test_completion_matches_local_greedy(server, client, real_model):
    prompt = "The capital of France is"
    r = client.completions.create(model=model_id(server), prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == real_model.generate(prompt, max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 12


def test_chat_streaming_and_not(server, client):
    msgs = [{"role": "user", "content": "Say hello in one word."}]
    whole = client.chat.completions.create(model=model_id(server), messages=msgs, max_tokens=10, temperature=0)
    parts, finish = [], None
    for ev in client.chat.completions.create(model=model_id(server), messages=msgs, max_tokens=10, temperature=0,
                                             stream=True):
        if ev.choices and ev.choices[0].delta.content:
            parts.append(ev.choices[0].delta.content)
        if ev.choices and ev.choices[0].finish_reason:
            finish = ev.choices[0].finish_reason
    assert "".join(parts) == whole.choices[0].message.content
    assert finish in ("length", "stop")


def test_concurrent_requests_all_complete(server, client):
    out = [None] * 8

    def one(i):
        out[i] = client.completions.create(model=model_id(server), prompt=f"Number {i}:", max_tokens=20 + i,
                                           temperature=0.7, seed=i).choices[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(c is not None and c.finish_reason in ("length", "stop") for c in out)


def test_errors_are_openai_shaped(server, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="exceeds"):
        client.completions.create(model=model_id(server), prompt="hi", max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=model_id(server), prompt="hi", max_tokens=4, temperature=7)
    bad = openai.OpenAI(base_url=server[0] + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=model_id(server), prompt="hi", max_tokens=4)
    r = httpx.post(server[0] + "/v1/completions", content=b"{not json", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and "error" in r.json()
    auth = {"Authorization": f"Bearer {KEY}"}
    for body, param in (({"prompt": "hi", "max_tokens": "16"}, "max_tokens"),     # a string is not an integer
                        ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
                        ({"prompt": 7}, "prompt"),
                        ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
                        ({"messages": []}, "prompt")):
        r = httpx.post(server[0] + "/v1/completions", json=body, headers=auth)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error", r.text
    r = httpx.post(server[0] + "/v1/chat/completions", json={"messages": [{"role": "user"}]}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_disconnect_cancels_and_frees_kv(server):
    base, loop, _ = server
    before = loop.metrics()["cancelled_total"]
    with httpx.stream("POST", base + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "Once upon a time", "max_tokens": 400, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    for _ in range(100):
        m = loop.metrics()
        if m["cancelled_total"] > before and m["running"] == 0:
            break
        time.sleep(0.1)
    m = loop.metrics()
    assert m["cancelled_total"] > before and m["running"] == 0 and m["kv_used_tokens"] == 0


def test_metrics_and_health(server):
    base = server[0]
    assert httpx.get(base + "/health").json()["status"] == "ok"
    r = httpx.get(base + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    vals = parse_metrics(r.text)
    assert 'pyinfer_scheduler_info{policy="hedge"} 1.0' in r.text
    assert vals["pyinfer_kv_peak_tokens"] <= vals["pyinfer_kv_budget_tokens"] == 1024
    assert "pyinfer_evictions_total" in vals and "pyinfer_waiting" in vals
