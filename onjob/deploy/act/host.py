"""One host, serving and training at once: while a loop's training run takes
`trainer.threads` cores, a local engine on the same host serves on the others, and gets
them back when the run ends. The agent's traffic never waits for training.

Why a split, not a priority: torch's OpenMP threads wait for each other at every
parallel region, so a thread of either side that loses its core stalls its whole team.
Measured on 2 cores (bench/trainer/sharing.py, one closed-loop agent, a run of 4 groups): both
on both cores served 0.29x the tokens at 2.9x the p50 latency and trained in 2.9x the
wall time; the engine on both and the trainer on one, 0.32x; the trainer on one at nice 5,
0.66x served and 3.9x the training time. A core each kept both at their speed alone, and
giving the engine its second core back between runs keeps serving at full speed then.

An engine on this host that cannot change its threads (vLLM) keeps them; the run then
trains beside it on `trainer.threads` at the CPU's idle priority (`trainer.idle`, Linux's
SCHED_IDLE): it takes a core only while the engine leaves it, so the engine's threads
never wait for it, and the run is slower where the engine is busy. An engine on another
host shares no core: the run trains at `trainer.nice`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import AsyncIterator, Callable

import httpx
import msgspec

from ...trainer import TrainSettings


class EngineThreads(msgspec.Struct):
    """What the local engine's `POST /onjob/threads` answers (`engine/protocol.ThreadsSet`,
    declared again here: deploy reaches the engine over HTTP only): the threads it serves
    on now, and before."""

    threads: int
    was: int


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def trainer_threads(t: TrainSettings) -> int:
    """A run's torch threads: `trainer.threads`, or half of this host's cores (at least
    one) when unset."""
    return t.threads or max(1, cores() // 2)


@contextlib.asynccontextmanager
async def beside(
    engine: httpx.AsyncClient | None, threads: int, echo: Callable[[str], None]
) -> AsyncIterator[bool]:
    """While the block runs a training run on `threads` cores, a local engine on this host
    (its URL on loopback) serves on the cores left; then it has the count it started with
    again, whatever an earlier run left it at (one killed with its server: `onjob serve
    --start-engine` starts a new engine then; an engine started apart gets its cores back
    when the next run ends). Yields whether the run should train at idle priority: an
    engine on this host kept its threads."""
    left = max(1, cores() - threads)
    here = _local(engine)
    changed = await _set(engine, left) if here else None
    idle = here and changed is None  # beside it, sharing its cores
    if idle:
        echo(
            f"training on {threads} threads at idle priority beside the engine on this host, "
            "which keeps its own threads: the run takes a core only while the engine leaves it"
        )
    elif changed is None:
        echo(f"training on {threads} threads; the engine is on another host")
    else:
        echo(
            f"training on {threads} threads; the engine serves on {changed.threads} "
            f"(of {changed.was}) until the run ends"
        )
    try:
        yield idle
    finally:
        if changed is not None:
            await _set(engine, None)


def _local(engine: httpx.AsyncClient | None) -> bool:
    if engine is None:
        return False
    host = engine.base_url.host
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _set(engine: httpx.AsyncClient, threads: int | None) -> EngineThreads | None:
    """`POST /onjob/threads` on the engine; its answer, or None where the engine has no
    such route (vLLM), did not answer, or answered what is not the route's."""
    root = str(engine.base_url).rstrip("/").removesuffix("/v1")
    try:
        resp = await engine.post(f"{root}/onjob/threads", json={"threads": threads}, timeout=30)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        return msgspec.json.decode(resp.content, type=EngineThreads)
    except msgspec.DecodeError:  # ValidationError is one
        return None
