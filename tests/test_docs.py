"""The settings reference is generated from the settings models; a stale copy fails here.
The documentation site builds from docs/ without a warning, and the README's links land."""

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from onjob.cli import reference

ROOT = Path(__file__).resolve().parents[1]


def test_settings_reference_is_current():
    committed = (ROOT / "docs" / "settings.md").read_text()
    assert committed == reference.render(), (
        "docs/settings.md is stale: run `make docs` (python -m onjob.cli.reference > "
        "docs/settings.md)"
    )


def test_settings_reference_names_every_section_and_field():
    text = reference.render()
    from onjob.cli.settings import ServeSettings

    for section, f in ServeSettings.model_fields.items():
        assert f"## `[{section}]`" in text
        for name in f.annotation.model_fields:
            assert f"`ONJOB_{section.upper()}__{name.upper()}`" in text


def test_the_docs_site_builds_in_strict_mode_with_every_page(tmp_path):
    """`make docs-site`: MkDocs Material with --strict, so a broken link or anchor, a page
    left out of the nav or a nav entry without its page fails here."""
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's end-of-life banner
    )
    assert run.returncode == 0, run.stderr
    assert "WARNING" not in run.stderr, run.stderr
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = set(_pages(nav))
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}
    for page in listed:
        built = site / ("" if page == "index.md" else page.removesuffix(".md")) / "index.html"
        assert built.exists(), page


def test_the_readme_links_only_to_pages_that_exist():
    """The README sits outside the site: its links are checked here."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert targets
    for target in targets:
        assert (ROOT / target).exists(), target


def _pages(nav) -> list[str]:
    """The files a MkDocs nav names, however deeply its sections nest."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _pages(v)]
    return [p for item in nav for p in _pages(item)]
