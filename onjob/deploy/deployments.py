"""Routing changes as `deployments` rows: set a canary, promote it, roll it back.

Each change is one transaction: a `deployments` row (alias, live, canary, fraction,
reason, actor, evidence) and the checkpoints' statuses (`canary`, `live`,
`retired`). The latest row per alias is the routing `onjob serve` starts with.
"""

from __future__ import annotations

import json

from ..collector import Store
from . import registry
from .errors import DeployError, RoutingChanged


def current(store: Store) -> dict[str, dict]:
    """The latest routing per alias."""
    rows = store.query(
        "SELECT * FROM deployments "
        "QUALIFY row_number() OVER (PARTITION BY model_alias ORDER BY ts DESC) = 1"
    )
    return {r["model_alias"]: r for r in rows}


def routes(store: Store, defaults: dict[str, str | None]) -> dict[str, dict]:
    """Every alias's arms: its latest deployment, else its configured live checkpoint."""
    out = {
        alias: {"live": live, "canary": None, "fraction": 0.0} for alias, live in defaults.items()
    }
    for alias, row in current(store).items():
        out[alias] = {
            "live": row["live"],
            "canary": row["canary"],
            "fraction": row["fraction"] or 0.0,
        }
    return out


def previous(store: Store) -> dict[str, str]:
    """Per alias, the live adapter the latest change of live replaced (a promotion's old
    live), read from the log: what the operator keeps loaded so a revert to it is
    instant, after a restart as before it. None for an alias whose previous live was the
    base model."""
    rows = store.query(
        """
        SELECT model_alias, before FROM (
            SELECT model_alias, ts, live,
                   lag(live) OVER (PARTITION BY model_alias ORDER BY ts) AS before,
                   row_number() OVER (PARTITION BY model_alias ORDER BY ts) AS k
            FROM deployments
        )
        WHERE k > 1 AND live IS DISTINCT FROM before
        QUALIFY row_number() OVER (PARTITION BY model_alias ORDER BY ts DESC) = 1
        """
    )
    return {r["model_alias"]: r["before"] for r in rows if r["before"]}


def history(store: Store, limit: int = 100) -> list[dict]:
    return store.query("SELECT * FROM deployments ORDER BY ts DESC LIMIT ?", [limit])


def arms_of(
    store: Store, alias: str, default_live: str | None
) -> tuple[str | None, str | None, float]:
    row = current(store).get(alias)
    if row is None:
        return default_live, None, 0.0
    return row["live"], row["canary"], row["fraction"] or 0.0


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
) -> dict:
    if not 0 < fraction <= 1:
        raise DeployError(f"canary fraction {fraction} is not in (0, 1]")
    with store.transaction():
        if registry.get(store, checkpoint) is None:
            raise DeployError(f"{checkpoint!r} is not in the checkpoints table")
        live, canary, _ = arms_of(store, alias, default_live)
        if canary and canary != checkpoint:
            raise DeployError(
                f"{alias} already has a canary ({canary}): promote or roll it back first"
            )
        if checkpoint == live:
            raise DeployError(f"{checkpoint} is already live for {alias}")
        _record(
            store,
            alias,
            live,
            checkpoint,
            fraction,
            reason,
            actor,
            evidence,
            statuses={checkpoint: "canary"},
        )
    return current(store)[alias]


def promote(
    store: Store, alias: str, *, default_live, reason, actor, evidence=None, expected=None
) -> dict:
    """The canary becomes live. With `expected` (the `deployments` row a decision was made
    on), only if the routing is still that one: checked inside the transaction, so a
    decision never applies to a canary its evidence is not about."""
    with store.transaction():
        _check(store, alias, expected)
        live, canary, _ = arms_of(store, alias, default_live)
        if not canary:
            raise DeployError(f"{alias} has no canary to promote")
        statuses = {canary: "live"}
        if live:
            statuses[live] = "retired"
        _record(store, alias, canary, None, 0.0, reason, actor, evidence, statuses=statuses)
    return current(store)[alias]


def rollback(
    store: Store, alias: str, *, default_live, reason, actor, evidence=None, expected=None
) -> dict:
    """The canary is retired; `expected` as for `promote`."""
    with store.transaction():
        _check(store, alias, expected)
        live, canary, _ = arms_of(store, alias, default_live)
        if not canary:
            raise DeployError(f"{alias} has no canary to roll back")
        _record(
            store, alias, live, None, 0.0, reason, actor, evidence, statuses={canary: "retired"}
        )
    return current(store)[alias]


def reject(
    store: Store, alias: str, checkpoint: str, *, default_live, reason, actor, evidence=None
) -> dict:
    """A candidate stopped before serving anyone: retired, and a `deployments` row with the
    routing unchanged, so the decision and its evidence are in the log like any other."""
    with store.transaction():
        live, canary, fraction = arms_of(store, alias, default_live)
        _record(
            store,
            alias,
            live,
            canary,
            fraction if canary else 0.0,
            reason,
            actor,
            evidence,
            statuses={checkpoint: "retired"},
        )
    return current(store)[alias]


def _check(store: Store, alias: str, expected: dict | None) -> None:
    if expected is None:
        return
    now = current(store).get(alias)
    key = ("live", "canary", "ts")
    if now is None or any(now[k] != expected[k] for k in key):
        shown = f"live {now['live'] or 'base'}, canary {now['canary']}" if now else "none"
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
            json.dumps(evidence) if evidence is not None else None,
        ],
    )
    for name, status in statuses.items():
        store.con.execute("UPDATE checkpoints SET status = ? WHERE name = ?", [status, name])
