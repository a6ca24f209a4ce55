"""What a run writes: the adapter (PEFT format), AdamW's moments for the lineage's next
run, and `onjob-manifest.json` with the run's metrics, checks and history beside them."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch
from msgspec import UNSET

from . import adapter
from .check import Checked
from .data import Group, Notes
from .manifest import Dropped, Manifest, Metrics, Precision, Step
from .settings import TrainSettings
from .setup import OPTIMIZER
from .trust import Reading, Region


@dataclass(frozen=True)
class Run:
    """A run's outcome, as the manifest records it: the groups trained, the steps (the
    history, an undone step marked so; the steps dropped), the checks before them, the
    trust region and its figures for the weights written, and the ranks' agreement."""

    trained: list[Group]
    notes: Notes
    checked: Checked
    history: list[Step]
    dropped: list[Dropped]
    region: Region
    probe: Reading
    own: Reading | None
    ranks: int
    weight_gap: float
    duration_s: float

    def metrics(self) -> Metrics:
        """The run's figures over the steps kept, with its checks."""
        kept = [h for h in self.history if not h.undone]
        tokens = sum(h.tokens or 0 for h in kept)
        return Metrics(
            steps=len(kept),
            groups=len(self.trained),
            members=sum(len(g.members) for g in self.trained),
            skipped_equal_groups=self.notes.equal_groups,
            skipped_too_long=self.notes.too_long,
            turns_trained_in_their_turn_group=self.notes.trained_elsewhere,
            members_outside_baseline=self.notes.outside_baseline,
            loss_first=kept[0].loss,
            loss_last=kept[-1].loss,
            reward_mean=sum(h.reward_mean for h in kept) / len(kept),
            clip_fraction=sum(h.clip_fraction for h in kept) / len(kept),
            kl=sum(h.kl for h in kept) / len(kept),
            tokens=tokens,
            tokens_per_s=tokens / self.duration_s,
            duration_s=self.duration_s,
            # The sampler check before the first update.
            logprob_gap_step0=self.checked.gap,
            logprob_gap_step0_max=self.checked.gap_max,
            logprob_gap_first_forward_max=self.checked.gap_max,  # the same check since 1.0
            # The drift from the base model (the probe's tokens, the policy's own answers)
            # and from the run's start; the budget and what it undid.
            kl_to_base=self.probe.to_base.kl,
            kl_to_base_tokens=self.probe.to_base.tokens,
            kl_to_base_own=self.own.to_base.kl if self.own else UNSET,
            kl_to_base_own_tokens=self.own.to_base.tokens if self.own else UNSET,
            skipped_groups=len(self.checked.skipped),
            kl_budget=self.region.budget,
            kl_to_start=(self.own or self.probe).to_start.kl,
            undone_steps=self.region.backoffs,
            trust_stopped=self.region.stopped or UNSET,
            dropped_steps=self.dropped,
            ranks=self.ranks,
            ranks_weight_gap=self.weight_gap,
        )


def write(
    out: Path,
    model,
    optimizer,
    s: TrainSettings,
    parent: Path | None,
    base_dir,
    snapshot: Path,
    run: Run,
    precision: Precision,
) -> Manifest:
    """The checkpoint: the adapter, the optimizer's moments and the manifest beside them."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    adapter.name_base(out, s.served_base)
    torch.save(optimizer.state_dict(), out / OPTIMIZER)
    config = s.model_dump_json()
    manifest = Manifest(
        name=out.name,
        parent=str(parent) if parent else None,
        base_model=str(base_dir),
        snapshot_sha256=hashlib.sha256(Path(snapshot).read_bytes()).hexdigest(),
        config_sha256=hashlib.sha256(config.encode()).hexdigest(),
        config=json.loads(config),
        groups=[g.id for g in run.trained],
        skipped_groups=run.checked.skipped,
        precision=precision,
        metrics=run.metrics(),
        history=run.history,
        created=time.time(),
    )
    manifest.write(out)
    return manifest


def undone_after(history: list[Step], step: int | None) -> list[Step]:
    """The history with the steps after `step` (the weights written; None: the last)
    marked undone: the end's check stepped back over them."""
    if step is None:
        return history
    return [h if h.step <= step else msgspec.structs.replace(h, undone=True) for h in history]
