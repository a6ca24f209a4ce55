"""`onjob train`: export a snapshot, train in a child process or a job, record the checkpoint.

The heavy work never runs in the calling process: the child is `onjob train
--snapshot S --out DIR`, which imports torch, writes the adapter directory and its
manifest, and exits (0: written, 3: nothing to train, 1: failed or diverged). With
`trainer.runner = "job"` the snapshot goes to `trainer.bucket` instead, a training job on
another host (`onjob train --jobs`) runs it and publishes the checkpoint, and this side
fetches it (`trainer/jobs.py`); either way the same record follows. With `trainer.bucket`
every checkpoint is published there, for the engines that load adapters by name.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path

import httpx
import msgspec

from ... import published
from ...bucket import BucketError
from ...collector import Collector, budgets
from ...collector.ids import new_id
from ...proxy.tenants import Lineage, Tenants
from ...trainer import jobs, snapshot
from ...trainer.manifest import Manifest, Sampler
from ..decide import fit
from ..errors import TrainingFailed, UnknownCheckpoint
from ..settings import DeploySettings
from . import deployments, host, registry, runs

NOTHING_TO_TRAIN = 3


def live_checkpoint(store, settings: DeploySettings, alias: str | None = None) -> str | None:
    """What `alias` (default: the first configured) serves as live today (None: the base
    model): the latest deployment, else the configured alias."""
    alias = alias or next(iter(settings.proxy.aliases), "agent")
    return deployments.arms_of(store, alias, settings.proxy.aliases.get(alias)).live


# The trust region's share of the release's KL bound: a candidate within its budget on
# the snapshot's tokens is within the bound on the guard's noisier figure too.
KL_BUDGET_SHARE = 0.5


def kl_budget(settings: DeploySettings) -> float | None:
    """The run's KL budget: `trainer.kl_budget`, else half of `loop.max_kl_to_base` (None:
    both unset, unbounded). A trainer that kept within the release's own bound would hand
    it candidates that its guard's other figure stops."""
    if settings.trainer.kl_budget is not None:
        return settings.trainer.kl_budget
    bound = settings.loop.max_kl_to_base
    return None if bound is None else bound * KL_BUDGET_SHARE


async def budget(db: Collector, settings: DeploySettings) -> budgets.Budget | None:
    """The trainer's budget today (None: no `trainer.max_minutes_per_day`). Checked before
    a run starts: a run in progress is never cut, so a day can end past its limit by
    the last run's length."""
    limit = settings.trainer.max_minutes_per_day
    if limit is None:
        return None
    return await db.query(lambda store: budgets.train(store, limit))


async def sampler(engine: httpx.AsyncClient) -> Sampler:
    """How the engine samples, as its model list says: the dtype and the logprob definition
    (the local engine reports both; vLLM neither: `unknown`). A training run records it
    beside its own precision, so both sides of the importance ratio are on file."""
    try:
        resp = await engine.get("/models")
        resp.raise_for_status()
        card = next(m for m in resp.json()["data"] if not m.get("parent"))
    except (httpx.HTTPError, ValueError, KeyError, StopIteration) as exc:
        return Sampler(dtype="unknown", logprobs="unknown", error=str(exc))
    return Sampler(
        model=card.get("id"),
        dtype=card.get("dtype", "unknown"),
        logprobs=card.get("logprobs", "unknown"),
    )


async def train(
    db: Collector,
    settings: DeploySettings,
    *,
    parent: str | None,
    engine_sampler: Sampler | None = None,
    started_by: str = "onjob train",
    engine: httpx.AsyncClient | None = None,
    echo=print,
    lineage: Lineage | None = None,
) -> Manifest | None:
    """One run on the groups not trained on yet; the manifest, or None when there was
    nothing to train on. The child writes into `<name>.partial`, renamed when it is done:
    a run killed half way leaves no directory anyone mistakes for a checkpoint, and no row.
    `engine_sampler` (`sampler()`) goes into the manifest's precision, `started_by` into
    its config: the loop decides its own candidates, even one a crash left undecided
    (`loop._orphans`), and never a person's. A run on this host shares it with `engine`
    (`host.beside`: the engine serves on the cores the run leaves). `lineage` (default:
    `loop.alias`'s shared one) is whose traffic it trains on, recorded in its config.

    The held-out slice is decided in the snapshot's own step (`fit.held_out`: every
    scenario seen so far placed first), so a scenario first seen since the loop last
    looked cannot be trained on now and held out later."""
    t, started = settings.trainer, time.monotonic()
    if t.runner == "local":
        t = t.model_copy(update={"threads": host.trainer_threads(t)})
    t = t.model_copy(update={"kl_budget": kl_budget(settings)})
    name = f"ckpt-{time.strftime('%Y%m%d-%H%M%S')}-{new_id('')[:6]}"
    out, partial = t.checkpoints_dir / name, t.checkpoints_dir / f"{name}.partial"
    snap_path = t.checkpoints_dir / ".snapshots" / f"{name}.parquet"
    # One run at a time: what a killed run left (its output, a job's checkpoint half fetched).
    for stale in [*t.checkpoints_dir.glob("*.partial"), *t.checkpoints_dir.glob(".*.fetch")]:
        shutil.rmtree(stale, ignore_errors=True)
    lineage = lineage or Tenants.of(settings.proxy).lineage(settings.loop.alias)
    info = await db.query(
        lambda st: snapshot.export(
            st, snap_path, t, live=parent, held_out=fit.held_out(st, settings),
            scope=lineage.scope,
        )
    )  # fmt: skip
    parent_dir = await db.query(lambda st: registry.path_of(st, parent)) if parent else None
    if parent and parent_dir is None:
        raise UnknownCheckpoint(f"checkpoint {parent!r} is not in the checkpoints table")
    echo(
        f"snapshot {snap_path}: {len(info.groups)} groups, {info.members} members "
        f"of {lineage.name} (sampled by {parent or 'the base model'} or up to "
        f"{t.max_staleness} checkpoints back)"
    )
    if not info.groups:
        echo("nothing to train on: no scored group with a spread of rewards not trained on yet")
        return None
    if t.runner == "job":
        code = await _by_job(t, name, snap_path, parent, parent_dir, partial, echo)
    else:
        async with host.beside(engine, t.threads, echo) as idle:
            run = t.model_copy(update={"idle": t.idle or idle})
            settings_file = snap_path.with_suffix(".json")
            settings_file.write_text(run.model_dump_json())
            code = await _child(snap_path, partial, settings_file, parent_dir)
    if code == NOTHING_TO_TRAIN:
        await _skipped(db, t, info.groups, time.monotonic() - started, echo)
        return None
    if code != 0:
        raise TrainingFailed(f"the training run failed (exit {code}); no checkpoint recorded")
    partial.rename(out)
    manifest = Manifest.read(out)
    precision = manifest.precision
    if engine_sampler is not None:
        precision = msgspec.structs.replace(precision, sampler=engine_sampler)
    config = {**manifest.config, "started_by": started_by, "lineage": lineage.name}
    manifest = msgspec.structs.replace(manifest, name=name, config=config, precision=precision)
    manifest.write(out)
    await db.query(lambda st: runs.record(st, new_id("run-"), manifest, out, parent))
    echo(f"checkpoint {name} recorded as a candidate: {out}")
    if t.bucket and t.runner == "local":  # a job published it already
        await _publish(t, out, name, echo)
    return manifest


async def _publish(t, out: Path, name: str, echo) -> None:
    """A checkpoint trained here, to `trainer.bucket` for engines that load by name."""
    try:
        store = jobs.Store.at(t.bucket)
        await asyncio.to_thread(published.publish, store.checkpoints, out, name)
        echo(f"checkpoint {name} published to {store.checkpoints.url}")
    except BucketError as exc:  # recorded all the same: engines on this host load it
        echo(f"checkpoint {name} NOT published ({exc}): engines that load adapters by name "
             "will not find it")  # fmt: skip


async def _skipped(db: Collector, t, groups: list, took_s: float, echo) -> None:
    """A run whose trainer wrote nothing (`NothingToTrain`: every group skipped, or no step
    within its KL budget): the groups recorded as used, no checkpoint."""
    reason = (
        "the trainer wrote no checkpoint: every group of the snapshot skipped, or no step "
        "within its KL budget (its output says which)"
    )
    await db.query(
        lambda st: runs.record_skipped(
            st, new_id("run-"), groups, t.model_dump(mode="json"), reason, took_s
        )
    )
    echo(f"{reason}: {len(groups)} groups recorded as used, no checkpoint")


async def _child(snap_path: Path, partial: Path, settings_file: Path, parent_dir) -> int:
    """The run as a child process of this one (`trainer.runner = "local"`): its exit code."""
    cmd = ["-m", "onjob.cli", "train", "--snapshot", str(snap_path)]
    cmd += ["--out", str(partial), "--settings", str(settings_file)]
    if parent_dir:
        cmd += ["--parent", str(parent_dir)]
    child = await asyncio.create_subprocess_exec(sys.executable, *cmd)
    try:
        return await child.wait()
    except asyncio.CancelledError:
        child.kill()
        await child.wait()
        raise


JOB_POLL_S = 2.0  # how often the server looks for a submitted run's outcome


async def _by_job(t, name: str, snap_path: Path, parent, parent_dir, partial: Path, echo) -> int:
    """The run handed to a training job through `trainer.bucket` (`trainer.runner = "job"`):
    the parent published if it is not yet, the snapshot submitted, the checkpoint fetched
    into `partial` once published. An exit code as the child's: 0, NOTHING_TO_TRAIN, or
    the job's failure."""
    store = jobs.Store.at(t.bucket)
    if parent and parent_dir:
        await asyncio.to_thread(published.publish, store.checkpoints, parent_dir, parent)
    job = jobs.Job(name, parent, t)
    await asyncio.to_thread(jobs.submit, store, job, snap_path)
    echo(f"run {name} submitted to {t.bucket}: waiting for a training job (onjob train --jobs)")
    deadline = time.monotonic() + t.job_timeout_s
    while (outcome := await asyncio.to_thread(jobs.outcome, store, name)).state == "waiting":
        if time.monotonic() > deadline:
            jobs.fail(store, name, 1, "the server stopped waiting (trainer.job_timeout_s)")
            await asyncio.to_thread(jobs.retire, store, name)
            raise TrainingFailed(f"no training job published {name} in {t.job_timeout_s:g} s")
        await asyncio.sleep(JOB_POLL_S)
    await asyncio.to_thread(jobs.retire, store, name)
    if outcome.state == "failed":
        echo(f"run {name}: the training job wrote no checkpoint: {outcome.reason}")
        return outcome.exit
    cache = partial.parent / f".{name}.fetch"
    got = await asyncio.to_thread(published.fetch, store.checkpoints, name, cache)
    got.rename(partial)
    shutil.rmtree(cache, ignore_errors=True)
    return 0


def drop_snapshots(checkpoints_dir: Path, group_ids: list[str]) -> list[str]:
    """Remove the training snapshots (`<checkpoints_dir>/.snapshots/*.parquet`, kept beside
    the runs they fed) that hold one of `group_ids`, with their settings file: after
    `onjob forget` no copy of the deleted groups is left for a run to read. Returns the
    paths removed."""
    gone = set(group_ids)
    removed: list[str] = []
    if not gone:
        return removed
    import pyarrow as pa  # here: the server pays its ~40 MiB only when it needs it
    import pyarrow.parquet as pq

    for path in sorted((Path(checkpoints_dir) / ".snapshots").glob("*.parquet")):
        try:
            held = set(pq.read_table(path, columns=["group_id"]).column("group_id").to_pylist())
        except (OSError, KeyError, pa.ArrowException):
            continue  # not a snapshot this version wrote: left as it is
        if held & gone:
            path.unlink(missing_ok=True)
            path.with_suffix(".json").unlink(missing_ok=True)
            removed.append(str(path))
    return removed
