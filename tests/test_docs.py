"""The documentation site (``docs/``, Sphinx with MyST): it builds with warnings as errors, and
the Python examples of every page (and the README's) run, each page's blocks in order in one
fresh process, as a reader would paste them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def examples(page: Path) -> str:
    """The page's Python blocks, joined in their order."""
    return "\n".join(_BLOCK.findall(page.read_text()))


PAGES = [p for p in sorted([*DOCS.glob("*.md"), REPO / "README.md"]) if examples(p)]


@pytest.mark.timeout(300)
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    html = tmp_path / "html"
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, html],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (html / "api.html").read_text().count("hpccollect.SyncDataCollector") > 0


def test_every_page_with_examples_is_found() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "getting-started.md", "datasets.md", "distributed.md"} <= names


@pytest.mark.timeout(180)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_examples_of_a_page_run(page: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", examples(page)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, f"{page.name}:\n{proc.stderr[-4000:]}"
