"""`onjob forget`, `onjob sql` and `onjob export`: the logged data, while the server runs or
not.

DuckDB lets one process open the file read-write, and `onjob serve` is it. So each verb
asks the running server's admin API (`--server`, else [proxy] host/port; the admin key
from the settings); with `--db`, or when no server answers, it opens the file itself
(`sql` and `export` read-only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .common import CONFIG, DATABASE, SERVER, ask_admin, load_settings, no_database
from .exits import Exit, Refused

if TYPE_CHECKING:
    from ..collector.forget import Removed


def _settings(args: argparse.Namespace):
    return load_settings(args, collector={"db": args.db})


def _ask(args: argparse.Namespace, settings, call, timeout: float):
    """`call`'s answer from the server (`onjob.client`), or None when the caller opens the
    database itself: `--db` given, or no server answered and none was named."""
    return ask_admin(args, settings, call, timeout=timeout, offline="with_db")


def _asked(args: argparse.Namespace) -> bool:
    """Whether `_ask` asked a server before it answered None (not with `--db` alone)."""
    return not (args.db and not args.server)


def _open_read_only(args: argparse.Namespace, settings, for_queries: bool = False):
    """The database opened read-only (the file, or the lake attached); `for_queries`: with
    DuckDB's ways out of it switched off too (`readonly.connect`, `connect_lake`), which
    `export`'s COPY cannot have."""
    import duckdb

    from ..collector import readonly

    c = settings.collector
    if c.catalog is not None:  # a lake: any number of readers attach it beside the server
        from ..collector import StorageError, lake

        try:
            if for_queries:
                return readonly.connect_lake(c.catalog, c.data_path)
            con = duckdb.connect()
            lake.attach(con, c.catalog, c.data_path, read_only=True)
            return con
        except (StorageError, duckdb.Error) as exc:
            raise Refused(str(exc).splitlines()[0]) from exc
    db = c.db
    if not Path(db).exists():
        raise no_database(db, asked=_asked(args))
    try:
        if for_queries:
            return readonly.connect(db)
        return duckdb.connect(str(db), read_only=True)
    except duckdb.Error as exc:
        raise Refused(
            f"cannot open {db}: {str(exc).splitlines()[0]}. A running "
            "`onjob serve` holds it: leave out --db (or give --server URL) to ask it."
        ) from exc


# -- forget ----------------------------------------------------------------------------


def cmd_forget(args: argparse.Namespace) -> int:
    from ..collector import Forget, ForgetError
    from ..collector.forget import parse_date

    settings = _settings(args)
    try:
        before = parse_date(args.before) if args.before else None
        what = Forget(trajectory=args.trajectory, api_key=args.api_key, before=before)
    except ForgetError as exc:
        raise Refused(str(exc)) from exc
    out = _ask(
        args,
        settings,
        lambda c: c.forget(trajectory=args.trajectory, api_key=args.api_key, before=args.before),
        timeout=600,
    )
    if out is None:
        out = _forget_here(args, settings, what)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(out, enc_hook=str)).decode())
    else:
        _show_forgotten(out)
    return Exit.OK


def _forget_here(args: argparse.Namespace, settings, what) -> Removed:
    """`onjob forget` on the database file, the spool and the snapshots, by this process."""
    from ..collector import StorageError, Store
    from ..collector.forget import forget, scrub
    from ..deploy.act.training import drop_snapshots

    if not settings.collector.catalog and not Path(settings.collector.db).exists():
        raise no_database(settings.collector.db, asked=_asked(args))
    try:
        store = Store.open(settings.collector)
    except StorageError as exc:
        raise Refused(str(exc)) from exc
    try:
        forgotten = forget(store, what, actor="cli")
    finally:
        store.close()
    scrub(Path(settings.collector.spool), what, forgotten)
    snapshots = drop_snapshots(settings.trainer.checkpoints_dir, forgotten.group_ids)
    return forgotten.removed(snapshots)


def _show_forgotten(out: Removed) -> None:
    print(
        f"forgot {out.what}: {out.exchanges} exchanges, {out.trajectories} "
        f"trajectories, {out.groups} groups ({out.members} members, "
        f"{out.judgements} judgements, {out.scores} scores), {out.feedback} feedback, "
        f"{out.scenarios} scenarios left empty"
    )
    if out.trained_on:
        print(
            "checkpoints already trained on the deleted data (a checkpoint cannot unlearn it: "
            "retire or roll back those you must):"
        )
        for c in out.trained_on:
            print(
                f"  {c.name:<40} {c.status:<10} lineage={c.lineage or '-'} "
                f"run={c.train_run or '-'} parent={c.parent or '-'} {c.path or ''}"
            )
            if c.removing:
                print(f"    removing it: {c.removing}")
    else:
        print("no checkpoint was trained on it")
    for path in out.snapshots_removed:
        print(f"removed the training snapshot {path}")
    if not out.checkpointed:
        print("the database's write-ahead log still holds it until DuckDB's next checkpoint")
    if out.set_aside_removed:
        print(f"removed {out.set_aside_removed} lines set aside in the spool's failed/")
    if out.set_aside_kept:
        print(
            f"{out.set_aside_kept} files in the spool's failed/ were not loaded and may hold "
            "lines of it the rule cannot name: read or delete them yourself"
        )
    print("onjob cannot reach these copies:")
    for copy in out.not_reached:
        print(f"  - {copy}")


# -- sql -------------------------------------------------------------------------------


def cmd_sql(args: argparse.Namespace) -> int:
    from ..collector import readonly

    settings = _settings(args)
    answer = _ask(
        args,
        settings,
        lambda c: c.sql(args.query, limit=args.limit),
        timeout=settings.collector.query_timeout_s + 30,
    )
    if answer is None:
        con = _open_read_only(args, settings, for_queries=True)
        try:
            answer = readonly.query(con, args.query, args.limit)
        except readonly.QueryRefused as exc:
            raise Refused(str(exc)) from exc
        finally:
            con.close()
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(answer, enc_hook=str)).decode())
    else:
        _table(answer.columns, answer.rows)
    if answer.truncated:
        print(f"(only the first {args.limit} rows: --limit N for more)", file=sys.stderr)
    return Exit.OK


def _table(columns: list[str], rows: list[list]) -> None:
    """Columns aligned, each cell cut at 60 characters."""

    def cell(v) -> str:
        text = "NULL" if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
        text = text.replace("\n", " ")
        return text if len(text) <= 60 else text[:59] + "…"

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


# -- export ----------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    from ..collector import readonly

    settings = _settings(args)
    out = Path(args.parquet)
    out.mkdir(parents=True, exist_ok=True)

    def from_server(client) -> list[Path]:  # each table streamed into place, whole
        names = args.table or client.tables(tenant=args.tenant is not None)
        return [client.export(n, out / f"{n}.parquet", tenant=args.tenant) for n in names]

    written = _ask(args, settings, from_server, timeout=600)
    if written is not None:
        for path in written:
            print(path)
        return Exit.OK
    whose = None
    if args.tenant is not None:
        from ..proxy.tenants import Tenants, UnknownTenant

        try:
            whose = Tenants.of(settings.proxy).rows(args.tenant, settings.proxy.aliases)
        except UnknownTenant as exc:
            raise Refused(str(exc)) from exc
    con = _open_read_only(args, settings)
    try:
        listed = readonly.tenant_tables(con) if whose else readonly.tables(con)
        for name in args.table or listed:
            path = out / f"{name}.parquet"
            rows = readonly.export(con, name, path, whose)
            print(f"{path} ({rows} rows)")
    except readonly.QueryRefused as exc:
        raise Refused(str(exc)) from exc
    finally:
        con.close()
    return Exit.OK


# -- the parser ------------------------------------------------------------------------

_WHERE = (
    "Asks the running `onjob serve` through its admin API (--server URL, else [proxy] "
    "host and port; the admin key from --admin-key, proxy.admin_key / "
    "ONJOB_PROXY__ADMIN_KEY, or the key file beside the database). With --db, or when no "
    "server answers, it opens the database file itself."
)


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, 80)


def add_commands(sub) -> None:
    _add_forget(sub)
    _add_sql(sub)
    _add_export(sub)


def _add_forget(sub) -> None:
    forget = sub.add_parser(
        "forget",
        help="delete a conversation, an API key's traffic, or everything before a date",
        description=_wrap(
            "Delete whole conversations and everything derived from them: their exchanges "
            "(re-sampled ones included), trajectory rows, the judge's groups, members, "
            "judgements and scores that saw them, the feedback on them, and the training "
            "snapshots on disk that hold those groups; a scenario left with no "
            "conversation goes too. No later judge pass or training run can "
            "use them, and a spool segment loaded later cannot bring them back. Checkpoints "
            "already trained on the deleted data are listed (they cannot unlearn it). " + _WHERE
        ),
        epilog=(
            "examples:\n"
            "  onjob forget --trajectory traj_3f9c...   one conversation\n"
            "  onjob forget --api-key support-bot       a tenant's conversations and feedback\n"
            "  onjob forget --before 2026-01-01         conversations that ended before then\n"
            "  onjob forget --db onjob.duckdb --api-key billing   with no server running"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[SERVER, CONFIG, DATABASE],
    )
    which = forget.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--trajectory",
        metavar="ID",
        help="a trajectory id as stored (trajectories.id; one the client named is "
        "<key id>:<name> on a server with API keys)",
    )
    which.add_argument("--api-key", metavar="ID", help="an API key's id (as in proxy.api_keys)")
    which.add_argument(
        "--before",
        metavar="DATE",
        help="conversations whose last turn is older (2026-05-01 or an ISO time; UTC)",
    )
    forget.add_argument("--json", action="store_true", help="print the counts as JSON")
    forget.set_defaults(func=cmd_forget)


def _add_sql(sub) -> None:
    sql = sub.add_parser(
        "sql",
        help="run a read-only SELECT on the database, while the server runs",
        description=_wrap(
            "Run one SELECT on onjob's DuckDB database and print the rows. Only a single "
            "read-only query of the database's own tables is answered: DuckDB's parser "
            "must call it a SELECT, it runs in a read-only transaction, and table "
            "functions that read files are refused. " + _WHERE
        ),
        epilog=(
            "examples:\n"
            '  onjob sql "SELECT source, model_alias, count(*) FROM exchanges GROUP BY ALL"\n'
            '  onjob sql "SELECT id, n_turns FROM trajectories ORDER BY last_ts DESC" '
            "--limit 20\n"
            '  onjob sql "SELECT table_name FROM duckdb_tables()" --json\n'
            "tables: exchanges, trajectories, scenarios, groups, members, judgements, scores,\n"
            "feedback, checkpoints, train_runs, deployments, forgotten, openings\n"
            "(docs/ARCHITECTURE.md)\n"
            "exchanges.source: production (the agent's requests) or resample (the loop's own:\n"
            "the judge's re-samples, the A/B test's answers)\n"
            "a turn's row stores only what it adds to its conversation (or to the start it\n"
            "shares with others, in openings): read whole requests and prompt\n"
            "token ids from the view exchanges_full, e.g.\n"
            "  onjob sql \"SELECT request FROM exchanges_full WHERE trajectory_id = 't'\""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[SERVER, CONFIG, DATABASE],
    )
    sql.add_argument("query", help="one SELECT statement (quote it)")
    sql.add_argument("--limit", type=int, default=1000, help="at most this many rows (1000)")
    sql.add_argument("--json", action="store_true", help="print columns, types and rows as JSON")
    sql.set_defaults(func=cmd_sql)


def _add_export(sub) -> None:
    export = sub.add_parser(
        "export",
        help="write tables to Parquet files, while the server runs",
        description=_wrap(
            "Write each table (or those named with --table) to DIR/<table>.parquet, from "
            "one consistent snapshot of each. Through a running server the files are "
            "streamed back over HTTP, so DIR is on this machine. With --tenant, only that "
            "tenant's rows (proxy.tenants): its keys' conversations and all derived from "
            "them, and its lineages' routings, candidates, reviews, train runs and "
            "checkpoints; tables that hold no tenant's rows are left out. " + _WHERE
        ),
        epilog=(
            "examples:\n"
            "  onjob export --parquet dump/                       every table\n"
            "  onjob export --parquet dump/ --table exchanges --table feedback\n"
            "  onjob export --parquet acme/ --tenant acme         one tenant's rows\n"
            "  duckdb -c \"SELECT count(*) FROM 'dump/exchanges.parquet'\""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[SERVER, CONFIG, DATABASE],
    )
    export.add_argument("--parquet", metavar="DIR", required=True, help="where the files go")
    export.add_argument(
        "--table", action="append", metavar="NAME", help="only this table (repeatable)"
    )
    export.add_argument(
        "--tenant", metavar="NAME", help="only this tenant's rows (a name in proxy.tenants)"
    )
    export.set_defaults(func=cmd_export)
