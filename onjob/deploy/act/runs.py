"""The loop's training runs in DuckDB: each run's `train_runs` row (the one writer of that
table), and the candidate it made, written through `registry.insert` in the same
transaction (a run without its checkpoint, or a checkpoint without its run, is never
seen)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from ...collector import Store
from ...trainer.manifest import Manifest
from . import registry


def record(store: Store, run_id: str, manifest: Manifest, path: Path, parent: str | None) -> None:
    """`groups_used` is every group the run consumed: those it trained on and those it
    skipped with a reason (in the manifest's `skipped_groups`), so that a group the trainer
    cannot use is not exported, and skipped, on every later run."""
    used = [*manifest.groups, *manifest.skipped_groups]
    with store.transaction():
        metrics = msgspec.to_builtins(manifest.metrics)
        _insert(store, run_id, used, manifest.config, metrics, manifest.duration_s)
        registry.insert(
            store,
            manifest.name,
            parent=parent,
            base_model=manifest.base_model,
            path=path,
            train_run=run_id,
        )


def record_skipped(
    store: Store, run_id: str, groups: list[str], config: dict, reason: str, duration_s: float
) -> None:
    """A run whose every group the trainer's own checks skipped (too long, logprobs that
    disagree, nothing to learn): its groups recorded as used, with no checkpoint, so the
    next snapshot does not hand them to a child again."""
    _insert(store, run_id, groups, config, {"skipped": reason}, duration_s)


def _insert(
    store: Store, run_id: str, groups: list[str], config: dict, metrics: dict, duration_s
) -> None:
    store.execute(
        "INSERT INTO train_runs (id, groups_used, config, metrics, duration_s, created) "
        "VALUES (?, ?, ?, ?, ?, now())",
        [run_id, groups, json.dumps(config), json.dumps(metrics), duration_s],
    )
