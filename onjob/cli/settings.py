"""The server's settings: one typed object composed of each package's settings.

Sources, strongest first: command-line flags, `ONJOB_<SECTION>__<FIELD>` variables
(e.g. `ONJOB_PROXY__PORT=9000`), the TOML file (`--config`, `$ONJOB_CONFIG`, or
`./onjob.toml` when present), then the defaults.
"""

from __future__ import annotations

import difflib
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ..deploy.settings import DeploySettings
from ..errors import OnjobError
from .telemetry import TelemetrySettings

DEFAULT_CONFIG = Path("onjob.toml")

_ENV_PREFIX = "ONJOB_"
# `ONJOB_` variables other readers take: the settings file's path, where models are cached
# (`bundled.py`); and the engine's own, `ONJOB_ENGINE_<FLAG>` (`engine/settings.py`).
OTHER_READERS = frozenset({"ONJOB_CONFIG", "ONJOB_CACHE_DIR"})
_ENGINE_FLAGS = "ENGINE_"
# Set for `--workers`' processes, so the primary alone warns (`environment_warnings`).
WARNED = "_ONJOB_ENVIRONMENT_WARNED"

# Settings that existed once: a file still setting one is told what became of it.
REMOVED = {
    "proxy.upstream_client": "the proxy has one engine client now; delete the line",
}


class SettingsError(OnjobError, ValueError):
    """The settings file names a setting onjob does not have."""


class ChildEngine(BaseModel):
    model_config = ConfigDict(frozen=True)

    start: bool = Field(False, description="start `onjob engine` on engine_url's port")
    args: list[str] = Field(
        default_factory=list, description='more `onjob engine` flags, e.g. ["--threads", "1"]'
    )
    restarts: int = Field(
        5,
        ge=0,
        description="a child that dies is started again, at most this many times within "
        "restart_window_s; one more death and `onjob serve` exits 1",
    )
    restart_window_s: float = Field(600.0, gt=0, description="see restarts")


class ServeSettings(DeploySettings, BaseSettings):
    """Every section, composed once: deploy's (proxy, collector, judge, trainer, loop)
    plus the process-level ones (telemetry, the child engine)."""

    model_config = SettingsConfigDict(
        frozen=True,
        env_prefix=_ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        nested_model_default_partial_update=True,
    )
    _toml: ClassVar[Path | None] = None

    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    engine: ChildEngine = Field(default_factory=ChildEngine)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources = [init_settings, env_settings]
        if cls._toml is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls._toml))
        return tuple(sources)

    @classmethod
    def load(cls, config: Path | str | None = None, **overrides: Any) -> ServeSettings:
        """Read the TOML file (if any) and the environment; `overrides` (nested dicts) win."""
        path = config or os.environ.get("ONJOB_CONFIG")
        if path is None and DEFAULT_CONFIG.exists():
            path = DEFAULT_CONFIG
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        cls._toml = Path(path) if path else None
        if cls._toml is not None:
            _check_keys(cls, cls._toml)
            # The reward functions it names live beside it (`my_rewards.py`), wherever onjob
            # runs from: their modules import from its directory (`judge/rewards.py`).
            beside = str(cls._toml.resolve().parent)
            if beside not in sys.path:
                sys.path.insert(0, beside)
        _check_environment(cls, os.environ)
        try:
            return cls(**overrides)
        finally:
            cls._toml = None


def _check_keys(cls: type[BaseModel], path: Path) -> None:
    """Refuse a file that names a setting onjob lacks (a typo, or one since removed):
    pydantic would ignore it, and the server would run without what the file asks."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not TOML: {exc}") from None
    problems = [f"{path}: {problem}" for problem in _unknown(cls, data, "")]
    if problems:
        raise SettingsError("\n".join(problems))


def _check_environment(cls: type[BaseModel], environ: Mapping[str, str]) -> None:
    """Refuse an `ONJOB_SECTION__SETTING` variable that names no setting, as a file's typo
    is refused. Only the nested form is read: `ONJOB_CONFIG`, `ONJOB_CACHE_DIR` and the
    engine's `ONJOB_ENGINE_<FLAG>` are other readers' variables."""
    problems = []
    for var in sorted(environ):
        if not var.startswith(_ENV_PREFIX) or "__" not in var:
            continue
        nested: dict = {}
        *sections, last = var.removeprefix(_ENV_PREFIX).lower().split("__")
        at = nested
        for section in sections:
            at = at.setdefault(section, {})
        at[last] = environ[var]
        problems += [f"environment variable {var}: {p}" for p in _unknown(cls, nested, "")]
    if problems:
        raise SettingsError("\n".join(problems))


def environment_warnings(cls: type[BaseModel], environ: Mapping[str, str]) -> list[str]:
    """The `ONJOB_` variables no setting reads, each with the one it probably meant: a
    section and its setting joined by one underscore where the settings nest with two
    (`ONJOB_PROXY_PORT` for `ONJOB_PROXY__PORT`), or a name that is no setting at all.
    pydantic ignores both, and the server would run without what they ask. Warned, not
    refused as `_check_environment` refuses a nested typo: other readers share the prefix
    (`OTHER_READERS`, the engine's flags, a test's own knobs)."""
    from ..engine import EngineSettings

    said = []
    for var in sorted(environ):
        if not var.startswith(_ENV_PREFIX) or "__" in var or var in OTHER_READERS:
            continue
        name = var.removeprefix(_ENV_PREFIX)
        flag = name.removeprefix(_ENGINE_FLAGS).lower()
        if name.startswith(_ENGINE_FLAGS) and flag in EngineSettings.model_fields:
            continue  # `onjob engine`'s, and a started engine child's
        path = _nested(cls, name.lower().split("_"))
        if path is not None and len(path) == 1:
            continue  # a whole section as JSON: read
        if path is not None:
            meant = _ENV_PREFIX + "__".join(path).upper()
            said.append(
                f"environment variable {var} is not read: a section and its setting are "
                f"joined by two underscores (did you mean {meant}?)"
            )
            continue
        close = difflib.get_close_matches(var, list(_variables(cls, _ENV_PREFIX)), 1, 0.8)
        hint = f"did you mean {close[0]}?" if close else "settings are ONJOB_<SECTION>__<SETTING>"
        said.append(f"environment variable {var} is not read: it names no setting ({hint})")
    return said


def _nested(model: type[BaseModel], words: list[str]) -> list[str] | None:
    """The setting these words (a name split at each `_`) spell when some of the `_` are
    read as `__`: its path of field names, or None."""
    names = _names(model)
    if "_".join(words) in names:
        return ["_".join(words)]
    for i in range(1, len(words)):
        field = names.get("_".join(words[:i]))
        if field is not None and _is_model(field.annotation):
            rest = _nested(field.annotation, words[i:])
            if rest is not None:
                return ["_".join(words[:i]), *rest]
    return None


def _variables(model: type[BaseModel], prefix: str):
    """Every setting's variable, `ONJOB_PROXY__PORT` and the like."""
    for name, field in model.model_fields.items():
        if _is_model(field.annotation):
            yield from _variables(field.annotation, f"{prefix}{name.upper()}__")
        else:
            yield f"{prefix}{name.upper()}"


def _unknown(model: type[BaseModel], data: dict, prefix: str):
    names = _names(model)
    for key, value in data.items():
        name = f"{prefix}{key}"
        field = names.get(key)
        if field is None:
            if name in REMOVED:
                yield f"`{name}` was removed: {REMOVED[name]}"
                continue
            close = difflib.get_close_matches(key, list(model.model_fields), n=1)
            hint = f" (did you mean `{prefix}{close[0]}`?)" if close else ""
            yield f"`{name}` is not a setting{hint}"
        elif isinstance(value, dict) and _is_model(field.annotation):
            yield from _unknown(field.annotation, value, f"{name}.")


def _names(model: type[BaseModel]) -> Mapping[str, FieldInfo]:
    """Each field by its name and by every alias it is read under (an old name kept)."""
    out: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        out[name] = field
        for alias in (field.alias, field.validation_alias):
            choices = getattr(alias, "choices", [alias])
            out |= {c: field for c in choices if isinstance(c, str)}
    return out


def _is_model(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
