"""The questions other parts ask of the logged traffic, as plain functions of a `Store`.

Run them on the collector's database thread (`await collector.query(fn)`) inside
`onjob serve`, or on a `Store` of your own when the server is not running.
"""

from __future__ import annotations

import msgspec

from .linear import rebuilt
from .store import Store


class LoggedExchange(msgspec.Struct, kw_only=True):
    """One logged exchange as its readers outside the collector take it (feedback on it,
    a Responses call continuing it or fetching it back): its request rebuilt whole
    (`exchanges_rebuilt`). JSON columns as their text."""

    id: str
    trajectory_id: str | None
    turn: int | None
    api_key_id: str | None
    checkpoint: str | None
    status: int
    api: str | None
    api_object: str | None  # a stored Response and its input items
    request: str
    response: str | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]] | None
    parent_id: str | None


_LOGGED = ", ".join(f.name for f in msgspec.structs.fields(LoggedExchange))


def exchange(store: Store, exchange_id: str) -> LoggedExchange | None:
    rows = store.rows(
        LoggedExchange,
        f"SELECT {_LOGGED} FROM exchanges_rebuilt(?, false)",
        [[exchange_id]],
    )
    return rows[0] if rows else None


class Owner(msgspec.Struct, frozen=True):
    """The API key a conversation is logged under (None: sent without one)."""

    api_key_id: str | None


def trajectory_owner(store: Store, trajectory_id: str) -> Owner | None:
    """The key of a conversation (None when there is no such conversation): every turn's,
    since a trajectory never spans two keys (`trajectories.scoped`)."""
    rows = store.rows(
        Owner,
        "SELECT api_key_id FROM exchanges WHERE trajectory_id = ? ORDER BY turn, ts LIMIT 1",
        [trajectory_id],
    )
    return rows[0] if rows else None


def trajectory(store: Store, trajectory_id: str) -> list[dict]:
    """The successful turns of one conversation, in order, every column (the collector's
    tests read linear storage back whole with it)."""
    ids = (
        "SELECT id FROM exchanges WHERE trajectory_id = ? AND status < 400 AND source <> 'resample'"
    )
    return store.dicts(f"SELECT * FROM {rebuilt(ids)} ORDER BY turn, ts", [trajectory_id])
