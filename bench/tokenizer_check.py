"""Token ids of the whole WikiText-2 test file against llama.cpp's (count and sha256 of str(ids), recorded in
../shared/reference). The test suite checks an excerpt kept in the repository; this checks the whole file.

  python bench/tokenizer_check.py            # prints one JSON object; exit 1 on a mismatch
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", default=str(SHARED / "reference" / "llamacpp-smollm2-135m-q4_1.json"))
    ap.add_argument("--text", default=str(SHARED / "data" / "wikitext-2-raw-test.txt"))
    args = ap.parse_args()
    import pyinfer

    ref = json.loads(Path(args.reference).read_text())
    m = pyinfer.load(None, n_ctx=16)
    ids = m.tokenize(Path(args.text).read_text(encoding="utf-8"), add_bos=False)
    got = {"tokens": len(ids), "sha256": hashlib.sha256(str(ids).encode()).hexdigest()}
    ok = got["tokens"] == ref["tokens_wikitext_2_raw_test_no_bos"] and got["sha256"] == ref["tokens_sha256_of_python_list_str"]
    print(json.dumps({"match": ok, **got}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
