"""A seeded mutation fuzzer for GGUF files: where each header field lies, mutations that target them, and a
worker that loads a mutant and runs one token. Used by tests/test_fuzz_gguf.py (a CI subset) and
bench/fuzz_gguf.py (the full run). Every case must end "ok" (loaded, ran a token) or "error" (a one-line
PyinferError); anything else is a finding."""
from __future__ import annotations

import os
import random
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

# GGUF value types: struct format of the scalars; 8 = string, 9 = array.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
KINDS = ("bitflip", "truncate", "huge_count", "huge_length", "bad_offset", "unknown_type", "overlap", "shape",
         "metadata_value", "nan_norm", "bad_utf8")
# Structural mutations: a metadata entry re-encoded (another type, another shape of value) or added, the header
# rewritten around it and the tensor data moved to its new aligned start.
STRUCTURAL_KINDS = ("template_type", "template_bomb", "duplicate_vocab", "all_control", "huge_array", "vocab_types",
                    "special_ids")
ALL_KINDS = KINDS + STRUCTURAL_KINDS
HUGE = (2 ** 63 - 1, 2 ** 64 - 1, 2 ** 40, 2 ** 32 + 1, 2 ** 31)


@dataclass
class Field:
    key: str
    type_off: int             # the u32 value type
    value_off: int            # the value (for strings: its u64 length; for arrays: the u32 item type)
    vtype: int
    item_type: int = -1       # arrays
    count_off: int = -1       # arrays: the u64 count
    items_off: int = -1
    string_offs: list[int] = field(default_factory=list)  # u64 length of each string (strings and string arrays, capped)


@dataclass
class TensorInfo:
    name: str
    ndims_off: int
    dims_off: int
    ndims: int
    type_off: int
    offset_off: int
    offset: int
    ggml_type: int
    dims: list[int]


@dataclass
class Layout:
    size: int
    fields: list[Field]
    tensors: list[TensorInfo]
    info_end: int              # end of the tensor directory
    data_start: int
    boundaries: list[int]      # ends of sections: magic, version, counts, each KV, each tensor info, padding
    alignment: int = 32


def parse_layout(data: bytes) -> Layout:
    """Where every field of a well-formed GGUF v3 file lies."""
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return v

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n]
        pos += n
        return s.decode("utf-8", "replace")

    assert data[:4] == b"GGUF"
    pos = 4
    bounds = [4]
    take("I")
    bounds.append(pos)
    n_tensors, n_kv = take("Q"), take("Q")
    bounds.append(pos)
    fields, alignment = [], 32
    for _ in range(n_kv):
        key = string()
        type_off = pos
        vt = take("I")
        f = Field(key, type_off, pos, vt)
        if vt == STRING:
            f.string_offs.append(pos)
            string()
        elif vt == ARRAY:
            f.item_type = take("I")
            f.count_off = pos
            count = take("Q")
            f.items_off = pos
            for i in range(count):
                if f.item_type == STRING:
                    if i < 64:
                        f.string_offs.append(pos)
                    pos += 8 + struct.unpack_from("<Q", data, pos)[0]
                else:
                    pos += struct.calcsize("<" + SCALARS[f.item_type])
        else:
            v = take(SCALARS[vt])
            if key == "general.alignment":
                alignment = int(v)
        fields.append(f)
        bounds.append(pos)
    tensors = []
    for _ in range(n_tensors):
        name = string()
        ndims_off = pos
        nd = take("I")
        dims_off = pos
        dims = [take("Q") for _ in range(nd)]
        type_off = pos
        gt = take("I")
        offset_off = pos
        off = take("Q")
        tensors.append(TensorInfo(name, ndims_off, dims_off, nd, type_off, offset_off, off, gt, dims))
        bounds.append(pos)
    info_end = pos
    data_start = (pos + alignment - 1) // alignment * alignment
    bounds.append(data_start)
    return Layout(len(data), fields, tensors, info_end, data_start, bounds, alignment)


@dataclass
class Mutation:
    """What to do to the file: writes (offset, bytes) and an optional truncation."""
    kind: str
    what: str
    writes: list[tuple[int, bytes]] = field(default_factory=list)
    truncate: int | None = None
    rewrite: tuple[list[bytes], int] | None = None   # structural: the new metadata entries and their count


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v % 2 ** 64)


def _u32(v: int) -> bytes:
    return struct.pack("<I", v % 2 ** 32)


def mutate(layout: Layout, data_at, rng: random.Random, kind: str, tensor_data: bool) -> Mutation:
    """A mutation of `kind`. data_at(off, n) reads the original bytes. `tensor_data`: mutations may reach
    into tensor data (small files); otherwise they stay in the header (the real model)."""
    L = layout
    if kind in STRUCTURAL_KINDS:
        what, entries, n_kv = structural(L, data_at, rng, kind)
        return Mutation(kind, what, rewrite=(entries, n_kv))
    if kind == "bitflip":
        end = L.size if tensor_data else L.data_start
        writes = []
        for _ in range(rng.randint(1, 8)):
            off = rng.randrange(end)
            writes.append((off, bytes([data_at(off, 1)[0] ^ (1 << rng.randrange(8))])))
        return Mutation(kind, f"{len(writes)} bits", writes)
    if kind == "truncate":
        cuts = list(L.boundaries) + [b - 1 for b in L.boundaries if b > 1]
        if tensor_data:
            cuts += [L.data_start + (L.size - L.data_start) // 2, L.size - 1]
        cut = rng.choice(cuts)
        return Mutation(kind, f"at byte {cut}", truncate=cut)
    if kind == "huge_count":
        off = rng.choice([8, 16])  # n_tensors, n_kv
        return Mutation(kind, f"{'n_tensors' if off == 8 else 'n_kv'}", [(off, _u64(rng.choice(HUGE)))])
    if kind == "huge_length":
        cands = [(f.count_off, f.key + " count") for f in L.fields if f.count_off >= 0]
        cands += [(o, f.key + " string") for f in L.fields for o in f.string_offs[:4]]
        off, what = rng.choice(cands)
        return Mutation(kind, what, [(off, _u64(rng.choice(HUGE + (L.size,))))])
    if kind == "bad_offset":
        t = rng.choice(L.tensors)
        v = rng.choice([2 ** 63, L.size, L.size - L.data_start, t.offset + 1, t.offset + 4, 2 ** 64 - 32])
        return Mutation(kind, f"{t.name} offset {v}", [(t.offset_off, _u64(v))])
    if kind == "unknown_type":
        if rng.random() < 0.6:
            t = rng.choice(L.tensors)
            v = rng.choice([4, 5, 12, 14, 39, 250, 2 ** 31, 2 ** 32 - 1])
            return Mutation(kind, f"{t.name} type {v}", [(t.type_off, _u32(v))])
        f = rng.choice(L.fields)
        v = rng.choice([13, 99, 2 ** 31])
        return Mutation(kind, f"{f.key} value type {v}", [(f.type_off, _u32(v))])
    if kind == "overlap":
        a, b = rng.sample(L.tensors, 2)
        return Mutation(kind, f"{a.name} over {b.name}", [(a.offset_off, _u64(b.offset))])
    if kind == "shape":
        t = rng.choice(L.tensors)
        if rng.random() < 0.3:
            v = rng.choice([0, 3, 5, 2 ** 31])
            return Mutation(kind, f"{t.name} n_dims {v}", [(t.ndims_off, _u32(v))])
        i = rng.randrange(t.ndims)
        v = rng.choice([0, 1, t.dims[i] - 1, t.dims[i] + 32, t.dims[i] * 2, 2 ** 32, 2 ** 62])
        return Mutation(kind, f"{t.name} dim {i} = {v}", [(t.dims_off + 8 * i, _u64(v))])
    if kind == "metadata_value":
        nums = [f for f in L.fields if f.vtype in SCALARS and f.vtype != 7]
        f = rng.choice(nums)
        fmt = SCALARS[f.vtype]
        n = struct.calcsize("<" + fmt)
        if fmt in "fd":
            v = struct.pack("<" + fmt, rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30]))
        else:
            v = rng.choice([0, 2 ** (8 * n) - 1, 2 ** (8 * n - 1), 1, 3]).to_bytes(n, "little")
        return Mutation(kind, f"{f.key} = {v.hex()}", [(f.value_off, v)])
    if kind == "nan_norm":
        norms = [t for t in L.tensors if t.name.endswith("norm.weight") and t.ggml_type == 0]
        t = rng.choice(norms)
        off = L.data_start + t.offset + 4 * rng.randrange(max(1, t.dims[0]))
        return Mutation(kind, f"{t.name}", [(off, struct.pack("<f", rng.choice([float("nan"), float("inf")])))])
    if kind == "bad_utf8":
        offs = [o for f in L.fields for o in f.string_offs]
        off = rng.choice(offs)
        n = struct.unpack("<Q", data_at(off, 8))[0]
        if n == 0:
            return Mutation(kind, "empty string", [(off, _u64(1))])
        return Mutation(kind, "invalid utf-8", [(off + 8 + rng.randrange(n), bytes([rng.choice([0xC3, 0xFF, 0x80])]))])
    raise ValueError(kind)


def _kv(key: str, vtype: int, value, item_type: int = -1) -> bytes:
    """One metadata entry as GGUF v3 writes it."""
    def scalar(t, v):
        return struct.pack("<" + SCALARS[t], v)

    def string(v: str | bytes) -> bytes:
        b = v.encode() if isinstance(v, str) else v
        return _u64(len(b)) + b

    out = string(key) + _u32(vtype)
    if vtype == STRING:
        return out + string(value)
    if vtype == ARRAY:
        body = b"".join(string(v) if item_type == STRING else scalar(item_type, v) for v in value)
        return out + _u32(item_type) + _u64(len(value)) + body
    return out + scalar(vtype, value)


# Templates a hostile file might carry: each must end in a one-line error or a bounded render, never a hang or
# an exhausted machine.
HOSTILE_TEMPLATES = (
    "{{ 'a' * 10**9 }}", "{{ ['x'] * 10**9 }}", "{{ 9 ** 99999999 }}",
    "{% for i in range(10**5) %}{% for j in range(10**5) %}{{ j.real }}{% endfor %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(99) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
    "{{ raise_exception('no') }}", "{{ messages[99]['content'] }}", "{{ undefined_thing.attr.more }}",
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}<|im_start|>assistant\n",
    "{{ ''.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{{", "{% for %}", "\x00\xff",
)


def structural(layout: Layout, data_at, rng: random.Random, kind: str) -> tuple[str, list[bytes], int]:
    """(what, the new metadata entries in order, the new n_kv) for a structural mutation of `kind`."""
    L = layout
    by_key = {f.key: i for i, f in enumerate(L.fields)}
    entries = [data_at(L.boundaries[2 + i], L.boundaries[3 + i] - L.boundaries[2 + i]) for i in range(len(L.fields))]

    def put(key: str, blob: bytes) -> None:
        if key in by_key:
            entries[by_key[key]] = blob
        else:
            entries.append(blob)

    def array_items(key: str) -> list:
        f = L.fields[by_key[key]]
        count = struct.unpack("<Q", data_at(f.count_off, 8))[0]
        if f.item_type == STRING:
            out, pos = [], f.items_off
            for _ in range(count):
                n = struct.unpack("<Q", data_at(pos, 8))[0]
                out.append(data_at(pos + 8, n))
                pos += 8 + n
            return out
        size = struct.calcsize("<" + SCALARS[f.item_type])
        raw = data_at(f.items_off, size * count)
        return list(struct.unpack("<%d%s" % (count, SCALARS[f.item_type]), raw))

    tmpl = "tokenizer.chat_template"
    if kind == "template_type":
        choice = rng.randrange(4)
        blob = [_kv(tmpl, 4, 7), _kv(tmpl, ARRAY, ["{{ 1 }}", "x"], STRING), _kv(tmpl, ARRAY, [1, 2, 3], 5),
                _kv(tmpl, 7, True)][choice]
        put(tmpl, blob)
        return f"chat template as type #{choice}", entries, len(entries)
    if kind == "template_bomb":
        t = rng.choice(HOSTILE_TEMPLATES)
        put(tmpl, _kv(tmpl, STRING, t))
        return f"template {t[:40]!r}", entries, len(entries)
    tokens_key, types_key = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"
    if kind == "duplicate_vocab":
        toks = array_items(tokens_key)
        n = rng.choice([1, 2, len(toks) // 3])
        for _ in range(n):
            i, j = rng.randrange(len(toks)), rng.randrange(len(toks))
            toks[i] = toks[j]
        put(tokens_key, _kv(tokens_key, ARRAY, toks, STRING))
        return f"{n} duplicated tokens", entries, len(entries)
    if kind == "all_control":
        n = len(array_items(tokens_key))
        put(types_key, _kv(types_key, ARRAY, [rng.choice([3, 3, 4, 6])] * n, 5))
        return "every token of one special type", entries, len(entries)
    if kind == "huge_array":
        n = rng.choice([1 << 18, 1 << 21, 3 << 20])
        put("junk.unused_array", _kv("junk.unused_array", ARRAY, [0.5] * n, 6))
        return f"an unused array of {n} floats", entries, len(entries)
    if kind == "vocab_types":
        n = len(array_items(tokens_key))
        choice = rng.randrange(4)
        if choice == 0:
            put(tokens_key, _kv(tokens_key, ARRAY, list(range(n)), 4))
        elif choice == 1:
            put(types_key, _kv(types_key, ARRAY, ["1"] * n, STRING))
        elif choice == 2:
            put(types_key, _kv(types_key, ARRAY, [1] * (n // 2), 5))
        else:
            put("tokenizer.ggml.merges", _kv("tokenizer.ggml.merges", ARRAY, [b"a", b"zz zz zz", b""], STRING))
        return f"vocabulary arrays of the wrong type or length #{choice}", entries, len(entries)
    if kind == "special_ids":
        key = rng.choice(["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"])
        blob = rng.choice([_kv(key, 4, 2 ** 31), _kv(key, STRING, "1"), _kv(key, 5, -1), _kv(key, 6, 1.5)])
        put(key, blob)
        return f"{key} of another type or out of range", entries, len(entries)
    raise ValueError(kind)


def rewrite_header(layout: Layout, data_at, entries: list[bytes], n_kv: int, out: Path, size: int) -> None:
    """The file (of `size` bytes) with these metadata entries: same tensor directory, tensor data at the new
    aligned start."""
    L = layout
    head = data_at(0, 16) + _u64(n_kv)
    infos = data_at(L.boundaries[2 + len(L.fields)], L.info_end - L.boundaries[2 + len(L.fields)])
    header = head + b"".join(entries) + infos
    pad = (-len(header)) % L.alignment
    with open(out, "wb") as f:
        f.write(header + b"\0" * pad)
        pos, end = L.data_start, size
        while pos < end:
            chunk = data_at(pos, min(8 << 20, end - pos))
            f.write(chunk)
            pos += len(chunk)


class MutantFile:
    """One working copy of a GGUF file, mutated in place and restored after each case (a 100 MB model is
    copied once, not per case). Truncations write a new, short file."""

    def __init__(self, source: Path, workdir: Path):
        self.source = Path(source)
        self.work = Path(workdir) / ("mutant-" + self.source.name)
        self.short = Path(workdir) / ("short-" + self.source.name)
        shutil.copyfile(self.source, self.work)
        self._orig = open(self.source, "rb")
        self.layout = parse_layout(self._read_header())

    def _read_header(self) -> bytes:
        # Enough to parse the directory of any file we fuzz (metadata of a 262k vocabulary is ~6 MB).
        self._orig.seek(0)
        return self._orig.read(min(os.path.getsize(self.source), 64 << 20))

    def data_at(self, off: int, n: int) -> bytes:
        self._orig.seek(off)
        return self._orig.read(n)

    def apply(self, m: Mutation) -> Path:
        if m.rewrite is not None:
            rewrite_header(self.layout, self.data_at, *m.rewrite, self.short, os.path.getsize(self.source))
            return self.short
        if m.truncate is not None:
            self._orig.seek(0)
            self.short.write_bytes(self._orig.read(m.truncate))
            return self.short
        with open(self.work, "r+b") as f:
            for off, b in m.writes:
                f.seek(off)
                f.write(b)
        return self.work

    def restore(self, m: Mutation) -> None:
        if m.truncate is not None or m.rewrite is not None:
            self.short.unlink(missing_ok=True)
            return
        with open(self.work, "r+b") as f:
            for off, b in m.writes:
                f.seek(off)
                f.write(self.data_at(off, len(b)))


def run_case(path: Path) -> tuple[str, str]:
    """(outcome, detail): "ok" when the file loads, runs one token, renders and runs a chat (typed control tokens
    in it), tokenizes with special tokens and answers the server's chat and completion requests; "error" for a
    one-line PyinferError (or, from the server, an OpenAI-shaped 4xx, or a 500 that names its cause);
    "multiline" / "exception" / "memory" otherwise. A file that loads goes through the server whatever its chat
    did locally, so a template that fails there fails on the server's path too."""
    import pyinfer

    def guarded(fn) -> tuple[str, str]:
        try:
            fn()
            return "ok", ""
        except pyinfer.PyinferError as e:
            msg = str(e)
            return ("error" if msg and "\n" not in msg else "multiline"), msg[:300]
        except MemoryError as e:
            return "memory", repr(e)[:300]
        except Exception as e:  # noqa: BLE001 - a finding: report it
            return "exception", f"{type(e).__name__}: {str(e)[:300]}"

    def load_and_run():
        m = pyinfer.load(str(path), n_threads=1, n_ctx=32, progress=False)
        m.generate("Hi", max_tokens=1, temperature=0)

    def chat():
        m = pyinfer.load(str(path), n_threads=1, n_ctx=256, progress=False)  # room for a chat prompt
        m.tokenize("<|im_start|>user\n<s>hi</s><start_of_turn>", special=True)
        m.chat([{"role": "user", "content": "Hi <|im_end|><end_of_turn></s>"}], max_tokens=1, temperature=0)

    loaded = guarded(load_and_run)
    if loaded[0] != "ok":
        return loaded
    results = [guarded(chat), serve_case(path)]
    rank = {"ok": 0, "error": 1}
    return max(results, key=lambda r: rank.get(r[0], 2))


def serve_case(path: Path) -> tuple[str, str]:
    """The server's request path on this file: a chat and a completion through the ASGI app, in process."""
    import asyncio

    import httpx

    import pyinfer
    from pyinfer.serve.server import build_server

    try:
        app, loop, _ = build_server(str(path), kv_budget=256, n_threads=1)
    except pyinfer.PyinferError as e:
        return "error", str(e)[:300]
    loop.start()
    bodies = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi <|im_end|>"}], "max_tokens": 2}),
              ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0.7, "seed": 1})]

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fuzz") as c:
            return [await c.post(url, json=b, timeout=60) for url, b in bodies]

    try:
        replies = asyncio.run(go())
    except Exception as e:  # noqa: BLE001 - a finding: report it
        return "exception", f"server: {type(e).__name__}: {str(e)[:300]}"
    finally:
        loop.stop()
    outcome, detail = "ok", ""
    for r in replies:
        try:
            err = r.json().get("error") if r.status_code != 200 else None
        except ValueError:
            return "exception", f"server: HTTP {r.status_code} without a JSON body"
        if r.status_code == 200:
            continue
        if not isinstance(err, dict) or not isinstance(err.get("message"), str):
            return "exception", f"server: HTTP {r.status_code} without an OpenAI-shaped error"
        if err["message"].startswith("internal error"):  # the catch-all handler: an exception nothing named
            return "exception", f"server: {err['message']}"
        outcome, detail = "error", f"server: HTTP {r.status_code}: {err['message'][:200]}"
    return outcome, detail


# ---- driving the cases: worker processes, so a crash or a hang costs one case, not the run -----------------

@dataclass
class Case:
    index: int
    target: str   # "tiny" or "real"
    kind: str
    seed: int


# The tiny models of every architecture the loader knows besides the plain llama ("tiny"): each reads its own
# keys (expert counts, LongRoPE factors, sliding windows, QK-norms), so each is mutated in turn.
ARCH_TARGETS = ("qwen3moe", "mixtral", "qwen2moe", "phi3", "qwen3", "qwen2", "llama3", "gemma3")


def write_targets(tmp: Path, names=("tiny",)) -> dict[str, str]:
    """{target: path} of the tiny models named ("tiny": write_tiny_llama's; else an ARCH_TARGETS name)."""
    from .tiny_model import write_tiny_arch, write_tiny_gemma3, write_tiny_llama

    out = {}
    for name in names:
        path = Path(tmp) / f"{name}.gguf"
        out[name] = str(write_tiny_llama(path) if name == "tiny" else write_tiny_gemma3(path) if name == "gemma3"
                        else write_tiny_arch(path, name))
    return out


def make_cases(n: int, seed: int, real_share: float, have_real: bool, tiny=("tiny",)) -> list[Case]:
    """n cases: each on the real model's header (share `real_share`) or on a tiny model, the `tiny` targets in
    turn, and each kind in turn on every target (the default, one target, draws what the 10,000-case run
    drew)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        target = "real" if have_real and rng.random() < real_share else tiny[i % len(tiny)]
        out.append(Case(i, target, ALL_KINDS[i // len(tiny) % len(ALL_KINDS)], rng.randrange(2 ** 31)))
    return out


def worker_main(sources: dict[str, str], workdir: str) -> None:
    """Reads cases as JSON lines on stdin, writes one JSON result line per case on stdout."""
    import json
    import resource
    import sys

    # An unbounded allocation becomes a MemoryError (a finding), not a machine out of memory.
    limit = int(os.environ.get("PYINFER_FUZZ_MEMORY", 8 << 30))  # 0: no limit (ASan reserves terabytes of shadow)
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    files = {name: MutantFile(Path(p), Path(workdir)) for name, p in sources.items()}
    out = sys.stdout
    sys.stdout = sys.stderr  # progress bars and prints of the library never reach the protocol
    for line in sys.stdin:
        c = json.loads(line)
        mf = files[c["target"]]
        rng = random.Random(c["seed"])
        try:
            m = mutate(mf.layout, mf.data_at, rng, c["kind"], tensor_data=c["target"] == "tiny")
        except (IndexError, ValueError):  # e.g. no float norm to poison in this file: an unmutated case
            m = Mutation(c["kind"], "not applicable")
        path = mf.apply(m)
        try:
            outcome, detail = run_case(path)
        finally:
            mf.restore(m)
        out.write(json.dumps({"index": c["index"], "outcome": outcome, "detail": detail, "what": m.what}) + "\n")
        out.flush()


class Fuzzer:
    """Runs cases on `workers` worker processes; a worker that dies or runs past `timeout` seconds on a case
    reports that case as "crash" or "hang" and is replaced."""

    def __init__(self, sources: dict[str, str], workdir: Path, workers: int = 2, timeout: float = 60.0):
        self.sources, self.workdir, self.n, self.timeout = sources, Path(workdir), workers, timeout

    def _spawn(self, k: int):
        import json
        import subprocess
        import sys

        wd = self.workdir / f"w{k}"
        wd.mkdir(parents=True, exist_ok=True)
        code = ("import json, sys; sys.path.insert(0, %r); from support import gguf_fuzz; "
                "gguf_fuzz.worker_main(json.loads(sys.argv[1]), sys.argv[2])" % str(Path(__file__).parents[1]))
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        return subprocess.Popen([sys.executable, "-c", code, json.dumps(self.sources), str(wd)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, bufsize=1, env=env, cwd=wd)  # not the source tree: it has no _core

    def run(self, cases: list[Case], progress=None) -> list[dict]:
        import json
        import selectors
        import time

        results: list[dict] = []
        pending = list(reversed(cases))
        procs = {k: self._spawn(k) for k in range(self.n)}
        busy: dict[int, tuple[Case, float]] = {}
        sel = selectors.DefaultSelector()
        for k, p in procs.items():
            sel.register(p.stdout, selectors.EVENT_READ, k)

        def give(k):
            if pending:
                c = pending.pop()
                procs[k].stdin.write(json.dumps(c.__dict__) + "\n")
                procs[k].stdin.flush()
                busy[k] = (c, time.monotonic())

        def replace(k, outcome, detail):
            c, _ = busy.pop(k)
            results.append({"index": c.index, "target": c.target, "kind": c.kind, "outcome": outcome,
                            "detail": detail, "what": ""})
            sel.unregister(procs[k].stdout)
            procs[k].kill()
            procs[k].wait()
            procs[k] = self._spawn(k)
            sel.register(procs[k].stdout, selectors.EVENT_READ, k)
            if progress:
                progress(results[-1])
            give(k)

        for k in procs:
            give(k)
        while busy:
            for key, _ in sel.select(timeout=1.0):
                k = key.data
                line = procs[k].stdout.readline()
                if not line:  # the worker died
                    rc = procs[k].wait()
                    replace(k, "crash", f"worker exited with {rc}")
                    continue
                r = json.loads(line)
                c, _ = busy.pop(k)
                r.update(target=c.target, kind=c.kind)
                results.append(r)
                if progress:
                    progress(r)
                give(k)
            now = time.monotonic()
            for k, (c, t0) in list(busy.items()):
                if now - t0 > self.timeout:
                    replace(k, "hang", f"no result after {self.timeout:.0f} s")
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=30)
        return sorted(results, key=lambda r: r["index"])


def summarize(results: list[dict]) -> dict:
    by_kind: dict[str, dict[str, int]] = {}
    for r in results:
        d = by_kind.setdefault(r["kind"], {})
        d[r["outcome"]] = d.get(r["outcome"], 0) + 1
    totals: dict[str, int] = {}
    for r in results:
        totals[r["outcome"]] = totals.get(r["outcome"], 0) + 1
    return {"cases": len(results), "outcomes": totals, "by_kind": by_kind,
            "findings": [r for r in results if r["outcome"] not in ("ok", "error")]}
