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


def trajectory_owner(store: Store, trajectory_id: str) -> list[dict]:
    """The API key id of a conversation ([] when there is none): every turn's, since a
    trajectory never spans two keys (`trajectories.scoped`)."""
    return store.query(
        "SELECT api_key_id FROM exchanges WHERE trajectory_id = ? ORDER BY turn, ts LIMIT 1",
        [trajectory_id],
    )


def trajectory(store: Store, trajectory_id: str) -> list[dict]:
    """The successful turns of one conversation, in order."""
    ids = (
        "SELECT id FROM exchanges WHERE trajectory_id = ? AND status < 400 AND source <> 'resample'"
    )
    return store.query(f"SELECT * FROM {rebuilt(ids)} ORDER BY turn, ts", [trajectory_id])


def scenarios(store: Store) -> list[dict]:
    return store.query("SELECT * FROM scenarios ORDER BY count DESC, first_seen")


def feedback(store: Store, limit: int = 1000) -> list[dict]:
    return store.query("SELECT * FROM feedback ORDER BY ts DESC LIMIT ?", [limit])
