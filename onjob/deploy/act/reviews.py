"""Canaries ready for review: won their pairs where only their coach judged them
(`trust.release_mode` is `review`), so a person decides.

A review is a `reviews` row naming the routing it is about (the `deployments` row's
`ts`), with the verdict's reason and evidence, and the checkpoint's status `review`.
The routing does not change: the canary keeps serving its share while it waits, and the
loop keeps checking its guards on real traffic (a tripped one still rolls it back), but
draws no more pairs and trains nothing. `onjob promote` or `onjob rollback` ends it, as
they end any canary (or the loop, once users' feedback agrees with the coach: the mode
is then `users`); a review of another routing is not this one's.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import msgspec

from ...collector import Store
from ..decide import trust
from ..decide.evidence import Evidence, ReleaseMode, stored_json
from ..records import Routing
from ..settings import DeploySettings
from . import registry
from .deployments import current


class Review(msgspec.Struct, frozen=True, kw_only=True):
    """A canary waiting for a person: its lineage, the checkpoint, the routing it is the
    canary of, since when, and the verdict's reason and evidence (as stored: JSON)."""

    model_alias: str
    checkpoint: str
    routing_ts: datetime
    ts: datetime
    reason: str | None
    evidence: dict[str, Any] | None


class ReleaseStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Who may promote (`mode`) and each lineage's canary waiting for review."""

    mode: ReleaseMode
    reviews: dict[str, Review]


def mark(
    store: Store, alias: str, routing: Routing, *, reason: str, evidence: Evidence
) -> Review | None:
    """Record that `routing`'s canary is ready for review (once per routing)."""
    with store.transaction():
        found = _of(store, alias, routing)
        if found is None:
            store.con.execute(
                "INSERT INTO reviews (model_alias, checkpoint, routing_ts, ts, reason, "
                "evidence) VALUES (?, ?, ?, now(), ?, ?)",
                [alias, routing.canary, routing.ts, reason, stored_json(evidence)],
            )
            registry.set_status(store, routing.canary, "review", only_from=("canary",))
    return _of(store, alias, routing)


def of(store: Store, alias: str, routing: Routing | None) -> Review | None:
    """The review of `routing`'s canary, if it is waiting for one."""
    if not routing or not routing.canary:
        return None
    return _of(store, alias, routing)


class _Stored(msgspec.Struct, frozen=True, kw_only=True):
    """A `reviews` row as DuckDB returns it: the evidence as JSON text."""

    model_alias: str
    checkpoint: str
    routing_ts: datetime
    ts: datetime
    reason: str | None
    evidence: str | None


def _of(store: Store, alias: str, routing: Routing) -> Review | None:
    rows = store.rows(
        _Stored,
        "SELECT * FROM reviews WHERE model_alias = ? AND checkpoint = ? AND routing_ts = ?",
        [alias, routing.canary, routing.ts],
    )
    if not rows:
        return None
    row = rows[0]
    return Review(
        model_alias=row.model_alias,
        checkpoint=row.checkpoint,
        routing_ts=row.routing_ts,
        ts=row.ts,
        reason=row.reason,
        evidence=json.loads(row.evidence) if isinstance(row.evidence, str) else row.evidence,
    )


def waiting(store: Store) -> dict[str, Review]:
    """Per alias, the review its current canary waits for (the status page's list)."""
    out = {}
    for alias, routing in current(store).items():
        found = of(store, alias, routing)
        if found is not None:
            out[alias] = found
    return out


def status(store: Store, settings: DeploySettings) -> ReleaseStatus:
    """The release mode and the reviews waiting (`/admin/status`, `onjob status`, the
    dashboard)."""
    return ReleaseStatus(mode=trust.release_mode(store, settings), reviews=waiting(store))
