"""What every command shares: the --config/--db/--server flags, settings read once from
flags, the environment and the TOML file, and asking the running server's admin API (or,
with none running, the database)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from . import admin_key
from .exits import Refused

if TYPE_CHECKING:
    from ..client import Client

T = TypeVar("T")


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


# Parent parsers (`parents=[...]`): each flag declared once for every command taking it.
CONFIG = _parent()
CONFIG.add_argument("--config", help="TOML settings file (default $ONJOB_CONFIG or ./onjob.toml)")
DATABASE = _parent()
DATABASE.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
ENGINE = _parent()
ENGINE.add_argument("--engine-url", help="the engine's OpenAI base URL")
SERVER = _parent()
SERVER.add_argument("--server", help="the running server's URL (default: from [proxy] host/port)")
SERVER.add_argument(
    "--admin-key",
    metavar="KEY",
    help="the running server's admin key (default: proxy.admin_key, else the key beside the "
    "database, <db>.admin-key): for a command run where neither is found. Other local users "
    "can read a command line; ONJOB_PROXY__ADMIN_KEY is the same, unseen",
)


def load_settings(args: argparse.Namespace, **sections: dict):
    """ServeSettings from --config, the environment and the flags given, by section
    (`collector={"db": args.db}`): a flag left unset (None) leaves its setting to the file
    and the environment. `Refused`, saying each invalid field, when they cannot be read.
    Once read, a warning on stderr for each `ONJOB_` variable no setting reads (one `_`
    where two nest a setting in its section, or no setting at all)."""
    import os

    from pydantic import ValidationError

    from .settings import WARNED, ServeSettings, SettingsError, environment_warnings

    given = {
        name: {k: v for k, v in flags.items() if v is not None} for name, flags in sections.items()
    }
    try:
        settings = ServeSettings.load(args.config, **{k: v for k, v in given.items() if v})
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise Refused("\n".join(lines)) from exc
    except (FileNotFoundError, SettingsError) as exc:
        raise Refused(str(exc)) from exc
    if not os.environ.get(WARNED):  # a `--workers` process: its primary said them
        who = f"onjob {args.command}" if getattr(args, "command", None) else "onjob"
        for line in environment_warnings(ServeSettings, os.environ):
            print(f"{who}: warning: {line}", file=sys.stderr)
    return _with_engine_token(settings)


def _with_engine_token(settings):
    """The settings with the adapter token `onjob serve --start-engine` keeps beside the
    database (`admin_key.py`) when none is configured: the commands that load adapters
    into that engine, or ask it (`onjob doctor`), send it as the server does."""
    if settings.proxy.engine_token is not None:
        return settings
    try:
        token = admin_key.read(settings.collector.db, admin_key.ENGINE_TOKEN)
    except admin_key.KeyFileError as exc:
        print(f"onjob: {exc}", file=sys.stderr)
        return settings
    if token is None:
        return settings
    proxy = settings.proxy.model_copy(update={"engine_token": token})
    return settings.model_copy(update={"proxy": proxy})


Offline = Literal["when_down", "with_db"]


def ask_admin(
    args: argparse.Namespace,
    settings,
    call: Callable[[Client], T],
    *,
    timeout: float,
    offline: Offline = "when_down",
) -> T | None:
    """`call`'s answer from the running server, through `onjob.client` with the admin key,
    or None when the caller opens the database itself. `offline`: "when_down", whenever no
    server answers; "with_db", when --db is given without --server, or no server answered
    and none was named (a named one that does not answer is refused). A server's refusal
    is `Refused` with its message."""
    from ..client import Client, ClientError, Unreachable
    from ..client import Refused as RefusedThere

    if offline == "with_db" and args.db and not args.server:
        return None
    server, key = admin_endpoint(settings, args)
    try:
        with Client(server, admin_key=key, timeout=timeout) as client:
            return call(client)
    except Unreachable as exc:
        if offline == "with_db" and args.server:
            raise Refused(str(exc)) from exc
        return None
    except RefusedThere as exc:
        hint = ""
        if exc.status == 401 and key is None:
            hint = (
                " (no admin key was found here: give --admin-key KEY, or set "
                "ONJOB_PROXY__ADMIN_KEY)"
            )
        raise Refused(f"{server}: {exc.message}{hint}") from exc
    except ClientError as exc:  # an answer it cannot read
        raise Refused(f"{server}: {exc}") from exc


def local_url(proxy) -> str:
    """Where a process on this host reaches the server [proxy] describes: one listening on
    every address is reached on loopback."""
    host = proxy.host if proxy.host not in ("0.0.0.0", "::") else "127.0.0.1"
    return f"http://{host}:{proxy.port}"


def admin_endpoint(settings, args: argparse.Namespace) -> tuple[str, str | None]:
    """The running server's base URL (`--server`, else [proxy] host and port) and the
    admin key: `--admin-key`, else proxy.admin_key, else the key file beside the database."""
    server = (getattr(args, "server", None) or local_url(settings.proxy)).rstrip("/")
    key = getattr(args, "admin_key", None) or settings.proxy.admin_key
    if not key:  # the key `onjob serve` made beside the database, if it did
        try:
            key = admin_key.read(settings.collector.db)
        except admin_key.KeyFileError as exc:
            print(f"onjob: {exc}", file=sys.stderr)
    return server, key or None


def no_database(db, *, asked: bool) -> Refused:
    """Nothing to read: no database at `db`, and no server answered (`asked`) or none was
    asked (`--db` alone); said alike by every command, with how to name either."""
    if asked:
        return Refused(
            f"no server answered and there is no database at {db}: start `onjob serve`, "
            "or name yours with --server URL or --db PATH"
        )
    return Refused(
        f"no database at {db}: name yours with --db PATH, or ask the running server with "
        "--server URL"
    )


def offline(settings, fn):
    """`fn(store)` on the database opened by this process (which must exist: a command
    that found no server makes none); its storage and deploy errors are refusals."""
    from ..collector import StorageError, Store
    from ..deploy.act.deployments import DeployError

    db = settings.collector.db
    if not settings.collector.catalog and not Path(db).exists():
        raise no_database(db, asked=True)
    try:
        store = Store.open(settings.collector)
    except StorageError as exc:
        raise Refused(str(exc)) from exc
    try:
        return fn(store)
    except DeployError as exc:
        raise Refused(str(exc)) from exc
    finally:
        store.close()
