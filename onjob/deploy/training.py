"""`onjob train`: export a snapshot, train in a child process, record the checkpoint.

The heavy work never runs in the calling process: the child is `onjob train
--snapshot S --out DIR`, which imports torch, writes the adapter directory and its
manifest, and exits (0: written, 3: nothing to train, 1: failed or diverged).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ..collector import Store
from ..collector.ids import new_id
from ..trainer import snapshot
from ..trainer.records import checkpoint_path, record_run
from .settings import ServeSettings

NOTHING_TO_TRAIN = 3


def live_checkpoint(settings: ServeSettings) -> str | None:
    """The checkpoint clients get today: the first alias's (None: the base model)."""
    return next(iter(settings.proxy.aliases.values()), None)


def train(settings: ServeSettings, *, parent: str | None, echo=print) -> dict | None:
    """One run on the groups not trained on yet; the manifest, or None when there was
    nothing to train on."""
    t = settings.trainer
    name = f"ckpt-{time.strftime('%Y%m%d-%H%M%S')}-{new_id('')[:6]}"
    out = t.checkpoints_dir / name
    snap_path = t.checkpoints_dir / ".snapshots" / f"{name}.parquet"
    store = Store(settings.collector.db)
    try:
        info = snapshot.export(store, snap_path, t, live=parent)
        parent_dir = checkpoint_path(store, parent) if parent else None
    finally:
        store.close()
    if parent and parent_dir is None:
        raise ValueError(f"checkpoint {parent!r} is not in the checkpoints table")
    echo(
        f"snapshot {snap_path}: {len(info['groups'])} groups, {info['members']} members "
        f"(sampled by {parent or 'the base model'} or up to {t.max_staleness} checkpoints back)"
    )
    if not info["groups"]:
        echo("nothing to train on: no scored group with a spread of rewards not trained on yet")
        return None
    settings_file = snap_path.with_suffix(".json")
    settings_file.write_text(t.model_dump_json())
    cmd = [sys.executable, "-m", "onjob.deploy.cli", "train", "--snapshot", str(snap_path)]
    cmd += ["--out", str(out), "--settings", str(settings_file)]
    if parent_dir:
        cmd += ["--parent", str(parent_dir)]
    code = subprocess.run(cmd).returncode
    if code == NOTHING_TO_TRAIN:
        return None
    if code != 0:
        raise RuntimeError(f"the training run failed (exit {code}); no checkpoint recorded")
    manifest = json.loads((out / "onjob-manifest.json").read_text())
    store = Store(settings.collector.db)
    try:
        record_run(store, new_id("run-"), manifest, out, parent)
    finally:
        store.close()
    echo(f"checkpoint {name} recorded as a candidate: {out}")
    return manifest


def train_child(snapshot_path: Path, out: Path, settings_file: Path | None, parent: Path | None):
    """The child's side: torch is imported here and only here."""
    from ..trainer import NothingToTrain, TrainSettings
    from ..trainer.loop import train as run

    s = (
        TrainSettings.model_validate_json(settings_file.read_text())
        if settings_file
        else TrainSettings()
    )
    try:
        run(snapshot_path, out, s, parent=parent, echo=lambda line: print(line, flush=True))
    except NothingToTrain as exc:
        print(f"onjob train: {exc}", file=sys.stderr)
        return NOTHING_TO_TRAIN
    return 0
