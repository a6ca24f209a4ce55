"""Collector settings (composed into the server's settings in `deploy`)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Fsync = Literal["never", "segment", "always"]  # when a spool line reaches the disk


class CollectorSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    db: Path = Path("onjob.duckdb")
    spool_dir: Path | None = Field(None, description="default: <db>.spool beside the database")
    flush_interval_s: float = Field(0.25, gt=0, description="how often the spool is loaded")
    rotate_s: float = Field(
        1.0,
        gt=0,
        description="how often a proxy-only process closes its spool segment (the loader "
        "loads a segment once closed; another writer's lines wait at most this long)",
    )
    warm_exchanges: int = Field(100_000, ge=0, description="exchanges reloaded into the stitcher")
    stitch_capacity: int = Field(200_000, ge=1)
    lineage_tokens: int = Field(
        8_000_000,
        ge=0,
        description="token ids held in memory (4 bytes each) so a conversation's next turn "
        "stores only its new tokens and messages (linear storage), and up to a quarter as "
        "many more for the starts conversations share (openings); a conversation pushed out "
        "stores its next turn against its opening",
    )
    loader_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="priority of loading into DuckDB below the proxy's (0: equal; higher: "
        "lower tail latency, while a saturated CPU lets the spool grow on disk)",
    )
    duckdb_threads: int = Field(1, ge=1, description="DuckDB worker threads")
    duckdb_memory_limit: str = Field(
        "1GB",
        description="DuckDB's buffer memory (its default is 80% of RAM; beyond this it "
        "evicts cached blocks and spills to disk, next to an engine that needs the memory)",
    )
    fsync: Fsync = Field(
        "segment",
        description="when the spool reaches the disk itself, not only the kernel (a killed "
        "process loses nothing either way): `never` (a power loss or a lost VM can take the "
        "last ~30 s the kernel had not written back), `segment` (each closed segment, every "
        "rotate_s: it can take the open segment's lines), `always` (each exchange before "
        "its answer leaves: nothing; the slowest). docs/scaling.md gives each one's cost; "
        "true/false mean always/never",
    )

    @field_validator("fsync", mode="before")
    @classmethod
    def _fsync_was_a_switch(cls, value: object) -> object:
        switch = {"true": "always", "1": "always", "false": "never", "0": "never"}
        if isinstance(value, bool):
            return "always" if value else "never"
        return switch.get(value.lower(), value) if isinstance(value, str) else value

    max_spool_bytes: int | None = Field(
        8 << 30,
        ge=1 << 20,
        description="most bytes a host's spool directory may hold waiting to be loaded or "
        "handed over (an outage of the bucket or the loader): past it, the proxy goes on "
        "answering but logs no more exchanges until there is room again, counted in "
        "/health as collector.unlogged and said at error level each minute (an agent in "
        "production is never stopped for want of its log); None: no cap",
    )
    max_line_bytes: int = Field(
        64 << 20,
        ge=1 << 20,
        description="longest spool line of an exchange; a longer one (a huge answer) is "
        "stored without its answer, then without its request, as untrainable `too_large`, "
        "with its size in `error`: DuckDB loads a line in about 10 times its size of "
        "duckdb_memory_limit (a 60 MB line loads in 1GB, a 120 MB one does not), so raise "
        "both together",
    )
    max_segment_bytes: int = Field(
        64 << 20,
        ge=1 << 16,
        description="a spool segment is closed at this size: bounds the memory of one load "
        "into DuckDB when loading falls behind",
    )

    retention_days: float | None = Field(
        None,
        gt=0,
        description="delete conversations whose last turn is older than this, with all "
        "derived from them (groups, scores, feedback...; default: keep everything)",
    )
    retention_check_s: float = Field(
        3600, gt=0, description="how often the running server applies retention_days"
    )

    catalog: str | None = Field(
        None,
        description="the log in DuckLake instead of the file collector.db: the lake's "
        "catalog, a Postgres database (a libpq connection string, 'host=... dbname=... "
        "user=...', or a postgresql:// URI); its data files go under collector.data_path, "
        "the spool and DuckDB's temporary files beside collector.db. Needs the `lake` "
        "extra; every server given the same catalog writes its own exchanges into it and "
        "runs the loop, each lineage on one at a time; one leads retention and forgetting "
        "(docs/scaling.md, 'The log in DuckLake'); default: the file",
    )
    data_path: str | None = Field(
        None,
        description="with collector.catalog: where the lake's data files go, a directory "
        "or an s3:// prefix",
    )
    compact_s: float = Field(
        3600,
        gt=0,
        description="with collector.catalog: how often the leading server merges the lake's "
        "small data files (a few per load) and removes the files and snapshots older than "
        "an hour that nothing reads",
    )
    job_lease_s: float = Field(
        30,
        gt=0,
        description="with collector.catalog: how long a worker's hold on a lineage's work "
        "(its judge pass, training run and release decisions) outlives the worker, renewed "
        "a third of it apart: a worker killed mid-job leaves the lineage to another after "
        "this",
    )
    stitch_wait_s: float = Field(
        5.0,
        ge=0,
        description="with collector.catalog: how long a turn that continues no conversation "
        "this server or the lake knows is held back for another server's commit to place "
        "its previous turn, before it starts a conversation of its own",
    )

    bucket: str | None = Field(
        None,
        description="s3://name/prefix: hosts hand their spool segments to the one loader "
        "through this bucket (each host keeps its own spool directory); default: the spool "
        "directory alone, one host",
    )
    bucket_endpoint_url: str | None = Field(
        None, description="the S3 API's URL for a store other than AWS (MinIO, R2, moto)"
    )
    bucket_region: str | None = Field(None, description="the bucket's region (AWS)")
    host_id: str | None = Field(
        None,
        pattern=r"^[0-9A-Za-z_.-]{1,64}$",
        description="this host's name in the bucket (its watermark), unique among the "
        "hosts and the same across its restarts; default: the host name",
    )
    advertise_url: str | None = Field(
        None,
        description="with collector.bucket: the URL other hosts reach this server at, "
        "written into the loader's lease while this server loads, so proxy hosts "
        "(`--primary`) forward to whichever server loads now, after a fail-over too; "
        "default: proxy hosts forward to their --primary alone",
    )
    snapshot_s: float | None = Field(
        3600,
        gt=0,
        description="with collector.bucket: how often the loader copies its database to the "
        "bucket, keeping there every segment it loads in between, so a standby that takes "
        "over goes on from it (docs/scaling.md, 'Fail-over'); None: no copy, a standby "
        "starts from its own database",
    )
    host_lease_s: float = Field(
        30,
        gt=0,
        description="a host whose watermark is older than this is taken for dead: its "
        "open segment no longer holds the others' back (it loads when the host restarts)",
    )

    export_s: float | None = Field(
        None,
        gt=0,
        description="every this many seconds, the exchanges loaded since the last round go "
        "to the bucket as Parquet, exchanges/day=YYYY-MM-DD/ (needs collector.bucket; "
        "default: no export)",
    )

    query_timeout_s: float = Field(
        60, gt=0, description="`onjob sql` / `onjob export` through the server: interrupted after"
    )

    @model_validator(mode="after")
    def _export_needs_a_bucket(self) -> CollectorSettings:
        if self.export_s is not None and not self.bucket:
            raise ValueError("collector.export_s needs collector.bucket (where it exports to)")
        return self

    @model_validator(mode="after")
    def _a_lake_whole(self) -> CollectorSettings:
        if (self.catalog is None) != (self.data_path is None):
            raise ValueError(
                "collector.catalog and collector.data_path go together: the lake's catalog "
                "(a Postgres database) and where its data files go"
            )
        if self.catalog is not None and self.bucket is not None:
            raise ValueError(
                "collector.catalog with collector.bucket: the bucket's hand-off of spool "
                "segments to one loader, and its copies of the database file, are the "
                "file's; a lake is written by one server for now, which every host's "
                "readers can attach"
            )
        return self

    @property
    def host(self) -> str:
        return self.host_id or socket.gethostname()

    @property
    def spool(self) -> Path:
        return self.spool_dir or self.db.with_name(self.db.name + ".spool")
