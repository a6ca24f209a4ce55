"""A training run's manifest: `onjob-manifest.json` beside the adapter, what it was trained
from and how it went. Torch-free: the server reads it back and records it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

FILE = "onjob-manifest.json"

# A field an older file lacks is UNSET, never null, and stays absent when the file is
# written again (msgspec leaves UNSET fields out): a manifest round-trips as it was.


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
    # The trust region's reading after the step (trainer/trust.py): on the sampler's
    # tokens ("probe") or, past the budget there, on the policy's own answers ("own");
    # and a step it undid.
    kl_to_base: float | None = None
    kl_to_start: float | None = None
    kl_on: Literal["probe", "own"] | None = None
    undone: bool | None = None


class Dropped(msgspec.Struct, kw_only=True):
    """A step not applied: its loss or its gradient's norm is not finite."""

    epoch: int
    groups: list[str]
    loss: float
    grad_norm: float


class Sampler(msgspec.Struct, kw_only=True):
    """How the engine samples, as its model list says (`deploy.act.training.sampler`): the
    base model's id, its dtype and logprob definition (`unknown` where the engine does
    not say: vLLM), or why the list could not be read (`error`, and no `model`)."""

    model: str | UnsetType | None = UNSET
    dtype: str | UnsetType = UNSET
    logprobs: str | UnsetType = UNSET
    error: str | UnsetType = UNSET


class Precision(msgspec.Struct, kw_only=True):
    """How the run computed, beside how the engine sampled: both sides of the importance
    ratio on file. Absent from the first runs' files; fields added since, absent from
    older ones."""

    device: str | UnsetType = UNSET
    model_dtype: str | UnsetType = UNSET
    head_dtype: str | UnsetType = UNSET
    attention: str | UnsetType | None = UNSET  # the model's attention implementation
    head_check_gap: float | UnsetType = UNSET  # this head against the model's own forward
    sampler: Sampler | UnsetType = UNSET  # added by the server after the run


class Metrics(msgspec.Struct, kw_only=True):
    """The run's figures, in the order the trainer writes them. `steps` and `duration_s`
    every file has; each other key an older file may lack."""

    steps: int
    groups: int | UnsetType = UNSET
    members: int | UnsetType = UNSET
    skipped_equal_groups: int | UnsetType = UNSET
    skipped_too_long: int | UnsetType = UNSET
    turns_trained_in_their_turn_group: int | UnsetType = UNSET
    members_outside_baseline: int | UnsetType = UNSET
    loss_first: float | UnsetType = UNSET
    loss_last: float | UnsetType = UNSET
    reward_mean: float | UnsetType = UNSET
    clip_fraction: float | UnsetType = UNSET
    kl: float | UnsetType = UNSET  # mean over the steps, k3 to the base model
    tokens: int | UnsetType = UNSET
    tokens_per_s: float | UnsetType = UNSET
    duration_s: float
    # The policy against the logged logprobs: at step 0, and on each group's first forward.
    logprob_gap_step0: float | UnsetType = UNSET
    logprob_gap_step0_max: float | UnsetType = UNSET
    logprob_gap_first_forward_max: float | UnsetType = UNSET
    # k3 to the base model per token: on the snapshot's tokens, on the policy's own answers.
    kl_to_base: float | UnsetType = UNSET
    kl_to_base_tokens: int | UnsetType = UNSET
    kl_to_base_own: float | UnsetType = UNSET
    kl_to_base_own_tokens: int | UnsetType = UNSET
    skipped_groups: int | UnsetType = UNSET
    # The trust region (trainer/trust.py): its budget, the drift from the run's start (on
    # the policy's own answers; on the probe without them), the steps undone, and why
    # the run stopped early (absent: it did not).
    kl_budget: float | UnsetType | None = UNSET
    kl_to_start: float | UnsetType = UNSET
    undone_steps: int | UnsetType = UNSET
    trust_stopped: str | UnsetType = UNSET
    dropped_steps: list[Dropped] | UnsetType = UNSET
    ranks: int | UnsetType = UNSET
    ranks_weight_gap: float | UnsetType = UNSET  # the largest difference between ranks


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """The run, keyed as the file has always been: checkpoints written by older versions
    load as they are. `config` is the `TrainSettings` dump with what the server adds
    (`started_by`), not `TrainSettings` itself: an old file may name a setting since
    removed, which the settings refuse."""

    name: str
    parent: str | None = None  # the adapter directory continued from
    base_model: str
    snapshot_sha256: str
    config_sha256: str
    config: dict[str, Any]
    groups: list[str]  # trained on
    skipped_groups: dict[str, str] = {}  # group id -> why (absent before the check existed)
    precision: Precision = msgspec.field(default_factory=Precision)
    metrics: Metrics
    history: list[Step]  # one record per optimizer step applied
    created: float  # Unix time

    @property
    def steps(self) -> int:
        return self.metrics.steps

    @property
    def duration_s(self) -> float:
        return self.metrics.duration_s

    @classmethod
    def read(cls, checkpoint: Path) -> Manifest:
        """The manifest of the adapter directory `checkpoint`. Through `json`, not
        msgspec's decoder: a dropped step's non-finite loss is written `NaN`, which
        msgspec refuses. A file that is not a manifest raises a `ValueError`."""
        return msgspec.convert(json.loads((checkpoint / FILE).read_text()), cls)

    def write(self, checkpoint: Path) -> None:
        # `json` for the same reason: msgspec would write a NaN loss as null.
        (checkpoint / FILE).write_text(json.dumps(msgspec.to_builtins(self), indent=2))
