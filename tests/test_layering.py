"""The layout's rule, read from the code's own imports (../shared/design/layout.md): the folders follow the data,
each layer imports only from the layers below it, no two modules import each other (directly or around a
circle), and on the C++ side pybind11 lives only in bindings/ while csrc/ never names cuda/. Every import counts,
those inside functions too: a lazy import is still an arrow."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pyinfer"

# Low to high; a module's rank is that of the longest prefix here that names it. An import may go to an equal
# or lower rank, never to a higher one.
RANKS = {
    "pyinfer.errors": 0, "pyinfer._core": 0, "pyinfer.data": 0,
    "pyinfer.tools.atomic_file": 0, "pyinfer.tools.json_file": 0, "pyinfer.tools.cgroup": 0,
    "pyinfer.tools.sizes": 0,
    "pyinfer.model": 1,                 # reading a file: GGUF (knows no architecture), config, tokenizer, template
    "pyinfer.sparsity.plan": 2,         # the plan file: written offline, read by the graph writers
    "pyinfer.runtime": 3,               # the graph writers: attention, FFN, MoE, hybrid sides
    "pyinfer.model.arch": 4,            # one file per architecture, in terms of the writers
    "pyinfer.runtime.model_graph": 5,   # a model's graph from its architecture
    "pyinfer.runtime.running": 5,       # a graph and its engine (build_running, RunningModel)
    "pyinfer.options": 5,               # LoadOptions: read by the session, the server and the command line
    "pyinfer.sparsity": 6,              # offline: profiles, thresholds, predictors, auto choice
    "pyinfer.train": 6,
    "pyinfer.place": 7,                 # offline: the HiGHS programs, reading profiles
    "pyinfer.offload": 8,               # online weight sources, sized by place's programs
    "pyinfer.session": 9,               # the composition root
    "pyinfer.serve": 10,                # scheduler, batch engine, server (ray_serve over server)
    "pyinfer.api": 11,
    "pyinfer": 12,                      # the package's face: re-exports load() and Model
    "pyinfer.cli": 12, "pyinfer.tools": 12,  # commands (and the tools they run) sit on top of everything
    "pyinfer.place.command": 12, "pyinfer.train.command": 12,
}


def modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the pyinfer modules it imports (a name imported from a package counts as its module where it is
    one, else as the package)."""
    mods = modules()
    known = set(mods) | {"pyinfer._core"}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
                mod = ".".join(x for x in (base, node.module or "") if x)
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
            for t in targets:
                while t and t not in known:
                    t = t.rpartition(".")[0]
                if t.startswith("pyinfer") and t != name:
                    graph[name].add(t)
    return graph


def rank(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANKS:
            return RANKS[".".join(parts[:n])]
    raise AssertionError(f"{module} has no layer in RANKS")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on_stack.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_no_import_runs_back_up():
    up = [f"{a} ({rank(a)}) -> {b} ({rank(b)})" for a, bs in import_graph().items() for b in sorted(bs)
          if rank(b) > rank(a)]
    assert up == []


def test_every_module_has_a_layer():
    for m in modules():
        rank(m)


def test_the_gguf_reader_knows_no_architecture():
    assert not any(b.startswith("pyinfer.model.arch") for b in import_graph()["pyinfer.model.gguf_file"])


def test_csrc_names_neither_pybind11_nor_cuda():
    include = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
    cuda_headers = {p.name for p in (ROOT / "cuda").rglob("*") if p.suffix in (".h", ".cuh")}
    bad = []
    for p in (ROOT / "csrc").rglob("*"):
        if p.suffix not in (".h", ".cpp", ".cc"):
            continue
        for inc in include.findall(p.read_text()):
            if inc.startswith("pybind11") or inc.startswith("cuda") or Path(inc).name in cuda_headers:
                bad.append(f"{p.relative_to(ROOT)}: {inc}")
    assert bad == []
    assert (ROOT / "bindings" / "module.cpp").is_file()


def test_graph_reading_sees_every_kind_of_import(tmp_path):
    """The checker itself: relative, absolute, package and lazy imports are all arrows."""
    g = import_graph()
    assert "pyinfer.runtime.running" in g["pyinfer.session"]            # from .runtime.running import ...
    assert "pyinfer.model.gguf_file" in g["pyinfer.model.arch"]          # from ..gguf_file import ... (a package)
    assert "pyinfer._core" in g["pyinfer.runtime.running"]               # from .. import _core
    assert "pyinfer.serve.ray_serve" in g["pyinfer.cli.serve"]           # inside a function
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
