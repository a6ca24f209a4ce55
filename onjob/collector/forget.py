"""Deleting logged traffic and everything derived from it: `onjob forget`, the admin API's
`POST /admin/forget`, and `collector.retention_days`.

Always whole conversations (a later turn repeats the earlier ones), by trajectory, API key
or date, with every row derived from them: exchanges, trajectories, the groups, judgements
and scores that saw them, feedback, scenarios and openings left empty. A rule kept in
`forgotten` stops a spool line loaded later from bringing them back; a checkpoint moves
the deletion out of the WAL, `scrub` removes their lines set aside in `failed/`, and
what onjob cannot reach is listed (`NOT_REACHED`), with the checkpoints already trained
on them. docs/collector.md, "Forgetting", has the whole rule.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec

from . import lake
from .errors import CollectorError, StorageError
from .ids import new_id
from .lines import PIECES
from .scope import lineage_flags
from .spool import CLOSED, FAILED
from .store import LAKE_RETRIES, Store

# Copies of deleted data that `forget` cannot reach, said in every answer.
NOT_REACHED = (
    "free blocks of the database file, until DuckDB reuses them (to drop them, copy the "
    "database into a new file: docs/security.md, Deletion)",
    "backups, snapshots and copies of the database or the spool taken outside onjob",
    "exports (`onjob export`) and training snapshots copied elsewhere",
    "the judge provider's own logs of the prompts it judged (RULER on a remote model)",
    "adapters already trained on the data (listed in `trained_on`)",
)


class ForgetError(CollectorError):
    """A request to forget that names nothing, or more than one thing."""


@dataclass(frozen=True)
class Forget:
    """What to delete: exactly one of a trajectory id, an API key id, or a moment before
    which every conversation ended."""

    trajectory: str | None = None
    api_key: str | None = None
    before: dt.datetime | None = None

    def __post_init__(self) -> None:
        given = [x for x in (self.trajectory, self.api_key, self.before) if x is not None]
        if len(given) != 1:
            raise ForgetError("name exactly one of: a trajectory, an API key, a date (before)")
        if self.before is not None and self.before.tzinfo is None:
            object.__setattr__(self, "before", self.before.replace(tzinfo=dt.UTC))

    def describe(self) -> str:
        if self.trajectory is not None:
            return f"trajectory {self.trajectory}"
        if self.api_key is not None:
            return f"API key {self.api_key}"
        return f"conversations ended before {self.before.isoformat()}"


class Tainted(msgspec.Struct, kw_only=True):
    """A checkpoint trained on deleted data (or on top of one that was), with what taking it
    out of service would do. `lineage` is the one its run trained (`alias` or
    `alias@tenant`; None for a run before lineages or a checkpoint added by hand)."""

    name: str
    status: str
    train_run: str | None
    path: str | None
    parent: str | None
    lineage: str | None = None
    removing: str | None = None  # what taking it out of service would do, and how


@dataclass
class Forgotten:
    """How many rows each table lost, and the checkpoints trained on deleted data."""

    what: str
    exchanges: int = 0
    trajectories: int = 0
    scenarios: int = 0
    groups: int = 0
    members: int = 0
    judgements: int = 0
    scores: int = 0
    feedback: int = 0
    openings: int = 0  # shared starts (`linear.py`) no remaining row is stored against
    trained_on: list[Tainted] = field(default_factory=list)
    checkpointed: bool = False  # the write-ahead log no longer holds the deleted rows
    set_aside_removed: int = 0  # lines removed from the spool's failed/ (`scrub`)
    set_aside_kept: int = 0  # files left in failed/: lines the rule could not tie to it
    not_reached: tuple[str, ...] = NOT_REACHED
    # May be long: the stitcher, the snapshot files and `scrub` need them, not users.
    trajectory_ids: list[str] = field(default_factory=list)
    exchange_ids: list[str] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)

    def removed(self, snapshots: list[str]) -> Removed:
        """What the deletion removed, as users are told it (the ids left out), with the
        training snapshots that held the deleted groups."""
        told = {k: v for k, v in asdict(self).items() if k in Removed.__struct_fields__}
        return Removed(**told, snapshots_removed=snapshots)


class Removed(msgspec.Struct, kw_only=True):
    """`onjob forget`'s answer, from the admin API or the file: how many rows each table
    lost, the checkpoints already trained on them (each with what taking it out of service
    would do), and what the deletion did not reach."""

    what: str
    exchanges: int
    trajectories: int
    scenarios: int
    groups: int
    members: int
    judgements: int
    scores: int
    feedback: int
    openings: int
    trained_on: list[Tainted]
    checkpointed: bool
    set_aside_removed: int
    set_aside_kept: int
    not_reached: list[str]
    snapshots_removed: list[str] = []


def parse_date(text: str) -> dt.datetime:
    """`2026-05-01` or an ISO date-time; a moment without a zone is UTC."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ForgetError(f"not a date: {text!r} (e.g. 2026-05-01 or 2026-05-01T12:00)") from exc
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


# The conversations to delete, per criterion. Resampled exchanges carry no API key, and a
# conversation's last activity is its own turns', not when the judge re-sampled it.
_DOOMED = {
    "trajectory": "SELECT DISTINCT trajectory_id AS id FROM exchanges WHERE trajectory_id = ?",
    "api_key": "SELECT DISTINCT trajectory_id AS id FROM exchanges WHERE api_key_id = ?",
    "before": "SELECT trajectory_id AS id FROM exchanges WHERE source <> 'resample' "
    "GROUP BY trajectory_id HAVING max(ts) < ?",
}


def forget(store: Store, what: Forget, *, actor: str = "cli") -> Forgotten:
    """Delete `what` and all derived from it, in one transaction; record the rule."""
    kind, value = (
        ("trajectory", what.trajectory)
        if what.trajectory is not None
        else ("api_key", what.api_key)
        if what.api_key is not None
        else ("before", what.before)
    )
    store.forgot()  # a parent recent loads inserted may be among the deleted
    attempts = LAKE_RETRIES if store.in_lake else 1
    for attempt in range(attempts):
        out = Forgotten(what.describe())
        try:
            with store.transaction() as con:
                _delete_all(con, out, kind, value, actor, lake=store.in_lake)
            break
        except StorageError as exc:
            if not (store.in_lake and lake.clashed(exc)) or attempt == attempts - 1:
                raise
            # Another server committed to the same tables first (DuckLake's commits are
            # optimistic): the deletion is made again on what it wrote.
            time.sleep(0.05 * (attempt + 1))
    out.checkpointed = store.checkpoint()
    return out


def _delete_all(con, out: Forgotten, kind: str, value, actor: str, *, lake: bool) -> None:
    """Within `forget`'s transaction: the rows doomed by the rule, then the rule itself."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE doomed_t AS {_DOOMED[kind]}", [value])
    con.execute(
        "CREATE OR REPLACE TEMP TABLE doomed_e AS SELECT id, scenario_id FROM exchanges "
        "WHERE trajectory_id IN (SELECT id FROM doomed_t)"
    )
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE doomed_g AS
        SELECT id FROM groups WHERE prefix_exchange IN (SELECT id FROM doomed_e)
        UNION
        SELECT group_id FROM members WHERE exchange_id IN (SELECT id FROM doomed_e)
            OR trajectory_id IN (SELECT id FROM doomed_t)
        """
    )
    out.trained_on = _trained_on(con)
    out.trajectory_ids = [r[0] for r in con.execute("SELECT id FROM doomed_t").fetchall()]
    out.exchange_ids = [r[0] for r in con.execute("SELECT id FROM doomed_e").fetchall()]
    out.group_ids = [r[0] for r in con.execute("SELECT id FROM doomed_g").fetchall()]
    scenarios = [r[0] for r in con.execute("SELECT DISTINCT scenario_id FROM doomed_e").fetchall()]
    out.scores = _delete(
        con,
        "scores WHERE group_id IN (SELECT id FROM doomed_g) OR member_id IN "
        "(SELECT id FROM members WHERE group_id IN (SELECT id FROM doomed_g))",
    )
    out.judgements = _delete(con, "judgements WHERE group_id IN (SELECT id FROM doomed_g)")
    out.members = _delete(con, "members WHERE group_id IN (SELECT id FROM doomed_g)")
    out.groups = _delete(con, "groups WHERE id IN (SELECT id FROM doomed_g)")
    feedback = (
        "feedback WHERE trajectory_id IN (SELECT id FROM doomed_t) "
        "OR exchange_id IN (SELECT id FROM doomed_e)"
    )
    if kind == "api_key":
        out.feedback = _delete(con, feedback + " OR api_key_id = ?", [value])
    else:
        out.feedback = _delete(con, feedback)
    out.exchanges = _delete(con, "exchanges WHERE id IN (SELECT id FROM doomed_e)")
    if lake:  # a row of parts (`lake.PARTS`)
        _delete(con, "trajectory_parts WHERE id IN (SELECT id FROM doomed_t)")
        out.trajectories = len(out.trajectory_ids)
    else:
        out.trajectories = _delete(con, "trajectories WHERE id IN (SELECT id FROM doomed_t)")
    out.openings = _delete(
        con,
        "openings WHERE id NOT IN (SELECT DISTINCT parent_id FROM exchanges "
        "WHERE parent_id IS NOT NULL)",
    )
    out.scenarios = _recount_scenarios(con, scenarios, lake=lake)
    _remember(con, kind, value, out.exchanges, actor)
    for temp in ("doomed_t", "doomed_e", "doomed_g"):
        con.execute(f"DROP TABLE {temp}")


class _Line(msgspec.Struct):
    """What ties a spool line to a deletion (records.py's fields of that name)."""

    id: str | None = None
    ts: float | None = None
    api_key_id: str | None = None
    trajectory_id: str | None = None
    exchange_id: str | None = None


_line = msgspec.json.Decoder(_Line).decode


def scrub(spool: Path, what: Forget, out: Forgotten) -> None:
    """Remove from the lines set aside in `spool` (`failed/`, `.pieces/`) those that belong
    to what `forget` deleted: a key's lines, a conversation's (by its id, or by the ids of
    its exchanges and feedback), lines older than a date. A file left with no line goes
    with its `.error`; the count of files left is in `out` (their lines may belong to a
    conversation the rule cannot name: a line not yet placed carries no trajectory)."""
    trajectories, exchanges = set(out.trajectory_ids), set(out.exchange_ids)
    before = what.before.timestamp() if what.before is not None else None

    def doomed(text: bytes) -> bool:
        try:
            line = _line(text)
        except msgspec.DecodeError:
            return False  # not a record: kept, and counted among the files left
        if what.api_key is not None:
            return line.api_key_id == what.api_key
        if before is not None:
            return line.ts is not None and line.ts < before
        return (
            line.trajectory_id in trajectories
            or line.id in exchanges
            or line.exchange_id in exchanges
        )

    for directory in (spool / FAILED, spool / PIECES):
        for path in sorted(directory.glob(f"*{CLOSED}")) if directory.is_dir() else []:
            lines = path.read_bytes().splitlines(True)
            kept = [line for line in lines if not (line.strip() and doomed(line))]
            if len(kept) == len(lines):
                out.set_aside_kept += directory.name == FAILED
                continue
            out.set_aside_removed += len(lines) - len(kept)
            if any(line.strip() for line in kept):
                path.write_bytes(b"".join(kept))
                out.set_aside_kept += directory.name == FAILED
            else:
                path.unlink()
                path.with_name(path.name + ".error").unlink(missing_ok=True)


def _delete(con, what: str, params: list | None = None) -> int:
    return con.execute(f"DELETE FROM {what}", params or []).fetchone()[0]


def _trained_on(con) -> list[Tainted]:
    """Checkpoints whose run used a doomed group, and every checkpoint trained on top of
    one of them (it inherits its weights)."""
    cur = con.execute(
        """
        WITH RECURSIVE tainted(name) AS (
            SELECT c.name FROM checkpoints c JOIN train_runs t ON t.id = c.train_run
            WHERE list_has_any(t.groups_used, (SELECT coalesce(list(id), []) FROM doomed_g))
            UNION
            SELECT c.name FROM checkpoints c JOIN tainted ON c.parent = tainted.name
        )
        SELECT c.name, c.status, c.train_run, c.path, c.parent,
               json_extract_string(t.config, '$.lineage') AS lineage
        FROM checkpoints c LEFT JOIN train_runs t ON t.id = c.train_run
        WHERE c.name IN (SELECT name FROM tainted) ORDER BY c.created, c.name
        """
    )
    names = [d[0] for d in cur.description]
    found = [Tainted(**dict(zip(names, row, strict=True))) for row in cur.fetchall()]
    return [msgspec.structs.replace(c, removing=_removing(c)) for c in found]


def _removing(c: Tainted) -> str:
    """What taking the checkpoint out of service would do, said with the answer, and the
    command that does it."""
    which = lineage_flags(c.lineage or "ALIAS")
    return {
        "canary": f"`onjob rollback {which}` retires it; its lineage's live serves alone",
        "review": f"`onjob rollback {which}` retires it; its lineage's live serves alone",
        "live": f"it is the live adapter of {c.lineage or 'its alias'}: promote another "
        f"in its place (`onjob canary {which} CKPT`, then `onjob promote {which}`; its "
        f"parent is {c.parent or 'the base model'})",
    }.get(c.status, "it serves no one")


_COUNTED = """
    SELECT count(*) FROM exchanges e WHERE e.scenario_id = {row}.id
      AND e.turn = 0 AND e.status < 400 AND e.source <> 'resample'
"""


def _recount_scenarios(con, scenario_ids: list[str], *, lake: bool = False) -> int:
    """A scenario counts its conversations (turns 0 that were answered): recount those that
    lost some; delete those left with none. Returns how many were deleted. On a lake, a
    scenario's parts (`lake.PARTS`) become one part holding the count."""
    if not scenario_ids:
        return 0
    if lake:
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE recounted AS
            SELECT s.id, s.key, s.keyed, s.first_seen, ({_COUNTED.format(row="s")}) AS count,
                   EXISTS (SELECT 1 FROM exchanges e WHERE e.scenario_id = s.id) AS used
            FROM scenarios s WHERE list_contains(?, s.id)
            """,
            [scenario_ids],
        )
        con.execute("DELETE FROM scenario_parts WHERE list_contains(?, id)", [scenario_ids])
        con.execute(
            "INSERT INTO scenario_parts SELECT id, key, keyed, first_seen, count "
            "FROM recounted WHERE count > 0 OR used"
        )
        (gone,) = con.execute(
            "SELECT count(*) FROM recounted WHERE count = 0 AND NOT used"
        ).fetchone()
        con.execute("DROP TABLE recounted")
        return gone
    con.execute(
        """
        UPDATE scenarios SET count = (
            SELECT count(*) FROM exchanges e WHERE e.scenario_id = scenarios.id
              AND e.turn = 0 AND e.status < 400 AND e.source <> 'resample')
        WHERE list_contains(?, id)
        """,
        [scenario_ids],
    )
    return _delete(
        con,
        "scenarios WHERE list_contains(?, id) AND count = 0 "
        "AND NOT EXISTS (SELECT 1 FROM exchanges e WHERE e.scenario_id = scenarios.id)",
        [scenario_ids],
    )


def _remember(con, kind: str, value, exchanges: int, actor: str) -> None:
    """The rule the loader applies to every later spool line: a trajectory's or a key's
    lines up to now, or every line before a date. Retention keeps one row, moved forward."""
    now = dt.datetime.now(dt.UTC)
    if kind == "before" and actor == "retention":
        # A MERGE on the id, not ON CONFLICT: a lake's table has no key to conflict on.
        con.execute(
            "MERGE INTO forgotten USING (SELECT 'retention' AS id, ?::TIMESTAMPTZ AS ts, "
            "?::TIMESTAMPTZ AS until, ?::BIGINT AS exchanges) AS excluded "
            "ON forgotten.id = excluded.id WHEN MATCHED THEN UPDATE SET "
            "ts = excluded.ts, until = greatest(forgotten.until, excluded.until), "
            "exchanges = forgotten.exchanges + excluded.exchanges "
            "WHEN NOT MATCHED THEN INSERT (id, ts, until, exchanges, actor) "
            "VALUES (excluded.id, excluded.ts, excluded.until, excluded.exchanges, 'retention')",
            [now, value, exchanges],
        )
        return
    con.execute(
        "INSERT INTO forgotten (id, ts, trajectory_id, api_key_id, until, exchanges, actor) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            new_id("forget_"),
            now,
            value if kind == "trajectory" else None,
            value if kind == "api_key" else None,
            value if kind == "before" else now,
            exchanges,
            actor,
        ],
    )
