"""Token ids of the whole WikiText-2 test file against llama.cpp's. The test suite checks an excerpt kept in the
repository; this checks the whole file. Prints one JSON object; exit 1 on a mismatch.

  python bench/tokenizer_check.py
      SmolLM2 against the count and sha256 of str(ids) recorded in ../shared/reference
  python bench/tokenizer_check.py --model M.gguf
      pyinfer and llama.cpp (llama-cpp-python, vocab_only) side by side on the whole file and on EDGE_CASES
  python bench/tokenizer_check.py --model M.gguf --write-reference tests/data/llamacpp_gemma3_ids.json
      the same, and writes llama.cpp's ids for the excerpt and EDGE_CASES (special off and on) for the test suite
  python bench/tokenizer_check.py --vendor DIR
      llama.cpp's own tokenizer tests: every ggml-vocab-*.gguf in DIR (vendor/llama.cpp/models of the
      llama-cpp-python 0.3.36 sdist) with its .inp/.out cases, case for case; writes
      bench/results/robustness/tokenizer_vendor.{json,md}
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
EXCERPT = Path(__file__).resolve().parents[1] / "tests" / "data" / "wikitext-2-raw-test.excerpt.txt"
EDGE_CASES = [
    "", " ", "  ", "   leading", "repeated   spaces", "trailing ", "\n", "\n\n", "a\nb", "\t", "tab\there",
    "12345", "3.14159", "2026-11-30", "$100,000.00", "日本語のテキスト", "中文", "🙂", "👨\u200d👩\u200d👧", "🙂" * 5,
    "Héllo wörld", "e\u0301", "ﬁ ǅ Å Å", "\x00", "\x07", "\r\n", "\r", "line\r\nline",
    "<start_of_turn>user\nhi<end_of_turn>", "<bos>", "<eos>", "<unk>", "</s>", "</s>x</s>", "<unused0>",
    "<start_of_turn>  x", " <end_of_turn> ", "\n<bos>\n", "<<start_of_turn>>", "<start_of_image>",
    "<table><tr><td>1</td></tr></table>", "<0x41>", "▁", "▁▁a",
    "\ue000", "\U000e0001", "\U0010fffd", "𠀀𪚥", "\u200b\u200d\ufeff", "\xa0nbsp", "a\u3000b",
    "Supercalifragilisticexpialidociousxyzzyqwv", "x" * 300, "\n" * 40, " " * 70, "\t" * 33 + "x", "a  \n\n\t b",
    "Hello мир مرحبا שלום नमस्ते こんにちは 안녕하세요", "'s 've n't", "C++ && || -> => :: ...",
    "https://example.com/a?b=c&d=e#f",
]


def _digest(ids: list[int]) -> dict:
    return {"tokens": len(ids), "sha256": hashlib.sha256(str(ids).encode()).hexdigest()}


def check_default_model(args) -> int:
    import pyinfer

    ref = json.loads(Path(args.reference).read_text())
    m = pyinfer.load(None, n_ctx=16)
    got = _digest(m.tokenize(Path(args.text).read_text(encoding="utf-8"), add_bos=False))
    ok = got["tokens"] == ref["tokens_wikitext_2_raw_test_no_bos"] and got["sha256"] == ref["tokens_sha256_of_python_list_str"]
    print(json.dumps({"match": ok, **got}))
    return 0 if ok else 1


def compare_with_llamacpp(args) -> int:
    """pyinfer's tokenizer (from the file's metadata alone, so any architecture works) next to llama.cpp's."""
    import llama_cpp

    from pyinfer.model.arch import open_model
    from pyinfer.model.tokenizer import Tokenizer

    t0 = time.perf_counter()
    metadata = open_model(args.model).metadata
    t1 = time.perf_counter()
    ours = Tokenizer(metadata)
    t2 = time.perf_counter()
    theirs = llama_cpp.Llama(args.model, vocab_only=True, verbose=False)

    def llamacpp_ids(text: str, special: bool = False) -> list[int]:
        return theirs.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    text = Path(args.text).read_text(encoding="utf-8")
    t3 = time.perf_counter()
    got = _digest(ours.encode(text, add_bos=False))
    t4 = time.perf_counter()
    want = _digest(llamacpp_ids(text))
    differing = [repr(c) + (" special" if special else "") for c in EDGE_CASES for special in (False, True)
                 if ours.encode(c, add_bos=False, special=special) != llamacpp_ids(c, special)]
    ok = got == want and not differing
    print(json.dumps({"model": Path(args.model).name, "match": ok, "pyinfer": got, "llamacpp": want,
                      "edge_cases": len(EDGE_CASES) * 2, "edge_cases_differing": differing,
                      "metadata_s": round(t1 - t0, 2), "build_s": round(t2 - t1, 2),
                      "encode_s": round(t4 - t3, 2)}))
    if args.write_reference:
        write_reference(Path(args.write_reference), _describe(Path(args.model)), llamacpp_ids)
    return 0 if ok else 1


def _describe(model: Path) -> str:
    digest = hashlib.sha256()
    with open(model, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"{model.name} (sha256 {digest.hexdigest()})"


def write_reference(path: Path, model_name: str, llamacpp_ids) -> None:
    import llama_cpp

    ids = llamacpp_ids(EXCERPT.read_text(encoding="utf-8"))
    ref = {
        "source": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (vocab_only), {model_name}, "
                  "tokenize(add_bos=False); edge_cases with special=False, edge_cases_special with special=True",
        "excerpt_tokens": len(ids),
        "excerpt_sha256": hashlib.sha256(str(ids).encode()).hexdigest(),
        "edge_cases": {c: llamacpp_ids(c) for c in EDGE_CASES},
        "edge_cases_special": {c: llamacpp_ids(c, True) for c in EDGE_CASES},
    }
    path.write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")


VOCAB_TEST_SEP = "\n__ggml_vocab_test__\n"


def vendor_cases(vocab: Path) -> list[tuple[str, list[int]]]:
    """The (text, llama.cpp ids) cases of a vocab file, split as llama.cpp's test-tokenizer-0 splits them."""
    raw = Path(str(vocab) + ".inp").read_text(encoding="utf-8")
    texts = raw.split(VOCAB_TEST_SEP)
    outs = Path(str(vocab) + ".out").read_text(encoding="utf-8").split("\n")
    outs = outs[:len(texts)]
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


def run_vendor_case_file(vocab: Path) -> dict:
    """pyinfer's tokenizer (add_bos off, special off: as test-tokenizer-0 calls llama.cpp) on each case."""
    from pyinfer.errors import PyinferError
    from pyinfer.model.arch import open_model
    from pyinfer.model.tokenizer import Tokenizer

    cases = vendor_cases(vocab)
    meta = open_model(vocab).metadata
    row = {"vocab": vocab.name.removeprefix("ggml-vocab-").removesuffix(".gguf"),
           "model": meta.get("tokenizer.ggml.model"), "pre": meta.get("tokenizer.ggml.pre"), "cases": len(cases)}
    try:
        tok = Tokenizer(meta)
    except PyinferError as e:
        return {**row, "passed": 0, "refused": str(e)}
    failed = [t for t, want in cases if tok.encode(t, add_bos=False) != want]
    return {**row, "passed": len(cases) - len(failed), "failed": [repr(t)[:80] for t in failed]}


def check_vendor(args) -> int:
    rows = [run_vendor_case_file(v) for v in sorted(Path(args.vendor).glob("ggml-vocab-*.gguf"))
            if Path(str(v) + ".inp").exists()]
    for r in rows:
        print(json.dumps(r))
    out = Path(__file__).parent / "results" / "robustness"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer_vendor.json").write_text(json.dumps(rows, indent=1) + "\n")
    md = ["# llama.cpp's tokenizer tests (vendor/llama.cpp/models, llama-cpp-python 0.3.36)", "",
          "Each vocabulary's `.inp` cases tokenized by pyinfer (no BOS, special tokens as text, as "
          "test-tokenizer-0 calls llama.cpp) against llama.cpp's ids in `.out`.", "",
          "| vocabulary | model | pre-tokenizer | passed | failing cases |", "|---|---|---|---|---|"]
    for r in rows:
        bad = r.get("refused") or ", ".join(r.get("failed", [])) or ""
        md.append(f"| {r['vocab']} | {r['model']} | {r['pre']} | {r['passed']} / {r['cases']} | {bad[:200]} |")
    (out / "tokenizer_vendor.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r["passed"] == r["cases"] for r in rows) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", default=str(SHARED / "reference" / "llamacpp-smollm2-135m-q4_1.json"))
    ap.add_argument("--text", default=str(SHARED / "data" / "wikitext-2-raw-test.txt"))
    ap.add_argument("--model", help="a GGUF file: compare against llama.cpp itself instead of the recorded reference")
    ap.add_argument("--vendor", metavar="DIR", help="run llama.cpp's own tokenizer tests from DIR")
    ap.add_argument("--write-reference", metavar="JSON",
                    help="with --model: write llama.cpp's excerpt and edge-case ids")
    args = ap.parse_args()
    if args.write_reference and not args.model:
        ap.error("--write-reference needs --model")
    if args.vendor:
        return check_vendor(args)
    return compare_with_llamacpp(args) if args.model else check_default_model(args)


if __name__ == "__main__":
    sys.exit(main())
