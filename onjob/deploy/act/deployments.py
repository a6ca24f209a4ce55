"""Routing changes as `deployments` rows: set a canary, promote it, roll it back.

Each change is one transaction: a `deployments` row (alias, live, canary, fraction,
reason, actor, evidence) and the checkpoints' statuses (`canary`, `live`,
`retired`). The latest row per alias is the routing `onjob serve` starts with.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from ...collector import Store
from ..decide.evidence import stored_json
from ..errors import DeployError, RoutingChanged
from ..records import ROUTING_COLUMNS, Arms, Routing
from . import registry


def current(store: Store) -> Mapping[str, Routing]:
    """The latest routing per alias."""
    rows = store.rows(
        Routing,
        f"SELECT {ROUTING_COLUMNS} FROM deployments "
        "QUALIFY row_number() OVER (PARTITION BY model_alias ORDER BY ts DESC) = 1",
    )
    return {r.model_alias: r for r in rows}


def routes(store: Store, defaults: dict[str, str | None]) -> Mapping[str, Arms]:
    """Every alias's arms: its latest deployment, else its configured live checkpoint."""
    out = {alias: Arms(live=live) for alias, live in defaults.items()}
    for alias, row in current(store).items():
        out[alias] = row.arms
    return out


class _Replaced(msgspec.Struct, frozen=True, kw_only=True):
    """An alias's live before its latest change of live (`previous`; None: the base)."""

    model_alias: str
    before: str | None


def previous(store: Store) -> dict[str, str]:
    """Per alias, the live adapter the latest change of live replaced (a promotion's old
    live), read from the log: what the operator keeps loaded so a revert to it is
    instant, after a restart as before it. None for an alias whose previous live was the
    base model."""
    rows = store.rows(
        _Replaced,
        """
        SELECT model_alias, before FROM (
            SELECT model_alias, ts, live,
                   lag(live) OVER (PARTITION BY model_alias ORDER BY ts) AS before,
                   row_number() OVER (PARTITION BY model_alias ORDER BY ts) AS k
            FROM deployments
        )
        WHERE k > 1 AND live IS DISTINCT FROM before
        QUALIFY row_number() OVER (PARTITION BY model_alias ORDER BY ts DESC) = 1
        """,
    )
    return {r.model_alias: r.before for r in rows if r.before}


def history(store: Store, limit: int = 100) -> list[Routing]:
    return store.rows(
        Routing, f"SELECT {ROUTING_COLUMNS} FROM deployments ORDER BY ts DESC LIMIT ?", [limit]
    )


def arms_of(store: Store, alias: str, default_live: str | None) -> Arms:
    row = current(store).get(alias)
    return Arms(live=default_live) if row is None else row.arms


def set_canary(
    store: Store,
    alias: str,
    checkpoint: str,
    fraction: float,
    *,
    default_live,
    reason,
    actor,
    evidence=None,
) -> Routing:
    if not 0 < fraction <= 1:
        raise DeployError(f"canary fraction {fraction} is not in (0, 1]")
    with store.transaction():
        if registry.get(store, checkpoint) is None:
            raise DeployError(f"{checkpoint!r} is not in the checkpoints table")
        now = arms_of(store, alias, default_live)
        if now.canary and now.canary != checkpoint:
            raise DeployError(
                f"{alias} already has a canary ({now.canary}): promote or roll it back first"
            )
        if checkpoint == now.live:
            raise DeployError(f"{checkpoint} is already live for {alias}")
        _record(
            store,
            alias,
            now.live,
            checkpoint,
            fraction,
            reason,
            actor,
            evidence,
            statuses={checkpoint: "canary"},
        )
    return current(store)[alias]


def promote(
    store: Store,
    alias: str,
    *,
    default_live,
    reason,
    actor,
    evidence=None,
    expected: Routing | None = None,
) -> Routing:
    """The canary becomes live. With `expected` (the `deployments` row a decision was made
    on), only if the routing is still that one: checked inside the transaction, so a
    decision never applies to a canary its evidence is not about."""
    with store.transaction():
        _check(store, alias, expected)
        now = arms_of(store, alias, default_live)
        if not now.canary:
            raise DeployError(f"{alias} has no canary to promote")
        statuses = {now.canary: "live"}
        if now.live:
            statuses[now.live] = "retired"
        _record(store, alias, now.canary, None, 0.0, reason, actor, evidence, statuses=statuses)
    return current(store)[alias]


def rollback(
    store: Store,
    alias: str,
    *,
    default_live,
    reason,
    actor,
    evidence=None,
    expected: Routing | None = None,
) -> Routing:
    """The canary is retired; `expected` as for `promote`."""
    with store.transaction():
        _check(store, alias, expected)
        now = arms_of(store, alias, default_live)
        if not now.canary:
            raise DeployError(f"{alias} has no canary to roll back")
        _record(
            store,
            alias,
            now.live,
            None,
            0.0,
            reason,
            actor,
            evidence,
            statuses={now.canary: "retired"},
        )
    return current(store)[alias]


def reject(
    store: Store, alias: str, checkpoint: str, *, default_live, reason, actor, evidence=None
) -> Routing:
    """A candidate stopped before serving anyone: retired, and a `deployments` row with the
    routing unchanged, so the decision and its evidence are in the log like any other."""
    with store.transaction():
        now = arms_of(store, alias, default_live)
        _record(
            store,
            alias,
            now.live,
            now.canary,
            now.fraction if now.canary else 0.0,
            reason,
            actor,
            evidence,
            statuses={checkpoint: "retired"},
        )
    return current(store)[alias]


def _check(store: Store, alias: str, expected: Routing | None) -> None:
    if expected is None:
        return
    now = current(store).get(alias)
    if now is None or (now.live, now.canary, now.ts) != (
        expected.live,
        expected.canary,
        expected.ts,
    ):
        shown = f"live {now.live or 'base'}, canary {now.canary}" if now else "none"
        raise RoutingChanged(
            f"{alias}'s routing changed since the evidence was gathered (now {shown}): "
            "the decision is dropped"
        )


def _record(store, alias, live, canary, fraction, reason, actor, evidence, *, statuses) -> None:
    """Inside the caller's transaction: the `deployments` row and the statuses."""
    store.con.execute(
        "INSERT INTO deployments (ts, model_alias, live, canary, fraction, reason, actor, "
        "evidence) VALUES (now(), ?, ?, ?, ?, ?, ?, ?)",
        [
            alias,
            live,
            canary,
            fraction,
            reason,
            actor,
            stored_json(evidence) if evidence is not None else None,
        ],
    )
    for name, status in statuses.items():
        registry.set_status(store, name, status)
