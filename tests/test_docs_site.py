"""The user manual builds as a MkDocs site without a warning, lists every page in its nav, and the README's
links into it resolve."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

DOCS = ROOT / "docs"


def _nav_pages(nav) -> list[str]:
    """Every page path of a mkdocs nav (a list of pages, {title: page} and {title: [sections]})."""
    pages: list[str] = []
    for item in nav:
        if isinstance(item, str):
            pages.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return [p for p in pages if not re.match(r"[a-z][a-z0-9+.-]*://", p)]  # external links are not pages


def _config() -> dict:
    # mkdocs.yml may hold !ENV or !relative tags in future; none today, so safe_load reads it whole
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (it is in the dev extra: make install)")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "guide" / "index.html").is_file()


def test_every_docs_page_is_in_the_nav():
    config = _config()
    assert config["docs_dir"] == "docs" and config["site_name"] == "privzo"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"
    for page in nav:
        assert (DOCS / page).is_file(), f"mkdocs.yml's nav names {page}, which is not a file under docs/"
    excluded = str(config.get("not_in_nav") or "").split()
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if p not in nav and p not in excluded]
    assert not missing, f"pages under docs/ in neither mkdocs.yml's nav nor not_in_nav: {missing}"


def test_the_site_dir_is_ignored_by_git():
    site_dir = _config().get("site_dir", "site").strip("/")
    ignored = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    assert f"{site_dir}/" in ignored or site_dir in ignored or f"/{site_dir}/" in ignored, site_dir


def test_the_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    assert relative, "the README links into the manual"
    for target in relative:
        path = target.split("#", 1)[0]
        assert (ROOT / path).exists(), f"README.md links to {target}, which does not exist"
    assert any(t.startswith("docs/guide/") for t in relative)


def test_the_readme_stays_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 8 * 1024, len(text.encode())
    # the two set-up commands, as .ci/run and the Makefile name them
    assert "make run     # installs, then trains DPZero" in text
    assert "make test    # installs, then runs the test suite" in text
