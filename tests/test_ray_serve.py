"""`pyinfer serve --replicas 2` on a local Ray: 2 replicas of 1 thread each behind one endpoint, driven through
the official OpenAI client. 64 concurrent requests all complete and both replicas serve a share; /metrics sums
the replicas and parses with prometheus_client; a client that hangs up frees its request on its replica; a
replica killed mid-run costs its non-streamed requests only time (retried on the other) and ends its streams
with a clear error, and nothing hangs. Skips without Ray (pip install 'pyinfer[ray]')."""
import asyncio
import time

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")

import httpx  # noqa: E402
from support import serve_helpers  # noqa: E402

KEY = "ray-key"


@pytest.fixture(scope="module")
def endpoint(real_model_path):
    from pyinfer.options import LoadOptions
    from pyinfer.serve import ray_serve

    port = serve_helpers.free_port()
    options = dict(model_path=real_model_path, kv_budget=1024, api_key=KEY, options=LoadOptions(n_threads=1))
    ray_serve.start(options, replicas=2, threads=1, host="127.0.0.1", port=port, max_concurrent=32,
                    max_body_bytes=1 << 20, app_name="pyinfer-test")
    base = f"http://127.0.0.1:{port}"
    wait_for_replicas(base, 2)
    yield base
    ray_serve.stop("pyinfer-test")


def metrics(base) -> dict:
    """{(sample name, replica or None): value}, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(base + "/metrics", timeout=10)
    assert r.status_code == 200
    return {(s.name, s.labels.get("replica")): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def per_replica(m: dict, name: str) -> dict:
    return {rep: v for (n, rep), v in m.items() if n == name and rep is not None}


def wait_for_replicas(base, n, timeout=120.0, gone=None):
    """Until n replicas report (and `gone`, if given, is not among them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = metrics(base)
            if m[("pyinfer_replicas", None)] >= n and gone not in per_replica(m, "pyinfer_replica_running"):
                return
        except (httpx.HTTPError, KeyError, AssertionError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{n} replicas did not report within {timeout:.0f} s")


def client(base):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)


async def one(c, i: int, max_tokens: int = 16):
    """('ok', text) or ('error', message) for request i: odd ones stream a chat, even ones a whole completion."""
    from openai import APIError

    try:
        if i % 2:
            parts = []
            stream = await c.chat.completions.create(
                model=None, messages=[{"role": "user", "content": f"Tell me fact number {i} about the sea."}],
                max_tokens=max_tokens, temperature=0, stream=True)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return "ok", "".join(parts)
        r = await c.completions.create(model=None, prompt=f"Story {i}: once upon a time", max_tokens=max_tokens,
                                       temperature=0)
        return "ok", r.choices[0].text
    except APIError as e:
        return "error", str(e)


def test_64_concurrent_requests_complete_and_both_replicas_serve(endpoint):
    before = per_replica(metrics(endpoint), "pyinfer_replica_requests_total")

    async def main():
        c = client(endpoint)
        return await asyncio.wait_for(asyncio.gather(*(one(c, i) for i in range(64))), 180)

    results = asyncio.run(main())
    assert [kind for kind, _ in results] == ["ok"] * 64, [r for r in results if r[0] != "ok"][:3]
    assert all(text for _, text in results)
    deadline = time.monotonic() + 10  # the replicas report every 0.5 s
    while True:
        m = metrics(endpoint)
        served = {rep: v - before.get(rep, 0) for rep, v in per_replica(m, "pyinfer_replica_requests_total").items()}
        if sum(served.values()) == 64 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sum(served.values()) == 64, served
    assert len(served) == 2 and all(v >= 8 for v in served.values()), served  # each a real share of the 64
    # The plain server's names carry the sums of the per-replica series.
    for name in ("requests_total", "kv_budget_tokens", "tokens_generated_total"):
        assert m[("pyinfer_" + name, None)] == sum(per_replica(m, "pyinfer_replica_" + name).values()), name
    assert m[("pyinfer_kv_budget_tokens", None)] == 2 * 1024


def test_the_front_serves_the_page_health_and_refusals(endpoint):
    assert httpx.get(endpoint + "/health").json() == {"status": "ok", "replicas": 2}
    r = httpx.get(endpoint + "/")
    assert r.status_code == 200 and "pyinfer chat" in r.text
    r = httpx.post(endpoint + "/v1/completions", json={"prompt": "x", "seed": -1},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    r = httpx.post(endpoint + "/v1/completions", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 401
    r = httpx.post(endpoint + "/v1/completions", content=b"x" * (2 << 20), headers={"Authorization": f"Bearer {KEY}"},
                   timeout=30)
    assert r.status_code == 413
    r = httpx.post(endpoint + "/v1/completions", content=b"x" * (2 << 20), timeout=30)
    assert r.status_code == 401  # the key before the body, as the plain server


def test_a_client_that_hangs_up_frees_its_request_on_its_replica(endpoint):
    cancelled = metrics(endpoint)[("pyinfer_cancelled_total", None)]
    body = {"prompt": "Count to one thousand:", "max_tokens": 500, "temperature": 0, "stream": True}
    with httpx.stream("POST", endpoint + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["x-pyinfer-replica"]
        for n, _ in enumerate(r.iter_lines()):
            if n >= 6:
                break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = metrics(endpoint)
        if m[("pyinfer_running", None)] == 0 and m[("pyinfer_cancelled_total", None)] > cancelled:
            return
        time.sleep(0.2)
    raise AssertionError(f"the request ran on after its client left: {m}")


def test_a_killed_replica_costs_time_or_a_clear_error_and_nothing_hangs(endpoint):
    import ray

    async def main():
        c = client(endpoint)
        tasks = [asyncio.ensure_future(one(c, i, max_tokens=150)) for i in range(16)]
        victim = None
        for _ in range(100):  # kill a replica that is busy with some of them
            await asyncio.sleep(0.1)
            running = per_replica(await asyncio.to_thread(metrics, endpoint), "pyinfer_replica_running")
            busy = [rep for rep, v in running.items() if v >= 2]
            if busy:
                victim = busy[0]
                break
        assert victim, "no replica was busy"
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith("SERVE_REPLICA::") and a["name"].endswith(victim)]
        assert names, victim
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        return victim, await asyncio.wait_for(asyncio.gather(*tasks), 180)  # none may hang

    victim, results = asyncio.run(main())
    whole = [r for i, r in enumerate(results) if i % 2 == 0]
    streamed = [r for i, r in enumerate(results) if i % 2 == 1]
    assert all(kind == "ok" and text for kind, text in whole), whole  # retried on the other replica
    lost = [text for kind, text in streamed if kind == "error"]
    assert all("was lost mid-reply" in text for text in lost), lost
    print(f"\nkilled replica {victim}: {len(whole)} whole requests all answered, {len(streamed) - len(lost)} streams "
          f"complete, {len(lost)} ended with replica_lost")
    requests = metrics(endpoint)[("pyinfer_requests_total", None)]
    wait_for_replicas(endpoint, 2, gone=victim)  # Ray started a new one
    assert metrics(endpoint)[("pyinfer_requests_total", None)] >= requests  # the victim's count is kept
