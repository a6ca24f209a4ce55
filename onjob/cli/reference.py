"""The settings reference (docs/settings.md), generated from the typed settings models so it
cannot drift: `python -m onjob.cli.reference > docs/settings.md` writes it, and a test fails
when the committed file differs from what this prints."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ..engine import EngineSettings
from .settings import ServeSettings

HEADER = """\
# Settings reference

Generated from the settings models by `python -m onjob.cli.reference > docs/settings.md`
(a test fails when this file is stale); do not edit by hand.

`onjob serve`, `judge`, `train`, `loop`, `compare` and the routing commands read one set
of settings. Sources, strongest first: command-line flags, `ONJOB_<SECTION>__<FIELD>`
environment variables (values of dicts and lists as JSON, e.g.
`ONJOB_PROXY__API_KEYS='{"app": "sk-..."}'`), the TOML file (`--config`, `$ONJOB_CONFIG`,
or `./onjob.toml` when present), then the defaults below. Every setting has a working
default. A file or an `ONJOB_<SECTION>__<FIELD>` variable that names a setting not listed
here (a typo, or one since removed) is refused before anything starts, each one named with
the setting it is closest to. Any other `ONJOB_` variable no setting reads is warned about
on stderr once at start, with the spelling it probably meant: one underscore where a
section and its setting take two (`ONJOB_PROXY_PORT`: did you mean `ONJOB_PROXY__PORT`?),
or a name that is no setting at all. `ONJOB_CONFIG`, `ONJOB_CACHE_DIR` and the engine's
`ONJOB_ENGINE_<FLAG>` (below) are read elsewhere.
"""

_BOUNDS = {
    annotated_types.Ge: ">=",
    annotated_types.Gt: ">",
    annotated_types.Le: "<=",
    annotated_types.Lt: "<",
}


def _type(annotation) -> str:
    text = getattr(annotation, "__name__", None) if inspect.isclass(annotation) else None
    text = text or str(annotation).replace("typing.", "")
    for module in ("pathlib.", "pydantic.types.", "onjob.proxy.settings.", "onjob.judge.settings."):
        text = text.replace(module, "")
    return text.replace("NoneType", "None")


def _default(f: FieldInfo) -> str:
    if f.default_factory is not None:
        value = f.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
    elif f.default is PydanticUndefined:
        return "required"
    else:
        value = f.default
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str) and "\n" in value:
        return "(built in: see `onjob/judge/settings.py`)"
    return f"`{value!r}`"


def _about(f: FieldInfo) -> str:
    parts = [f.description or ""]
    bounds = [
        f"{_BOUNDS[type(m)]} {getattr(m, m.__slots__[0])}" for m in f.metadata if type(m) in _BOUNDS
    ]
    if bounds:
        parts.append(f"({', '.join(bounds)})")
    return " ".join(p for p in parts if p).replace("|", "\\|")


def _row(name: str, f: FieldInfo, env: str) -> str:
    kind = _type(f.annotation).replace("|", "\\|")
    return f"| `{name}` | {kind} | {_default(f)} | `{env}` | {_about(f)} |"


def _nested(annotation) -> type[BaseModel] | None:
    """The model in `dict[str, Model]` (e.g. proxy.canaries), documented as its own table."""
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        if inspect.isclass(value) and issubclass(value, BaseModel):
            return value
    return None


def _table(title: str, model: type[BaseModel], env: typing.Callable[[str], str]) -> list[str]:
    lines = [f"## `{title}`", ""]
    if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
        lines += [inspect.cleandoc(model.__doc__), ""]
    lines += ["| setting | type | default | environment | what it does |", "|---|---|---|---|---|"]
    nested = []
    for name, f in model.model_fields.items():
        lines.append(_row(name, f, env(name)))
        if (inner := _nested(f.annotation)) is not None:
            nested.append((f"{title}.{name}.<key>", inner))
    lines.append("")
    for sub_title, inner in nested:
        lines += [f"### `{sub_title}`", ""]
        lines += ["| field | type | default | what it does |", "|---|---|---|---|"]
        for name, f in inner.model_fields.items():
            kind = _type(f.annotation).replace("|", "\\|")
            lines.append(f"| `{name}` | {kind} | {_default(f)} | {_about(f)} |")
        lines.append("")
    return lines


def render() -> str:
    lines = [HEADER]
    for section, f in ServeSettings.model_fields.items():
        lines += _table(
            f"[{section}]", f.annotation, lambda n, s=section: f"ONJOB_{s.upper()}__{n.upper()}"
        )
    lines += [
        "## `onjob engine`",
        "",
        "The engine is its own process with its own settings: flags "
        "(`--max-batch-size`, ...), or `ONJOB_ENGINE_<FIELD>` variables. `onjob serve "
        "--start-engine` passes `[engine] args` to it.",
        "",
    ]
    lines += _table("engine flags", EngineSettings, lambda n: f"ONJOB_ENGINE_{n.upper()}")[2:]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
