"""The README stays what a newcomer reads first, and the documentation's links lead somewhere."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "results" / "README.md"]


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_doc_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md" and f"docs/{p.name}" not in readme] == []
