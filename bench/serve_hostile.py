"""Each hostile request of the soak's hostile phase, alone, against a fresh `pyinfer serve`, and whether the
server still serves after it: a well-formed completion within 20 s and /health's answer. Run it against any
installed pyinfer (an older one too) to see which request stops which version.

  python bench/serve_hostile.py            # -> bench/results/serving/serve_hostile.{json,md}
  python bench/serve_hostile.py --json --out /tmp/old     # one JSON object; results elsewhere
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_proc import running_server  # noqa: E402
from serve_soak import HOSTILE, KEY, hostile  # noqa: E402

from pyinfer.serve.metrics import parse_metrics  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "serving"


async def probe(base: str, kind: str) -> dict:
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=60) as http:
        model = (await http.get(base + "/v1/models", headers=auth)).json()["data"][0]["id"]
        t0 = time.monotonic()
        try:
            outcome, detail = await asyncio.wait_for(hostile(http, base, model, {"bad": kind, "seed": 1}), 60)
        except Exception as e:  # noqa: BLE001 - what the old servers did is the point
            outcome, detail = "failed", f"{type(e).__name__}: {str(e)[:120]}"
        took = time.monotonic() - t0
        await asyncio.sleep(1.0)
        try:  # an older server that a hostile request stopped may answer nothing: that is the finding
            running = parse_metrics((await http.get(base + "/metrics", timeout=10)).text).get("pyinfer_running")
        except httpx.HTTPError:
            running = None
        try:
            r = await http.post(base + "/v1/completions", headers=auth, timeout=20,
                                json={"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
            after = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            after = type(e).__name__
        try:
            h = await http.get(base + "/health", timeout=10)
            health = f"{h.status_code} {h.json().get('status')}"
        except (httpx.HTTPError, ValueError) as e:
            health = type(e).__name__
        return dict(kind=kind, outcome=outcome, detail=detail[:160], seconds=round(took, 2), running_after_1s=running,
                    next_request=after, health=health)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", nargs="+", default=list(HOSTILE), choices=HOSTILE)
    ap.add_argument("--out", default=str(RESULTS), help="folder for serve_hostile.{json,md}")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args()
    rows = []
    for kind in args.kinds:
        with running_server("--kv-budget", "2048", "-t", "2", "--api-key", KEY) as (base, _):
            rows.append(asyncio.run(probe(base, kind)))
        print(json.dumps(rows[-1]), file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"date": time.strftime("%Y-%m-%d"), "rows": rows,
              "still_serving": sum(r["next_request"] == "HTTP 200" and r["health"].startswith("200") for r in rows)}
    (out / "serve_hostile.json").write_text(json.dumps(result, indent=1))
    lines = ["# pyinfer serve: each hostile request alone, then a well-formed one", "",
             "| request | outcome | detail | s | running 1 s later | next request | /health |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['outcome']} | {r['detail'][:60]} | {r['seconds']} | "
              f"{'-' if r['running_after_1s'] is None else format(r['running_after_1s'], '.0f')} | "
              f"{r['next_request']} | {r['health']} |" for r in rows]
    (out / "serve_hostile.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result) if args.json else "\n".join(lines))
    return 0 if result["still_serving"] == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
