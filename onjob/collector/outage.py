"""A DuckLake's catalog that does not answer, as the loader lives through it.

When the catalog's Postgres is down or restarting, nothing is lost: the proxy answers as
before, each answer's line is in this server's spool, and the spool loads once the
catalog answers again (every server replays its own). What changes is the loader's pace
and what it says: one line when the outage starts, loads tried again after 1 s, then
2, 4, ... up to `MAX_WAIT_S` (not every `flush_interval_s`, each with a traceback), one
line when it ends with how long it lasted, and its age in `/health` and `onjob status`
meanwhile. Queries that need the catalog (`/admin/status`, a chained call, feedback)
fail with `CatalogUnreachable`, answered as a 503 with `Retry-After`.
"""

from __future__ import annotations

import logging
import time

from . import lake
from .errors import CatalogUnreachable

log = logging.getLogger("onjob.collector")

FIRST_WAIT_S = 1.0
MAX_WAIT_S = 10.0  # a third of the leader's lease: a leader that comes back keeps it


def translated(exc: BaseException) -> CatalogUnreachable | None:
    """`exc` as a `CatalogUnreachable` when it says the catalog could not be reached (its
    message without the catalog's password), else None."""
    if isinstance(exc, CatalogUnreachable):
        return exc
    if not lake.unreachable(exc):
        return None
    while exc.__cause__ is not None:  # DuckDB's own words, not what wrapped them
        exc = exc.__cause__
    first = lake.shown(str(exc)).strip().splitlines()[0]
    return CatalogUnreachable(
        f"the DuckLake's catalog cannot be reached ({first}); answers are still served "
        "and wait in this server's spool until it answers again"
    )


class Outage:
    """Since when the catalog has not answered this loader (None: it answers), and when
    to try again."""

    def __init__(self) -> None:
        self.since: float | None = None  # monotonic
        self._wait = 0.0
        self._next = 0.0

    @property
    def age_s(self) -> float | None:
        return None if self.since is None else time.monotonic() - self.since

    def due(self) -> bool:
        """Whether to try the catalog now: always while it answers, else once its wait
        is over."""
        return self.since is None or time.monotonic() >= self._next

    def failed(self, exc: CatalogUnreachable, backlog_bytes: int) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning(
                "%s (%d bytes in the spool); loads are tried again after %g s, backing off "
                "to every %g s",
                exc,
                backlog_bytes,
                FIRST_WAIT_S,
                MAX_WAIT_S,
            )
        self._wait = min(MAX_WAIT_S, max(FIRST_WAIT_S, self._wait * 2))
        self._next = now + self._wait

    def answered(self) -> None:
        if self.since is not None:
            log.warning(
                "the DuckLake's catalog answers again after %.0f s: the spool loads",
                time.monotonic() - self.since,
            )
        self.since, self._wait = None, 0.0
