"""The server's settings: one typed object composed of each package's settings.

Sources, strongest first: command-line flags, `ONJOB_<SECTION>__<FIELD>` variables
(e.g. `ONJOB_PROXY__PORT=9000`), the TOML file (`--config`, `$ONJOB_CONFIG`, or
`./onjob.toml` when present), then the defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ..collector import CollectorSettings
from ..judge import JudgeSettings
from ..proxy import ProxySettings
from ..trainer import TrainSettings
from .telemetry import TelemetrySettings

DEFAULT_CONFIG = Path("onjob.toml")


class LoopSettings(BaseModel):
    """resample -> judge -> train -> canary -> compare -> decide, inside `onjob serve`."""

    interval_s: float = Field(300.0, ge=0, description="how often the loop runs (0: never)")
    alias: str = Field("agent", description="the alias the loop trains and canaries")
    train: bool = Field(True, description="false: the loop only re-samples and judges")
    min_new_groups: int = Field(4, ge=1, description="trainable groups that start a run")
    canary_fraction: float = Field(0.1, gt=0, le=1, description="a new checkpoint's share")
    pairs_per_round: int = Field(8, ge=1, description="paired re-samples per canary round")
    min_pairs: int = Field(10, ge=1, description="judged pairs before any decision")
    max_pairs: int = Field(200, ge=1, description="undecided by then: roll back, keep live")
    sprt_delta: float = Field(0.1, gt=0, lt=0.5, description="win rate 0.5 +/- delta")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="chance of promoting a worse one")
    beta: float = Field(0.05, gt=0, lt=0.5, description="chance of rolling back a better one")
    max_error_increase: float = Field(0.05, ge=0, description="canary error rate over live's")
    max_latency_ratio: float = Field(1.5, gt=1, description="canary median latency / live's")
    min_guard_requests: int = Field(20, ge=1, description="requests per arm before guards")


class ChildEngine(BaseModel):
    start: bool = Field(False, description="start `onjob engine` on engine_url's port")
    args: list[str] = Field(
        default_factory=list, description='more `onjob engine` flags, e.g. ["--threads", "1"]'
    )


class ServeSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ONJOB_",
        env_nested_delimiter="__",
        extra="ignore",
        nested_model_default_partial_update=True,
    )
    _toml: ClassVar[Path | None] = None

    proxy: ProxySettings = Field(default_factory=ProxySettings)
    collector: CollectorSettings = Field(default_factory=CollectorSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    trainer: TrainSettings = Field(default_factory=TrainSettings)
    loop: LoopSettings = Field(default_factory=LoopSettings)
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
        try:
            return cls(**overrides)
        finally:
            cls._toml = None
