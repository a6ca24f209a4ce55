"""A throwaway Postgres cluster on a free loopback port: the DuckLake catalog of the tests
and benches (Debian's `postgresql` package: `initdb` and `pg_ctl`, run as the `postgres`
user when this process is root, which `initdb` refuses to be).

    with Postgres() as pg:
        pg.dsn  # "host=127.0.0.1 port=... user=postgres dbname=postgres"
        pg.database("lake")  # a database of its own, and its DSN
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..cli.process import free_port

_BIN = ("/usr/lib/postgresql/15/bin", "/usr/local/bin", "/usr/bin")


def _tool(name: str) -> str:
    for folder in _BIN:
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"`{name}` not found: install Debian's postgresql package")
    return found


class Postgres:
    """A cluster in a temporary directory, trusting loopback connections, stopped and
    removed on exit."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="onjob-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stdout}{done.stderr}")

    def start(self) -> Postgres:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        if not self.data.exists():
            self._run(_tool("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            _tool("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
            "start",
        )  # fmt: skip
        return self

    def database(self, name: str) -> str:
        """Create the database `name` (letters, digits, underscores); its DSN."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a plain database name: {name!r}")
        self._run(
            _tool("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name
        )
        return self.dsn.replace("dbname=postgres", f"dbname={name}")

    def dump(self, name: str = "postgres") -> str:
        """Everything the database `name` holds, as `pg_dump` writes it (SQL text)."""
        cmd = [_tool("pg_dump"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        return done.stdout

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(_tool("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def __enter__(self) -> Postgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
