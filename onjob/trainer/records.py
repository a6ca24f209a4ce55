"""A finished training run in DuckDB: its `train_runs` row and its checkpoint, a candidate."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from ..collector import Store
from .manifest import Manifest


def record_run(
    store: Store, run_id: str, manifest: Manifest, path: Path, parent: str | None
) -> None:
    """`groups_used` is every group the run consumed: those it trained on and those it
    skipped with a reason (in the manifest's `skipped_groups`), so that a group the trainer
    cannot use is not exported, and skipped, on every later run."""
    used = [*manifest.groups, *manifest.skipped_groups]
    with store.transaction() as con:
        con.execute(
            "INSERT INTO train_runs VALUES (?, ?, ?, ?, ?, now())",
            [
                run_id,
                used,
                json.dumps(manifest.config),
                json.dumps(msgspec.to_builtins(manifest.metrics)),
                manifest.duration_s,
            ],
        )
        con.execute(
            "INSERT INTO checkpoints VALUES (?, ?, ?, ?, now(), ?, 'candidate')",
            [manifest.name, parent, manifest.base_model, str(path.resolve()), run_id],
        )


def record_skipped(
    store: Store, run_id: str, groups: list[str], config: dict, reason: str, duration_s: float
) -> None:
    """A run whose every group the trainer's own checks skipped (too long, logprobs that
    disagree, nothing to learn): its groups recorded as used, with no checkpoint, so the
    next snapshot does not hand them to a child again."""
    store.con.execute(
        "INSERT INTO train_runs (id, groups_used, config, metrics, duration_s, created) "
        "VALUES (?, ?, ?, ?, ?, now())",
        [run_id, groups, json.dumps(config), json.dumps({"skipped": reason}), duration_s],
    )


def checkpoint_path(store: Store, name: str) -> Path | None:
    paths = store.column("SELECT path FROM checkpoints WHERE name = ?", [name])
    return Path(paths[0]) if paths else None
