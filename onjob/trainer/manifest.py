"""A training run's manifest: `onjob-manifest.json` beside the adapter, what it was trained
from and how it went. Torch-free: the server reads it back and records it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

FILE = "onjob-manifest.json"


class Step(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One optimizer step the run applied, as its history and its progress line show it
    (the figures per loss token). All but the first three are optional: older files
    recorded fewer."""

    step: int  # 1, 2, ...
    epoch: int
    loss: float
    grad_norm: float | None = None
    lr: float | None = None
    clip_fraction: float | None = None  # of loss tokens whose ratio was clipped
    ratio_mean: float | None = None  # policy / sampler
    kl: float | None = None  # to the base model, k3
    reward_mean: float | None = None  # of the step's groups' members
    tokens: int | None = None
    tokens_per_s: float | None = None


class Dropped(msgspec.Struct, kw_only=True):
    """A step not applied: its loss or its gradient's norm is not finite."""

    epoch: int
    groups: list[str]
    loss: float
    grad_norm: float


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """The run, keyed as the file has always been: checkpoints written by older versions
    load as they are. `config` is the `TrainSettings` dump with what the server adds
    (`started_by`), not `TrainSettings` itself: an old file may name a setting since
    removed, which the settings refuse. `metrics` stays a dict: some 25 keys, grown run
    by run (and absent from older files); the ones read across packages are properties."""

    name: str
    parent: str | None = None  # the adapter directory continued from
    base_model: str
    snapshot_sha256: str
    config_sha256: str
    config: dict[str, Any]
    groups: list[str]  # trained on
    skipped_groups: dict[str, str] = {}  # group id -> why (absent before the check existed)
    precision: dict[str, Any] = {}  # dtypes, attention, and the engine's `sampler`
    metrics: dict[str, Any]
    history: list[Step]  # one record per optimizer step applied
    created: float  # Unix time

    @property
    def steps(self) -> int:
        return self.metrics["steps"]

    @property
    def duration_s(self) -> float:
        return self.metrics["duration_s"]

    @classmethod
    def read(cls, checkpoint: Path) -> Manifest:
        """The manifest of the adapter directory `checkpoint`. Through `json`, not
        msgspec's decoder: a dropped step's non-finite loss is written `NaN`, which
        msgspec refuses. A file that is not a manifest raises a `ValueError`."""
        return msgspec.convert(json.loads((checkpoint / FILE).read_text()), cls)

    def write(self, checkpoint: Path) -> None:
        # `json` for the same reason: msgspec would write a NaN loss as null.
        (checkpoint / FILE).write_text(json.dumps(msgspec.to_builtins(self), indent=2))
