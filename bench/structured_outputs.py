"""Issue 54's check of structured outputs and tool calls, through the official `openai` client against a real
`pyinfer serve` (in this process) on a real model:

- json_schema requests over several schemas (nested objects, enums, arrays, bounded numbers, patterns): each answer
  parsed and validated with `jsonschema`, whole and streamed;
- tool-calling requests with two tools (tool_choice auto, required and named): each call's arguments validated
  against its tool's schema, whole and streamed (the deltas added up as the client does);
- the cost of the grammar: its mask per step (ms, from the engine's counters), and decode tok/s with and without a
  schema at batch 1 and batch 16 (the same prompts and lengths).

  python bench/structured_outputs.py -m qwen2.5-coder-0.5b    # -> bench/results/serving/structured_outputs.*
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "serving"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
KEY = "bench"

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z0-9.]{1,20}@[a-z]{1,12}\\.[a-z]{2,3}$"},
        "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 40},
                                                     "city": {"type": "string", "maxLength": 30},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"], "additionalProperties": False}},
        "required": ["name", "age", "email", "address"], "additionalProperties": False},
    "order": {"type": "object", "properties": {
        "order_id": {"type": "integer", "minimum": 1},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "maxLength": 12},
                                             "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                                             "price": {"type": "number", "minimum": 0}},
            "required": ["sku", "quantity", "price"], "additionalProperties": False}}},
        "required": ["order_id", "status", "items"], "additionalProperties": False},
    "review": {"type": "object", "properties": {
        "sentiment": {"enum": ["positive", "neutral", "negative"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "aspects": {"type": "array", "maxItems": 5, "items": {"enum": ["price", "quality", "service", "speed"]}},
        "summary": {"type": "string", "maxLength": 80}},
        "required": ["sentiment", "score", "aspects", "summary"], "additionalProperties": False},
    "recipe": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "servings": {"type": "integer", "minimum": 1, "maximum": 12},
        "vegetarian": {"type": "boolean"},
        "ingredients": {"type": "array", "minItems": 1, "maxItems": 6, "items": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                             "unit": {"enum": ["g", "ml", "piece", "tbsp"]},
                                             "amount": {"type": "number", "minimum": 0}},
            "required": ["name", "unit", "amount"], "additionalProperties": False}}},
        "required": ["title", "servings", "vegetarian", "ingredients"], "additionalProperties": False},
    "event": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
        "attendees": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 20}},
        "location": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
            "room": {"type": "string", "maxLength": 10}, "floor": {"type": "integer", "minimum": 0, "maximum": 50}},
            "required": ["room", "floor"], "additionalProperties": False}]}},
        "required": ["title", "date", "attendees", "location"], "additionalProperties": False},
}
PROMPTS = {
    "person": ["Invent a customer from Lyon.", "Describe a retired teacher.", "Make up a software engineer.",
               "A user who just signed up.", "Describe a person who lives in Berlin."],
    "order": ["An order of two books that shipped.", "A cancelled order of headphones.", "Three groceries, pending.",
              "A delivered order of one laptop.", "Make up an order."],
    "review": ["Review: 'Great food, slow service.'", "Review: 'Cheap and broke in a day.'",
               "Review: 'Fast delivery, as described.'", "Review: 'Meh.'", "Review: 'Best purchase this year!'"],
    "recipe": ["A pancake recipe.", "A vegetarian curry.", "A simple tomato soup.", "Guacamole.", "A chicken salad."],
    "event": ["A team meeting next Monday.", "A birthday party online.", "A conference talk in room B12.",
              "Lunch with two friends.", "A board meeting on floor 9."],
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Search flights between two airports on a date",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["origin", "destination", "date", "passengers"], "additionalProperties": False}}},
]
WEATHER_PROMPTS = ["What's the weather in Tokyo?", "Is it raining in London right now?", "Weather for Paris in F.",
                   "How hot is it in Cairo?", "Temperature in Sydney please.",
                   "Should I take an umbrella in Seattle today?"]
FLIGHT_PROMPTS = ["Find me a flight from JFK to LAX on 2026-12-24 for 2 people.",
                  "Flights SFO to NRT, 2027-01-03, 1 adult.",
                  "I need to fly from CDG to BER on 2026-12-30 with my family of 4.",
                  "Book a search: LHR to DXB, 2027-02-14, 2 passengers."]
TOOL_PROMPTS = [p for pair in zip(WEATHER_PROMPTS, FLIGHT_PROMPTS + FLIGHT_PROMPTS) for p in pair]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--requests", type=int, default=50, help="json_schema and tool requests each (default 50)")
    ap.add_argument("--parallel-requests", type=int, default=20,
                    help="more tool requests with parallel_tool_calls on (reported apart; default 20)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight in the checks (default 8)")
    ap.add_argument("--speed-tokens", type=int, default=48, help="tokens per request in the speed runs")
    ap.add_argument("--only", choices=["all", "checks", "speed"], default="all")
    ap.add_argument("--tag", default="structured_outputs")
    args = ap.parse_args()

    import jsonschema
    import openai

    from pyinfer.model.pull import resolve_model
    from support.serve_helpers import start_server, stop_server

    path = str(resolve_model(args.model))
    base, loop, session, srv, thread = start_server(path, KEY, kv_budget=16384, n_threads=args.threads)
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=600)
    name = Path(path).stem
    out = {"model": name, "file": path, "threads": args.threads}
    try:
        if args.only in ("all", "checks"):
            out["json_schema"] = check_schemas(client, name, args, jsonschema)
            out["tools"] = check_tools(client, name, args, jsonschema)
        if args.only in ("all", "speed"):
            out["speed"] = speed(client, name, loop, args)
    finally:
        stop_server(srv, thread, loop)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS / f"{args.tag}.md").write_text(table(out))
    print(table(out))


def schema_format(schema_name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": schema_name, "schema": SCHEMAS[schema_name],
                                                   "strict": True}}


def stream_text(stream) -> tuple[str, str]:
    parts, finish = [], None
    for ev in stream:
        if ev.choices:
            parts.append(ev.choices[0].delta.content or "")
            finish = ev.choices[0].finish_reason or finish
    return "".join(parts), finish


def check_schemas(client, model, args, jsonschema) -> dict:
    jobs = [(s, PROMPTS[s][i % 5], i) for i in range(args.requests) for s in [list(SCHEMAS)[i % len(SCHEMAS)]]]
    result = {}
    for streamed in (False, True):
        def one(job):
            schema_name, prompt, seed = job
            kw = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=400, temperature=0.7,
                      seed=seed, response_format=schema_format(schema_name))
            if streamed:
                text, finish = stream_text(client.chat.completions.create(stream=True, **kw))
            else:
                r = client.chat.completions.create(**kw)
                text, finish = r.choices[0].message.content, r.choices[0].finish_reason
            try:
                jsonschema.validate(json.loads(text), SCHEMAS[schema_name])
                return True, finish, None
            except Exception as e:  # noqa: BLE001 - counted and shown
                return False, finish, f"{schema_name}: {type(e).__name__}: {str(e)[:120]} in {text[:200]!r}"

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            got = list(pool.map(one, jobs))
        result["streamed" if streamed else "whole"] = {
            "requests": len(jobs), "valid": sum(ok for ok, _, _ in got),
            "finish": {f: sum(1 for _, x, _ in got if x == f) for f in {x for _, x, _ in got}},
            "failures": [e for ok, _, e in got if not ok][:5], "seconds": round(time.perf_counter() - t0, 1)}
    return result


def check_tools(client, model, args, jsonschema) -> dict:
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    choices = ["auto", "required", {"type": "function", "function": {"name": "get_weather"}},
               {"type": "function", "function": {"name": "search_flights"}}]
    jobs = []  # (prompt, tool_choice, seed, parallel_tool_calls): the checked set, then the parallel one
    for i in range(args.requests + args.parallel_requests):
        choice = choices[i % len(choices)]
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        # a named choice gets a prompt that asks for its tool
        pool = WEATHER_PROMPTS if named == "get_weather" else FLIGHT_PROMPTS if named == "search_flights" \
            else TOOL_PROMPTS
        jobs.append((pool[(i // len(choices)) % len(pool)], choice, i, i >= args.requests))
    result = {}
    for streamed in (False, True):
        def one(job):
            prompt, choice, seed, parallel = job
            kw = dict(model=model, messages=[{"role": "user", "content": prompt}], tools=TOOLS, tool_choice=choice,
                      max_tokens=200, temperature=0.7, seed=seed, parallel_tool_calls=parallel)
            if streamed:
                calls, finish, content = {}, None, []
                for ev in client.chat.completions.create(stream=True, **kw):
                    c0 = ev.choices[0]
                    content.append(c0.delta.content or "")
                    for d in c0.delta.tool_calls or []:
                        c = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                        c["id"] = d.id or c["id"]
                        if d.function is not None:
                            c["name"] = d.function.name or c["name"]
                            c["arguments"] += d.function.arguments or ""
                    finish = c0.finish_reason or finish
                got = [(calls[i]["id"], calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
                text = "".join(content)
            else:
                r = client.chat.completions.create(**kw)
                m = r.choices[0].message
                got = [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
                finish, text = r.choices[0].finish_reason, m.content or ""
            try:
                for call_id, name, arguments in got:
                    assert call_id and name in params, f"bad call {call_id!r} {name!r}"
                    jsonschema.validate(json.loads(arguments), params[name])
                if isinstance(choice, dict):
                    assert got and {n for _, n, _ in got} == {choice["function"]["name"]}, "not the named tool"
                if choice == "required":
                    assert got, "no call"
                if got:
                    assert finish == "tool_calls", f"finish {finish}"
                return True, len(got), finish, None
            except Exception as e:  # noqa: BLE001 - counted and shown
                return False, len(got), finish, f"{choice}: {type(e).__name__}: {str(e)[:160]} (text {text[:120]!r})"

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            got = list(pool.map(one, jobs))
        seconds = round(time.perf_counter() - t0, 1)
        for part, rows in (("", [g for g, j in zip(got, jobs) if not j[3]]),
                           ("_parallel", [g for g, j in zip(got, jobs) if j[3]])):
            auto = [g for g, j in zip(got, jobs) if j[1] == "auto" and bool(part) == j[3]]
            result[("streamed" if streamed else "whole") + part] = {
                "requests": len(rows), "well_formed": sum(r[0] for r in rows),
                "with_calls": sum(r[1] > 0 for r in rows), "calls": sum(r[1] for r in rows),
                "cut_by_max_tokens": sum(r[2] == "length" for r in rows),
                "auto_requests": len(auto), "auto_called": sum(r[1] > 0 for r in auto),
                "failures": [r[3] for r in rows if not r[0]][:5], "seconds": seconds}
    return result


def speed(client, model, loop, args) -> dict:
    """Decode tok/s at batch 1 and 16, free and under a schema that cannot end early, and the mask's cost. Each
    request streams; the decode rate counts the tokens that arrive after every request of the batch has its first
    one (prefill excluded), over the time from then to the last."""
    long_schema = {"type": "object", "properties": {"story": {"type": "string", "minLength": 4000}},
                   "required": ["story"]}
    out = {}
    for batch in (1, 16):
        for constrained in (False, True):
            kw = dict(model=model, messages=[{"role": "user", "content": "Tell a long story about a lighthouse."}],
                      max_tokens=args.speed_tokens, temperature=0.8, stream=True)
            if constrained:
                kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": long_schema}}

            def one(seed):
                return [time.perf_counter() for ev in client.chat.completions.create(seed=seed, **kw)
                        if ev.choices and ev.choices[0].delta.content]

            one(999)  # warm: the grammar compiled and cached, the model's pages in memory
            before = dict(loop.stats)
            with ThreadPoolExecutor(batch) as pool:
                arrivals = list(pool.map(one, range(batch)))
            started = max(a[0] for a in arrivals)
            ended = max(a[-1] for a in arrivals)
            decoded = sum(1 for a in arrivals for t in a if t > started)
            steps = loop.stats["grammar_steps_total"] - before["grammar_steps_total"]
            mask_s = loop.stats["grammar_mask_seconds_total"] - before["grammar_mask_seconds_total"]
            out[f"batch{batch}_{'schema' if constrained else 'free'}"] = {
                "tokens": sum(len(a) for a in arrivals), "decode_tokens": decoded,
                "decode_seconds": round(ended - started, 3), "tok_per_s": round(decoded / (ended - started), 2),
                "mask_ms_per_step": round(1000 * mask_s / steps, 3) if steps else None,
                "engine_steps": loop.stats["steps_total"] - before["steps_total"]}
    return out


def table(out: dict) -> str:
    lines = [f"# Structured outputs and tool calls: {out['model']}, {out['threads']} threads", "",
             "Through the official `openai` client against `pyinfer serve` (llguidance grammars)."]
    if "json_schema" in out:
        lines += check_rows(out)
    if "speed" in out:
        sp = out["speed"]
        lines += ["", "Decode (prefill excluded: tokens after every request of the batch has its first):", "",
                  "| decode | tok/s free | tok/s with a schema | ratio | mask ms per step |", "|---|---|---|---|---|"]
        for b in (1, 16):
            f, s = sp[f"batch{b}_free"], sp[f"batch{b}_schema"]
            lines.append(f"| batch {b} | {f['tok_per_s']} | {s['tok_per_s']} | {s['tok_per_s'] / f['tok_per_s']:.3f} | "
                         f"{s['mask_ms_per_step']} |")
    return "\n".join(lines) + "\n"


def check_rows(out: dict) -> list[str]:
    js, tl = out["json_schema"], out["tools"]
    lines = ["", "| check | requests | valid | notes |", "|---|---|---|---|"]
    for k in ("whole", "streamed"):
        r = js[k]
        lines.append(f"| json_schema, {k} | {r['requests']} | {r['valid']} | finish {r['finish']}, {r['seconds']} s |")
    for k in ("whole", "streamed", "whole_parallel", "streamed_parallel"):
        r = tl[k]
        what = "tool calls, parallel_tool_calls on" if k.endswith("parallel") else "tool calls, one call"
        lines.append(f"| {what}, {k.split('_')[0]} | {r['requests']} | {r['well_formed']} | {r['with_calls']} "
                     f"with calls ({r['calls']} calls), {r['cut_by_max_tokens']} cut by max_tokens; auto called in "
                     f"{r['auto_called']} of {r['auto_requests']} |")
    fails = [e for k in ("whole", "streamed") for e in js[k]["failures"]] + \
        [e for k in ("whole", "streamed", "whole_parallel", "streamed_parallel") for e in tl[k]["failures"]]
    if fails:
        lines += ["", "Failures (first few):", ""] + [f"- {e}" for e in fails]
    return lines


if __name__ == "__main__":
    main()
