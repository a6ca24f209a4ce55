"""Offline GRPO on scored groups, writing LoRA checkpoints in PEFT format.

`snapshot.export()` (no torch: it runs where the database is) writes the groups to
train on as Parquet; `loop.train()` (torch, in a child process: `onjob train
--snapshot`) turns a snapshot into an adapter directory vLLM and the local engine
load as they are, with `onjob-manifest.json` beside it.

The run, `loop.py`, top to bottom, and the module each part lives in:

    setup.py       the process and device, the snapshot's groups in a fixed order, AdamW
                   (a lineage's moments continued), the learning rate's warm-up
    data.py        groups and members: tokens, loss masks, advantages, the sampler's
                   logprobs; what was left out and why
    adapter.py     base + LoRA (new, or the parent continued), targets per family
    check.py       the sampler check before the first update: a group its sampler's
                   weights disagree with is skipped and named
    warm.py        the warm start (`sft_epochs`): supervised passes on the best members
    trust.py       the trust region: a KL budget per token to the base model and to the
                   run's start, held on the policy's own answers after every step
    forward.py     packed forwards, their additive mask, the model's own head in fp32
    maths.py       advantages, token logprobs, the clipped or CISPO loss, k3
    ranks.py       data parallelism under torchrun: a share of each step per rank
    checkpoint.py  the adapter, AdamW's moments and the manifest written
    manifest.py    the manifest as a typed record (torch-free: deploy reads it back)
    report.py      progress: a bar, a line per step, W&B

Around the run: `snapshot.py` (the export, torch-free; a run's rows are deploy's to
write: `deploy/act/runs.py`), `jobs.py` (runs handed through object storage to another
host), `settings.py`, the exception tree (`errors.py`) and the one place foreign errors
become it (`foreign.py`).
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
