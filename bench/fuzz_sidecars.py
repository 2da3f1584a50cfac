"""Structural fuzzing of pyinfer's own .npz sidecar files, the sparsity plan and the activation profile (the
GGUF fuzzer, fuzz_gguf.py, covers model files). A mutant replaces one JSON header value with one of another
type or range, drops an array, changes an array's dtype or shape, or poisons one value; then a plan is loaded
with the tiny model and generates three tokens, a profile goes through `pyinfer train-predictors`. Each must
run or fail with a one-line PyinferError; a traceback is a finding (a crash ends the run).

  python bench/fuzz_sidecars.py --cases 2000         # -> bench/results/robustness/fuzz_sidecars.{json,md}
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.tiny_model import write_tiny_llama  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "robustness"
WEIRD = [None, -1, 0, 1, 2 ** 31, 2 ** 63, 1e308, float("nan"), "x", [], {}, [1, 2], True, -0.5, "relu", "gate"]
DTYPES = [np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.bool_]


def read(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as z:
        return json.loads(bytes(z["header"]).decode()), {k: z[k] for k in z.files if k != "header"}


def mutate(header: dict, arrays: dict, rng: random.Random) -> tuple[str, bytes]:
    """(what was changed, the mutant's bytes)."""
    h, a = json.loads(json.dumps(header)), dict(arrays)
    kind = rng.randrange(6)
    if kind == 0:
        k, v = rng.choice(list(h)), rng.choice(WEIRD)
        h[k], what = v, f"header {k} = {v!r}"
    elif kind == 1 and any(isinstance(v, list) and v for v in h.values()):
        k = rng.choice([k for k, v in h.items() if isinstance(v, list) and v])
        i, v = rng.randrange(len(h[k])), rng.choice(WEIRD)
        h[k][i], what = v, f"header {k}[{i}] = {v!r}"
    elif kind == 2:
        k = rng.choice(list(a))
        del a[k]
        what = f"{k} dropped"
    elif kind == 3:
        k, dt = rng.choice(list(a)), rng.choice(DTYPES)
        a[k], what = a[k].astype(dt), f"{k} as {np.dtype(dt)}"
    elif kind == 4:
        k = rng.choice(list(a))
        x, op = a[k], rng.randrange(4)
        shaped = [x.reshape(-1), x[:-1] if x.ndim else x, np.concatenate([x, x[:1]]) if x.ndim and len(x) else x,
                  x.T.copy()]
        a[k], what = shaped[op], f"{k} {['flattened', 'cut', 'grown', 'transposed'][op]}"
    else:
        k = rng.choice(list(a))
        x = a[k].copy()
        if x.size:
            i = rng.randrange(x.size)
            x.flat[i] = (rng.choice([np.nan, np.inf, -1e30]) if x.dtype.kind == "f" else
                         rng.choice([np.iinfo(x.dtype).max, np.iinfo(x.dtype).min]) if x.dtype.kind in "iu" else 0)
        a[k], what = x, f"{k} value poisoned"
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(json.dumps(h).encode(), np.uint8), **a)
    return what, buf.getvalue()


def run_plan(model: Path, path: Path) -> tuple[str, str]:
    import pyinfer

    try:
        m = pyinfer.load(str(model), n_threads=1, n_ctx=32, sparsity=str(path), progress=False)
        m.generate("Hi there", max_tokens=3, temperature=0)
        return "ok", ""
    except pyinfer.PyinferError as e:
        return ("error" if "\n" not in str(e) else "multiline"), str(e)[:300]
    except Exception as e:  # noqa: BLE001 - a finding: report it
        return "exception", f"{type(e).__name__}: {str(e)[:300]}"


def run_profile(model: Path, path: Path, out: Path) -> tuple[str, str]:
    from pyinfer.cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["train-predictors", "-m", str(model), "--profile", str(path), "-o", str(out), "-t", "1",
                       "--tokens", "300"])
    except SystemExit as e:
        rc = e.code
    except Exception as e:  # noqa: BLE001
        return "exception", f"{type(e).__name__}: {str(e)[:300]}"
    last = err.getvalue().strip().splitlines()[-1:] or [""]
    if rc == 0:
        return "ok", ""
    return ("error" if last[0].startswith("pyinfer: error:") and "Traceback" not in err.getvalue()
            else "exception"), last[0][:300]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000, help="cases per file kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results/robustness/fuzz_sidecars.*")
    args = ap.parse_args()
    from tqdm import tqdm

    from pyinfer.cli import main as cli

    summary: dict = {"seed": args.seed, "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = write_tiny_llama(tmp / "tiny.gguf")
        prof, plan = tmp / "profile.npz", tmp / "plan.npz"
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            assert cli(["profile", "-m", str(model), "-o", str(prof), "-t", "1", "--tokens", "512"]) == 0
            assert cli(["train-predictors", "-m", str(model), "--profile", str(prof), "-o", str(plan), "-t", "1",
                        "--tokens", "1024"]) == 0
        assert run_plan(model, plan)[0] == "ok" and run_profile(model, prof, tmp / "o.npz")[0] == "ok"
        for kind, source in (("plan", plan), ("profile", prof)):
            header, arrays = read(source)
            rng, outcomes, findings = random.Random(f"{args.seed}:{kind}"), {}, []
            t0 = time.time()
            for _ in tqdm(range(args.cases), desc=kind, unit="case", file=sys.stderr):
                what, data = mutate(header, arrays, rng)
                mutant = tmp / f"mutant-{kind}.npz"
                mutant.write_bytes(data)
                outcome, detail = run_plan(model, mutant) if kind == "plan" else run_profile(model, mutant,
                                                                                            tmp / "o.npz")
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if outcome not in ("ok", "error"):
                    findings.append({"what": what, "outcome": outcome, "detail": detail})
            summary["files"][kind] = {"cases": args.cases, "outcomes": outcomes, "findings": findings,
                                      "seconds": round(time.time() - t0, 1)}
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "fuzz_sidecars.json").write_text(json.dumps(summary, indent=1))
        lines = [f"# Sidecar fuzzing (seed {args.seed}): `python bench/fuzz_sidecars.py --cases {args.cases}`", "",
                 "| file | cases | ok | one-line error | findings | seconds |", "|---|---|---|---|---|---|"]
        for kind, s in summary["files"].items():
            o = s["outcomes"]
            lines.append(f"| {kind} | {s['cases']} | {o.get('ok', 0)} | {o.get('error', 0)} | {len(s['findings'])} "
                         f"| {s['seconds']} |")
        (RESULTS / "fuzz_sidecars.md").write_text("\n".join(lines) + "\n")
    for kind, s in summary["files"].items():
        print(f"{kind}: {s['cases']} cases, {s['outcomes']}")
        for f in s["findings"][:20]:
            print(f"  {f['outcome']:<10} {f['what']}: {f['detail']}")
    return 1 if any(s["findings"] for s in summary["files"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
