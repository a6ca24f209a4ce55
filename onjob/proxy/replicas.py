"""Several proxy processes in front of one loader: what a proxy-only process shares with
the server that owns the database.

`onjob serve` (the primary: the database, the loader, the judge, the trainer, the
admin API and the dashboard) and any number of proxy-only processes (`onjob serve
--role proxy --primary URL`, or the extra workers of `onjob serve --workers N`) share
the spool directory. What else they must agree on travels through it or over HTTP:

- the routing (each alias's live checkpoint, canary and fraction): the primary writes
  `routing.json` in the spool directory whenever it changes (`publish`), and a proxy-only
  process applies it when the file changes (`follow`), so a promotion or a rollback
  reaches every process within `poll_s`;
- what needs the database (a stored Response, `previous_response_id`, feedback, the
  admin API, the dashboard) is forwarded to the primary as it came (`Forwarder`).

The arm needs nothing shared: it is drawn from the conversation itself (`routing.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import httpx
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from .errors import PrimaryUnreachable
from .routing import Router

log = logging.getLogger("onjob.proxy")

ROUTING = "routing.json"

# Hop-by-hop headers and those the forwarded body's framing sets anew.
_HOP = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te"}
)
# This process checked the page's Origin against the Host it was reached by (`auth.py`);
# the primary sees this process's own Host, which the Origin would not match.
_NOT_SENT = _HOP | {"origin"}


def publish(router: Router, directory: Path) -> None:
    """Write the router's arms where proxy-only processes read them (atomically)."""
    state = {
        alias: {"live": a.live, "canary": a.canary, "fraction": a.fraction}
        for alias, a in router.arms.items()
    }
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{ROUTING}.{os.getpid()}"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, directory / ROUTING)


def apply(router: Router, directory: Path) -> bool:
    """Set the router's arms from the primary's file; False if there is none (yet)."""
    try:
        state = json.loads((directory / ROUTING).read_text())
    except FileNotFoundError:
        return False
    for alias, arms in state.items():
        router.set(alias, arms["live"], arms["canary"], arms["fraction"])
    return True


async def follow(router: Router, directory: Path, poll_s: float = 0.5) -> None:
    """Apply the primary's routing whenever its file changes (until cancelled)."""
    seen = None
    while True:
        try:
            stamp = (directory / ROUTING).stat().st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp != seen:
            try:
                apply(router, directory)
                seen = stamp
            except (OSError, ValueError, KeyError) as exc:  # a file half-copied by hand
                log.warning("could not read %s: %s", directory / ROUTING, exc)
        await asyncio.sleep(poll_s)


class Forwarder:
    """Relays a request to the primary server as it came, and its answer back as it comes."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 300.0,
        follow: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.timeout = httpx.Timeout(timeout_s, connect=5.0)
        self.follow = follow  # where the primary is now, when the bucket says (fail-over)
        self.url = url.rstrip("/")
        self.client = httpx.AsyncClient(base_url=self.url, timeout=self.timeout)
        self._old: list[httpx.AsyncClient] = []

    def _retarget(self) -> None:
        url = (self.follow() or "").rstrip("/")
        if url and url != self.url:
            log.warning("forwarding to the server that loads now: %s (was %s)", url, self.url)
            self._old.append(self.client)  # requests in flight finish on it
            self.url = url
            self.client = httpx.AsyncClient(base_url=url, timeout=self.timeout)

    async def __call__(self, request: Request) -> Response:
        self._retarget()
        body = await request.body()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _NOT_SENT]
        outgoing = self.client.build_request(
            request.method,
            request.url.path,
            params=request.url.query,
            headers=headers,
            content=body,
        )
        try:
            answer = await self.client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            raise PrimaryUnreachable(
                f"This proxy forwards {request.url.path} to the onjob server at {self.url}, "
                f"which cannot be reached: {exc!r}"
            ) from exc
        back = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        return Stream(
            answer.aiter_raw(),
            status_code=answer.status_code,
            headers=back,
            background=BackgroundTask(answer.aclose),
        )

    async def aclose(self) -> None:
        for client in (*self._old, self.client):
            with contextlib.suppress(Exception):
                await client.aclose()
