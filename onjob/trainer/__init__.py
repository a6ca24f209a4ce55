"""Offline GRPO on scored groups, writing LoRA checkpoints in PEFT format.

`snapshot.export()` (no torch: it runs where the database is) writes the groups to
train on as Parquet; `loop.train()` (torch, in a child process: `onjob train
--snapshot`) turns a snapshot into an adapter directory vLLM and the local engine
load as they are, with `onjob-manifest.json` beside it. The maths is in `maths`.
"""

from .errors import (
    BadTargets,
    Diverged,
    IOFailed,
    NoDevice,
    NothingToTrain,
    OutOfMemory,
    ParentMismatch,
    TrainerError,
    UnsupportedModel,
)
from .settings import TrainSettings

__all__ = [
    "BadTargets",
    "Diverged",
    "IOFailed",
    "NoDevice",
    "NothingToTrain",
    "OutOfMemory",
    "ParentMismatch",
    "TrainSettings",
    "TrainerError",
    "UnsupportedModel",
]
