"""The server soak at CI size (bench/serve_soak.py runs 1,000 requests): a real `pyinfer serve` process, 100
mixed requests at concurrency 64 through the official client, hang-ups, malformed and hostile requests among them."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def test_soak_100_requests(real_model_path):
    from serve_soak import passed, run

    r = run(100, 64, seed=0, threads=2, kv_budget=4096)
    assert r["failed"] == 0, r["failures"]
    assert r["malformed_4xx"] == r["malformed"] > 0, r["malformed_other"]
    assert r["hostile"] > 0 and not r["hostile_outcomes"].get("failed"), r["hostile_failed"]
    assert r["kv_used_after_drain"] == 0 and r["running_after_drain"] == 0 and r["waiting_after_drain"] == 0
    assert passed(r)
