"""The engines behind the proxy: one or several replicas of the same base model.

A request goes to the UP replica with the fewest requests outstanding. One that refuses
the connection (or drops a whole answer half way) is marked DOWN and the request goes to
the next: the client has heard nothing yet, and a re-sample is harmless.

Every `interval_s` each replica's `/health` and `/v1/models` are read. A runtime-loaded
adapter does not survive an engine's restart (vLLM and the local engine start with none),
so a replica is put back only once the adapters the router sends to (`wanted`: every
alias's live and canary) are listed again: DOWN -> RELOADING (its health passes; `reload`,
the operator's hook, loads what it lacks from the registry) -> UP. A replica that lacks
one adapter (it restarted between two checks and answered 404 for it, or a load failed)
keeps serving the other models; requests for that adapter go to a replica that has it,
and with none they are answered 503 (`AdapterUnavailable`) until it is back, never by the
base model under the checkpoint's name.

Engines that resolve adapters by name (`resolves`: `proxy.engines_resolve_adapters`, each
started with an adapter cache filled from the bucket) load one on its first request: for
them an adapter not listed yet is not missing, and nothing is reloaded; a 404 for it
(not published yet, the store unreachable) still sends its requests elsewhere until the
next check.

With no replica UP, requests still go to the others (RELOADING first): the health view
may be stale, and a lone engine's own error (502, 404) is more useful than a guess. A
request that no engine could even be connected to is answered 503 with `Retry-After`
(`EngineUnavailable`): a dead or restarting engine, which the client's retry finds back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

import httpx

from ..logprobs import TRAINED
from .errors import (
    AdapterUnavailable,
    EngineUnavailable,
    HungUp,
    NotConnected,
    StreamCut,
    UpstreamStatus,
    UpstreamUnreachable,
)
from .upstream import Upstream, UpstreamResponse

log = logging.getLogger("onjob.proxy.pool")

_PROBE_TIMEOUT_S = 2.0


class ReplicaState(StrEnum):
    UP = "up"
    RELOADING = "reloading"  # answers its health check; its adapters are being loaded
    DOWN = "down"  # failed a health check or refused a connection


@dataclass(eq=False)
class Replica:
    """One engine. `upstream` carries the traffic; `control` (httpx, off the hot path)
    the health checks and the operator's adapter loads; None: never checked."""

    url: str
    upstream: Upstream
    control: httpx.AsyncClient | None = None
    state: ReplicaState = ReplicaState.UP
    outstanding: int = 0
    missing: set[str] = field(default_factory=set)  # wanted adapters it does not serve
    changed: float = field(default_factory=time.monotonic)  # when `state` last changed
    # Its logprob definition (`onjob.logprobs`): as declared (`proxy.engine_logprobs`),
    # until its model list states one.
    logprobs: str = TRAINED
    stated: bool = False  # its model list stated `logprobs` (else: as declared)
    healthy: bool = True  # its last health check passed (`Pool.down`, `/health`)

    def set(self, state: ReplicaState, why: str) -> None:
        if state is not self.state:
            log.warning("engine %s: %s -> %s (%s)", self.url, self.state, state, why)
            self.state, self.changed = state, time.monotonic()

    @property
    def root(self) -> str:
        """The server's root (`/health` is not under `/v1`)."""
        return self.url.rstrip("/").removesuffix("/v1")


class Sent(NamedTuple):
    response: UpstreamResponse
    body: bytes | None  # the whole answer, when read here
    logprobs: str  # the logprob definition of the replica that answered
    stated: bool  # ...as that engine stated it (else: as declared for it)


class Pool:
    """Implements `Upstream` (for `/models` and the like) plus `send`, the chat route's
    way in, which knows the model asked for."""

    def __init__(
        self,
        replicas: list[Replica],
        *,
        interval_s: float = 1.0,
        wanted: Callable[[], set[str]] = set,
        resolves: bool = False,
    ) -> None:
        if not replicas:
            raise ValueError("a pool needs at least one engine")
        self.replicas = replicas
        self.interval_s = interval_s
        self.wanted = wanted
        self.resolves = resolves
        # The operator's hook: load `names` into a replica's engine (from the registry).
        self.reload: Callable[[Replica, set[str]], Awaitable[None]] | None = None
        # The server's hook (`onjob serve --start-engine`): seconds until the engine child
        # it is restarting should answer again, None when it is not restarting one.
        self.restart_eta: Callable[[], float | None] | None = None
        self._turn = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def base_url(self) -> str:
        return self.replicas[0].url

    @property
    def checked(self) -> bool:
        return any(r.control is not None for r in self.replicas)

    @property
    def down(self) -> bool:
        """Every engine failed its last health check (not merely dropped an answer)."""
        return self.checked and not any(r.healthy for r in self.replicas)

    # -- the hot path ------------------------------------------------------------------

    def _candidates(self, model: str | None, tried: list[Replica]) -> list[Replica]:
        left = [r for r in self.replicas if r not in tried and model not in r.missing]
        up = [r for r in left if r.state is ReplicaState.UP]
        if up:
            return up
        return sorted(left, key=lambda r: r.state is ReplicaState.DOWN)[:1]

    def _pick(self, model: str | None, tried: list[Replica]) -> Replica | None:
        if len(self.replicas) == 1:  # the usual case, what `_candidates` would give
            replica = self.replicas[0]
            return None if tried or model in replica.missing else replica
        candidates = self._candidates(model, tried)
        if not candidates:
            return None
        # Least outstanding; ties rotate, so an idle pool still spreads sequential clients.
        start = next(self._turn) % len(candidates)
        ordered = candidates[start:] + candidates[:start]
        return min(ordered, key=lambda r: r.outstanding)

    async def send(self, path: str, body: bytes, model: str, *, whole: bool) -> Sent:
        """POST `body` for `model`. `whole`: read the answer here (so that a replica that
        dies before it is complete is replaced by the next); otherwise the response is
        handed back as it starts, for relaying. A non-200 answer raises `UpstreamStatus`,
        except a 404 for an adapter the router sends to (the replica lost it), which is
        tried elsewhere and, with no replica left, raised as `AdapterUnavailable`."""
        tried: list[Replica] = []
        last: Exception | None = None
        while (replica := self._pick(model, tried)) is not None:
            tried.append(replica)
            replica.outstanding += 1
            done = True
            try:
                resp = await replica.upstream.request("POST", path, body)
                # (`wanted` is asked only here and on failure: the router builds the set.)
                if resp.status == 404 and model in self.wanted():
                    last = self._lost(replica, model, await _read_closed(resp))
                    continue
                if resp.status != 200:
                    raise UpstreamStatus(resp.status, await _read_closed(resp), resp.content_type)
                if not whole:
                    done = False
                    return Sent(_Counted(resp, replica), None, replica.logprobs, replica.stated)
                return Sent(resp, await resp.read(), replica.logprobs, replica.stated)
            except (UpstreamUnreachable, StreamCut) as exc:
                self._down(replica, str(exc))
                last = exc
            finally:
                if done:
                    replica.outstanding -= 1
        if last is None or (
            # Those that have it are down, the others are loading it: that is the answer.
            model in self.wanted()
            and not isinstance(last, AdapterUnavailable)
            and any(model in r.missing for r in self.replicas)
        ):
            last = AdapterUnavailable(self._unavailable(model, "no engine that has it answers"))
        raise self._gone(last)

    def _lost(self, replica: Replica, model: str, body: bytes) -> AdapterUnavailable:
        """`replica` answered 404 for an adapter it should serve: it restarted and forgot
        it. Noted, so requests for it go elsewhere, and the replica is checked now."""
        if self.checked:
            replica.missing.add(model)
            self._wake.set()
        said = body[:300].decode(errors="replace")
        return AdapterUnavailable(self._unavailable(model, f"the engine answered 404: {said}"))

    def _unavailable(self, model: str, why: str) -> str:
        return (
            f"The checkpoint `{model}` is not loaded in the engine ({why}); onjob is loading it "
            "again (an engine restart forgets runtime-loaded adapters). Retry in a few seconds."
        )

    def _down(self, replica: Replica, why: str) -> None:
        if replica.control is not None:
            replica.set(ReplicaState.DOWN, why)
            self._wake.set()

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping | None = None
    ) -> UpstreamResponse:
        """Any other request (`GET /models`): the first replica that answers."""
        tried: list[Replica] = []
        last: Exception | None = None
        while (replica := self._pick(None, tried)) is not None:
            tried.append(replica)
            try:
                return await replica.upstream.request(method, path, body, headers)
            except UpstreamUnreachable as exc:
                self._down(replica, str(exc))
                last = exc
        raise self._gone(last or UpstreamUnreachable("no engine to ask"))

    def _gone(self, last: Exception) -> Exception:
        """`last`, or, when no engine could even be connected to or each hung up before
        answering (each one tried), the 503 that tells the client to come back (a dying or
        restarting engine is not a bad gateway)."""
        if isinstance(last, NotConnected | HungUp) and self.checked:
            gone = EngineUnavailable(
                f"No engine answers ({last}); onjob serves again once one is back. "
                "Retry in a few seconds."
            )
            # A restart takes longer than the default wait (7 s for the bundled model on
            # 2 cores): an `openai` client, which waits `Retry-After` twice, would give up
            # in the middle of it. Clients honour up to 60 s.
            eta = self.restart_eta() if self.restart_eta is not None else None
            if eta is not None:
                gone.retry_after_s = min(60, max(gone.retry_after_s, math.ceil(eta)))
            return gone
        return last

    async def aclose(self) -> None:
        await self.stop()
        for r in self.replicas:
            await r.upstream.aclose()
            if r.control is not None:
                await r.control.aclose()

    # -- health ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.checked and self._task is None:
            self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.gather(*(self.check(r) for r in self.replicas if r.control))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)

    async def check(self, replica: Replica) -> None:
        """Health, then adapters: a replica is UP only with every wanted adapter it can
        get (one that cannot be loaded stays in `missing`, and is asked elsewhere)."""
        try:
            loaded = await _adapters(replica)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            replica.healthy = False
            replica.set(ReplicaState.DOWN, f"health check failed: {exc!r}")
            return
        replica.healthy = True
        missing = set() if self.resolves else self.wanted() - loaded
        if missing and self.reload is not None:
            if replica.state is ReplicaState.DOWN:
                replica.set(ReplicaState.RELOADING, "healthy again; loading its adapters")
            replica.missing |= missing
            started = time.monotonic()
            try:
                await self.reload(replica, missing)
            except Exception:  # the operator's errors: logged, the next check tries again
                log.exception("engine %s: reloading %s failed", replica.url, sorted(missing))
            try:
                missing = self.wanted() - await _adapters(replica)
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                replica.healthy = False
                replica.set(ReplicaState.DOWN, f"health check failed: {exc!r}")
                return
            log.info(
                "engine %s: adapters reloaded in %.2f s%s",
                replica.url,
                time.monotonic() - started,
                f"; still missing {sorted(missing)}" if missing else "",
            )
        replica.missing = missing
        if replica.state is not ReplicaState.UP:
            replica.set(ReplicaState.UP, "healthy, adapters loaded")

    def status(self) -> list[dict]:
        return [
            {
                "url": r.url,
                "state": str(r.state),
                "outstanding": r.outstanding,
                "missing": sorted(r.missing),
                "logprobs": r.logprobs,
            }
            for r in self.replicas
        ]


async def _adapters(replica: Replica) -> set[str]:
    """The adapters a healthy replica serves; raises when it is not healthy."""
    control = replica.control
    health = await control.get(f"{replica.root}/health", timeout=_PROBE_TIMEOUT_S)
    health.raise_for_status()
    models = await control.get(f"{replica.url}/models", timeout=_PROBE_TIMEOUT_S)
    models.raise_for_status()
    cards = models.json()["data"]
    stated = next((m.get("logprobs") for m in cards if not m.get("parent")), None)
    if isinstance(stated, str) and (stated, True) != (replica.logprobs, replica.stated):
        log.info("engine %s: its logprobs are %s", replica.url, stated)
        replica.logprobs, replica.stated = stated, True
    return {m["id"] for m in cards if m.get("parent")}


async def _read_closed(resp: UpstreamResponse) -> bytes:
    try:
        return await resp.read()
    finally:
        await resp.aclose()


class _Counted:
    """A relayed response that gives its replica's outstanding count back when closed."""

    def __init__(self, resp: UpstreamResponse, replica: Replica) -> None:
        self._resp = resp
        self._replica: Replica | None = replica
        self.status = resp.status
        self.content_type = resp.content_type

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        finally:
            self._release()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.chunks()

    async def aclose(self) -> None:
        try:
            await self._resp.aclose()
        finally:
            self._release()

    def _release(self) -> None:
        if self._replica is not None:
            self._replica.outstanding -= 1
            self._replica = None
