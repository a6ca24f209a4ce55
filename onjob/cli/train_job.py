"""`onjob train` as a job of its own, on a host with the training stack and no database:
one run from a snapshot in object storage (`--snapshot s3://.../snapshots/NAME --publish
s3://.../checkpoints`), or a watcher that takes the runs a server submits (`--jobs
s3://name/prefix`, `trainer.runner = "job"`) one at a time, each in a child process, under
`torchrun` when `--ranks` asks for several processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..deploy.act.training import NOTHING_TO_TRAIN

SNAPSHOTS = "/snapshots/"


def run_one(
    snapshot: str,
    publish: str,
    out: Path | None,
    settings_file: Path | None,
    base_model: Path | None = None,
) -> int:
    """Train on `snapshot` (a job's URL, or a local Parquet file) and publish the checkpoint
    under `publish`; rank 0 publishes, the other ranks of a torchrun only train."""
    from ..bucket import Bucket, BucketError
    from ..published import fetch
    from ..published import publish as put
    from ..trainer import NothingToTrain, TrainerError, TrainSettings, jobs
    from ..trainer.loop import train

    main = os.environ.get("RANK", "0") == "0"
    work = Path(tempfile.mkdtemp(prefix="onjob-train-"))
    store, name = None, None
    try:
        target = Bucket.from_url(publish)
        if snapshot.startswith("s3://"):
            if SNAPSHOTS not in snapshot.rstrip("/"):
                print(f"onjob train: {snapshot} is not a job (…{SNAPSHOTS}NAME)", file=sys.stderr)
                return 2
            root, _, name = snapshot.rstrip("/").rpartition(SNAPSHOTS)
            store = jobs.Store(Bucket.from_url(root + "/snapshots"), target)
            job, local = jobs.read(store, name, work)
            settings, parent = job.settings, job.parent
        else:
            local, name, parent = Path(snapshot), (out.name if out else None), None
            settings = TrainSettings()
            if name is None:
                print("onjob train: --publish with a local --snapshot needs --out", file=sys.stderr)
                return 2
        if settings_file:
            settings = TrainSettings.model_validate_json(settings_file.read_text())
        if base_model:  # the base model's directory on this host, where the server's differs
            settings = settings.model_copy(update={"base_model": base_model})
        parent_dir = fetch(target, parent, work / "parents") if parent else None
        if parent and parent_dir is None:
            raise TrainerError(f"the parent checkpoint {parent} is not published under {publish}")
        dest = out or work / name
        train(local, dest, settings, parent=parent_dir, echo=lambda line: print(line, flush=True))
        if main:
            put(target, dest, name)
            print(f"published {name} to {target.url}{name}/", flush=True)
        return 0
    except NothingToTrain as exc:
        print(f"onjob train: {exc}", file=sys.stderr)
        if store is not None and main:
            jobs.fail(store, name, NOTHING_TO_TRAIN, str(exc))
        return NOTHING_TO_TRAIN
    except (TrainerError, BucketError) as exc:
        print(f"onjob train: {exc}", file=sys.stderr)
        if store is not None and main:
            jobs.fail(store, name, 1, str(exc))
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def watch(
    url: str, *, once: bool, ranks: int, poll_s: float, base_model: str | None, echo=print
) -> int:
    """Take the submitted runs under `url` one at a time; with `once`, the next one (waiting
    for it) and exit with its code."""
    from ..bucket import BucketError
    from ..trainer import jobs

    try:
        store = jobs.Store.at(url)
    except BucketError as exc:
        print(f"onjob train: {exc}", file=sys.stderr)
        return 2
    launcher = [sys.executable, "-m", "onjob.cli"]
    if ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launcher += ["--nproc-per-node", str(ranks), "-m", "onjob.cli"]
    while True:
        try:
            names = next(([n] for n in jobs.pending(store) if jobs.take(store, n)), [])
        except BucketError as exc:
            echo(f"onjob train: {exc}; trying again in {poll_s:g} s")
            names = []
        for name in names:
            echo(f"training job {name}")
            cmd = [*launcher, "train", "--snapshot", f"{url.rstrip('/')}{SNAPSHOTS}{name}"]
            cmd += ["--publish", f"{url.rstrip('/')}/checkpoints"]
            cmd += ["--base-model", base_model] if base_model else []
            code = subprocess.run(cmd).returncode
            if code not in (0, NOTHING_TO_TRAIN):
                jobs.fail(store, name, code, f"the training process exited {code}")
            echo(f"job {name}: exit {code}")
            if once:
                return code
        if not names:
            time.sleep(poll_s)
