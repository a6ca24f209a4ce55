"""The continuous Parquet export (`collector/export.py`): a real `onjob serve`, a real S3
API server (moto's), the `openai` client, the files read back with DuckDB."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import duckdb
import pytest
from openai import OpenAI

from onjob.bucket import Bucket, BucketError
from onjob.cli.process import ServerProcess
from onjob.collector import Collector, CollectorSettings
from onjob.collector.export import export_round

from .s3_server import bucket_url, s3_endpoint  # noqa: F401  (fixtures)
from .test_collector import log_conversations

SYSTEM = {"role": "system", "content": "You are the support agent of a shop. Answer briefly."}


def read_back(bucket: Bucket, into) -> list[dict]:
    """Every exported file, downloaded as laid out in the bucket, read with DuckDB."""
    for info in bucket.list("exchanges/"):
        bucket.get_file(info.key, into / info.key)
    con = duckdb.connect()
    cur = con.execute(
        "SELECT * FROM read_parquet(?, hive_partitioning = true)",
        [str(into / "exchanges" / "*" / "*.parquet")],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def test_exchanges_are_exported_as_day_partitioned_parquet_whole_and_once(
    tmp_path,
    fake_engine_url,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    env = {
        "ONJOB_LOOP__INTERVAL_S": "0",
        "ONJOB_COLLECTOR__BUCKET": bucket_url,
        "ONJOB_COLLECTOR__BUCKET_ENDPOINT_URL": s3_endpoint,
        "ONJOB_COLLECTOR__EXPORT_S": "0.3",
    }
    db = tmp_path / "onjob.duckdb"
    sent: dict[str, list[dict]] = {}
    with ServerProcess(
        ["--engine-url", fake_engine_url, "--db", str(db)], env=env, log=tmp_path / "s.log"
    ) as server:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        for c in range(4):
            messages = [SYSTEM, {"role": "user", "content": f"conversation {c}"}]
            for turn in range(3):
                reply = client.chat.completions.create(
                    model="agent", messages=messages, max_tokens=3
                )
                sent[reply.id] = list(messages)
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": f"and then {turn}?"},
                ]
    bucket = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)
    keys = [o.key for o in bucket.list("exchanges/")]
    today = dt.datetime.now(dt.UTC).date()
    assert keys and all(k.startswith(f"exchanges/day={today}/") for k in keys)
    exported = read_back(bucket, tmp_path / "read")
    assert sorted(r["id"] for r in exported) == sorted(sent)  # each once
    # Whole, though the database stores a later turn against its parent (linear storage).
    for r in exported:
        assert json.loads(r["request"])["messages"] == sent[r["id"]]
        assert r["day"] == today
    assert {r["turn"] for r in exported} == {0, 1, 2}
    assert len({r["trajectory_id"] for r in exported}) == 4


def test_a_round_whose_upload_fails_keeps_its_rows_for_the_next(
    tmp_path,
    bucket_url,  # noqa: F811
    s3_endpoint,  # noqa: F811
):
    settings = CollectorSettings(
        db=tmp_path / "db.duckdb",
        flush_interval_s=3600,
        bucket=bucket_url,
        bucket_endpoint_url=s3_endpoint,
        export_s=3600,
    )
    good = Bucket.from_url(bucket_url, endpoint_url=s3_endpoint)
    gone = Bucket.from_url("s3://no-such-bucket-here", endpoint_url=s3_endpoint)
    scratch = tmp_path / "scratch"

    async def main() -> tuple[list[str], list[str]]:
        c = Collector(settings)
        await c.start()
        try:
            first = await log_conversations(c, 2, 2)
            await c.flush()
            store = c.database.store
            with pytest.raises(BucketError):
                await c.database.run(export_round, store, gone, scratch)
            second = await log_conversations(c, 1, 1)
            await c.flush()
            # The failed batch goes first, alone, under the names it had.
            assert await c.database.run(export_round, store, good, scratch) == len(first)
            assert await c.database.run(export_round, store, good, scratch) == len(second)
            assert await c.database.run(export_round, store, good, scratch) == 0
            return first, second
        finally:
            await c.close()

    first, second = asyncio.run(main())
    exported = read_back(good, tmp_path / "read")
    assert sorted(r["id"] for r in exported) == sorted(first + second)


def test_an_export_without_a_bucket_is_refused():
    with pytest.raises(ValueError, match="export_s needs"):
        CollectorSettings(export_s=60)
