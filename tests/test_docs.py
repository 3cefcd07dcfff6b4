"""The README and docs/ hold together: every relative link, image and anchor resolves, every
file path they name exists, and every file under docs/ is linked from a page."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
# Pages that describe the code as it is now (a changelog may name files since removed).
CURRENT = [p for p in PAGES if p.name != "CHANGELOG.md"]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# A path in backticks: a file with an extension, or a folder, under one of these roots.
CODE_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]*\.(?:py|sh|md|json|png|txt|toml|c|cpp|h)|(?:[\w.-]+/)+)`")
# Where a path written in the docs may start: the repository, the package, its native sources.
PATH_ROOTS = [ROOT, ROOT / "mlx_lm_batched", ROOT / "mlx_lm_batched" / "native"]


def prose(text):
    """The page without its fenced code blocks (their contents are code, not links)."""
    return FENCE.sub("", text)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor a page defines (repeated headings get -1, -2, ... as on GitHub)."""
    seen, out = {}, set()
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    """``(target, anchor)`` of every relative link and image of a page."""
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check
            continue
        file, _, anchor = target.partition("#")
        yield file, anchor


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for file, anchor in links(page):
        target = (page.parent / file).resolve() if file else page
        if not target.exists():
            broken.append(f"{file} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{file}#{anchor} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: " + ", ".join(broken)


@pytest.mark.parametrize("page", CURRENT, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_files_exist(page):
    text = prose(page.read_text(encoding="utf-8"))
    missing = [p for p in CODE_PATH.findall(text)
               if not any((base / p).exists() for base in PATH_ROOTS)]
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"


def test_every_docs_file_is_linked():
    linked = set()
    for page in PAGES:
        for file, _ in links(page):
            if file:
                linked.add((page.parent / file).resolve())
    files = [p for p in DOCS.rglob("*") if p.is_file()]
    unlinked = [str(p.relative_to(ROOT)) for p in files if p.resolve() not in linked]
    assert not unlinked, f"files under docs/ that no page links to: {unlinked}"


def test_anchor_slugs_follow_github():
    # The rule the anchors above are checked with, on headings of these pages.
    assert slug("`max_tokens` and `offset`, from the server to the model") == \
        "max_tokens-and-offset-from-the-server-to-the-model"
    assert slug("Intel Xeon, MKL (2026-12-04)") == "intel-xeon-mkl-2026-12-04"
    assert slug("Drop-in for mlx-lm code: what differs") == "drop-in-for-mlx-lm-code-what-differs"


def test_release_version_is_written_alike():
    # The version lives in mlx_lm_batched/_version.py; the CHANGELOG's newest section and the
    # README name the same one, and every CHANGELOG section is a dated version.
    version = re.search(r'^__version__ = "([^"]+)"',
                        (ROOT / "mlx_lm_batched" / "_version.py").read_text(encoding="utf-8"), re.M).group(1)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = [s for s in re.findall(r"^## (.+)$", changelog, re.M) if s != "[Unreleased]"]
    assert sections and all(re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", s) for s in sections), sections
    assert sections[0].startswith(f"[{version}] - "), (sections[0], version)
    assert f"Version {version} ([CHANGELOG](CHANGELOG.md))" in (ROOT / "README.md").read_text(encoding="utf-8")
