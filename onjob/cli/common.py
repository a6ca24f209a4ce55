"""What every command shares: settings read once from flags, the environment and the TOML
file, and asking the running server's admin API (or, with none running, the database)."""

from __future__ import annotations

import argparse
import sys

from . import admin_key


def load_settings(command: str, args: argparse.Namespace, **sections: dict):
    """ServeSettings from --config, the environment and the flags given; None (after saying
    why) when they are invalid."""
    from pydantic import ValidationError

    from .settings import ServeSettings

    try:
        return ServeSettings.load(args.config, **{k: v for k, v in sections.items() if v})
    except ValidationError as exc:
        for e in exc.errors():
            print(f"onjob {command}: {'.'.join(map(str, e['loc']))}: {e['msg']}", file=sys.stderr)
    except FileNotFoundError as exc:
        print(f"onjob {command}: {exc}", file=sys.stderr)
    return None


def given(**flags) -> dict:
    return {k: v for k, v in flags.items() if v is not None}


def ask_server(args: argparse.Namespace, command: str, path: str, body: dict | None):
    """Ask the running server's admin API; None when no server answers (then the caller
    opens the database itself)."""
    import httpx

    settings = load_settings(command, args, collector=given(db=args.db))
    if settings is None:
        raise SystemExit(2)
    server, headers = admin_endpoint(settings, args)
    try:
        if body is None:
            resp = httpx.get(f"{server}/admin/{path}", headers=headers, timeout=30)
        else:
            resp = httpx.post(f"{server}/admin/{path}", json=body, headers=headers, timeout=300)
    except httpx.TransportError:
        return settings, None
    if resp.status_code >= 400:
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text[:300]
        print(f"onjob {command}: {server}: {message}", file=sys.stderr)
        raise SystemExit(2)
    return settings, resp.json()


def admin_endpoint(settings, args: argparse.Namespace) -> tuple[str, dict]:
    """The running server's base URL (`--server`, else [proxy] host and port) and the
    admin key's header: proxy.admin_key, else the key file beside the database."""
    host = settings.proxy.host if settings.proxy.host not in ("0.0.0.0", "::") else "127.0.0.1"
    server = (getattr(args, "server", None) or f"http://{host}:{settings.proxy.port}").rstrip("/")
    key = settings.proxy.admin_key
    if not key:  # the key `onjob serve` made beside the database, if it did
        try:
            key = admin_key.read(settings.collector.db)
        except admin_key.KeyFileError as exc:
            print(f"onjob: {exc}", file=sys.stderr)
    return server, {"Authorization": f"Bearer {key}"} if key else {}


def offline(settings, fn):
    from ..collector import StorageError, Store
    from ..deploy.deployments import DeployError

    try:
        store = Store(settings.collector.db)
    except StorageError as exc:
        print(f"onjob: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    try:
        return fn(store)
    except DeployError as exc:
        print(f"onjob: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    finally:
        store.close()


def settings_flags(parser: argparse.ArgumentParser, *, engine: bool = False) -> None:
    """The flags every command that opens the database itself takes."""
    parser.add_argument("--config", help="TOML settings file")
    parser.add_argument("--db", help="DuckDB file (default ./onjob.duckdb)")
    if engine:
        parser.add_argument("--engine-url", help="the engine's OpenAI base URL")
