"""The deploy tables' rows as typed records: a `checkpoints` row (`Checkpoint`), a
`deployments` row (`Routing`), and an alias's arms (`Arms`, the proxy router's own). Read
with `Store.rows`, so a column the record lacks is an error where the row is read;
Litestar encodes them as the JSON objects the admin API has always answered (datetimes
as ISO strings)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from ..proxy.routing import Arms

Status = Literal["candidate", "canary", "review", "live", "retired", "stranded"]


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """One `checkpoints` row: an adapter, where it lies, and what it serves."""

    name: str
    parent: str | None
    base_model: str | None
    path: str | None
    created: datetime | None
    train_run: str | None
    status: Status


class Routing(msgspec.Struct, frozen=True, kw_only=True):
    """One `deployments` row: an alias's routing from `ts` on, and why it changed.
    `evidence` is the JSON column as DuckDB returns it (text)."""

    ts: datetime
    model_alias: str
    live: str | None
    canary: str | None
    fraction: float | None
    reason: str | None
    actor: str | None
    evidence: str | None

    @property
    def arms(self) -> Arms:
        """Where this row sends its alias's traffic."""
        return Arms(live=self.live, canary=self.canary, fraction=self.fraction or 0.0)


class Change(Routing, frozen=True, kw_only=True):
    """A routing change the operator applied, with what went wrong unloading adapters."""

    warnings: list[str]


__all__ = [
    "CHECKPOINT_COLUMNS",
    "ROUTING_COLUMNS",
    "Arms",
    "Change",
    "Checkpoint",
    "Routing",
]

# The columns in field order, for SELECTs that name them (a later column is not read).
CHECKPOINT_COLUMNS = ", ".join(Checkpoint.__struct_fields__)
ROUTING_COLUMNS = ", ".join(Routing.__struct_fields__)
