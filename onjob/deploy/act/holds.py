"""A worker's hold on one lineage's work (`collector/jobs.py`). On a DuckLake every
server, and any `onjob loop`, runs the loop: a worker takes a lineage's lease for one
job (its open decisions and its judge pass, or a training run and its offline test) and
gives it back after, so a group is judged by one worker, a run trained by one, and one
release decision per lineage made at a time. On a file, one process holds every lineage.

While held, the lease is renewed a third of `collector.job_lease_s` apart. A hold not
renewed within 90% of the lease (its catalog not answering, or another worker took it
after a stall) is lost, and the job is cancelled (`LineageLost`, a training child killed
with it) before it can decide on a lineage another worker may now hold. A routing change
by hand takes no hold: it is a person's, and the loop's decisions are made against the
routing they read (`RoutingChanged`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from ...collector import Collector
from ..errors import LineageBusy, LineageLost

log = logging.getLogger("onjob.deploy")

TRUSTED = 0.9  # a hold not renewed for this share of the lease is taken for lost


@contextlib.asynccontextmanager
async def held(collector: Collector, lineage: str) -> AsyncIterator[None]:
    """Hold `lineage`'s work while the block runs; `LineageBusy`, naming the holder,
    while another worker does."""
    holder = await collector.claim_job(lineage)
    if holder is not None:
        raise LineageBusy(lineage, holder)
    job, lost = asyncio.current_task(), []
    renewing = (
        asyncio.create_task(_renew(collector, lineage, job, lost)) if collector.in_lake else None
    )
    try:
        yield
    except asyncio.CancelledError:
        if lost and job.uncancel() == 0:  # cancelled by `_renew` alone
            raise LineageLost(
                f"lineage {lineage}'s job stopped: this worker's hold on it was lost "
                f"({lost[0]}); another worker may take it"
            ) from None
        raise
    finally:
        if renewing is not None:
            renewing.cancel()
            if not lost:
                try:
                    await asyncio.shield(collector.release_job(lineage))
                except Exception as exc:  # it runs out by itself
                    log.warning("could not give back lineage %s's lease: %s", lineage, exc)


async def _renew(collector: Collector, lineage: str, job: asyncio.Task, lost: list[str]) -> None:
    lease_s = collector.settings.job_lease_s
    renewed = time.monotonic()
    while True:
        await asyncio.sleep(lease_s / 3)
        try:
            holder = await collector.claim_job(lineage)
        except Exception as exc:
            log.warning("could not renew lineage %s's lease: %s", lineage, exc)
            if time.monotonic() - renewed < lease_s * TRUSTED:
                continue
            holder = f"not renewed for {time.monotonic() - renewed:.0f} s: {exc}"
        else:
            if holder is None:
                renewed = time.monotonic()
                continue
            holder = f"{holder} holds it now"
        lost.append(holder)
        job.cancel()
        return
