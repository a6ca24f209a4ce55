"""The settings reference is generated from the settings models; a stale copy fails here."""

from pathlib import Path

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
