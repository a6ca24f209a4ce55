"""The hand-off through object storage (`collector/handoff.py`) and the Parquet export
(`collector/export.py`), against a local S3 API server (moto's, its own process).

Measured, side by side in one run:
- an idle round: what a host's upload round and the loader's fetch round cost when
  there is nothing to move (the watermark PUT; the LISTs and GETs), which is the
  latency the hand-off adds before a segment may load;
- moving segments: `--segments` closed segments of `--segment-kib` each, uploaded in
  one round and fetched in one round (segments/s, MiB/s), against copying the same
  files on the local disk (the shared-directory path);
- the export: `--exchanges` exchanges loaded with the export queue on, then one
  `export_round` (rows/s), against `onjob export`'s COPY of the same rows to one local
  Parquet file.

moto is a Python server on this machine: its rates are a floor for what the code here
costs, not S3's (S3 serves thousands of requests per second per prefix).

    .venv/bin/python -m bench.scale.handoff                  # ~1 minute
    .venv/bin/python -m bench.scale.handoff --segments 200 --segment-kib 1024

Writes bench/results/handoff-<timestamp>.json, with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench import harness
from onjob.bucket import Bucket
from onjob.cli.process import free_port
from onjob.collector import Collector, CollectorSettings, readonly
from onjob.collector.export import export_round
from onjob.collector.handoff import Fetcher, Uploader
from onjob.collector.records import ExchangeRecord, to_json
from onjob.collector.spool import Spool
from onjob.collector.trajectories import keys

os.environ.update(
    {"AWS_ACCESS_KEY_ID": "b", "AWS_SECRET_ACCESS_KEY": "b", "AWS_DEFAULT_REGION": "us-east-1"}
)


def moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            httpx.get(url, timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.05)


def timed(fn, repeats: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def segments(work: Path, n: int, kib: int) -> Spool:
    spool = Spool(work / "host")
    line = b'{"kind": "exchange", "pad": "' + b"x" * 2000 + b'"}'
    per = max(1, kib * 1024 // (len(line) + 1))
    for _ in range(n):
        for _ in range(per):
            spool.append(line)
        spool.rotate()
    return spool


def record(i: int) -> ExchangeRecord:
    messages = [{"role": "user", "content": f"question {i}"}]
    k = keys(messages)
    return ExchangeRecord(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        ts=time.time(),
        stitch=k.candidates,
        prefix_hash=k.prefix_hash,
        scenario_key=k.scenario_key,
        scenario_keyed=k.scenario_keyed,
        model_alias="agent",
        request=to_json({"messages": messages}),
        response=to_json({"choices": [{"message": {"role": "assistant", "content": "a" * 200}}]}),
        prompt_token_ids=list(range(40)),
        completion_token_ids=[list(range(60))],
        completion_logprobs=[[-0.5] * 60],
        usage=to_json({"prompt_tokens": 40, "completion_tokens": 60}),
        latency_ms=12.5,
    )


async def export_bench(work: Path, bucket_url: str, endpoint: str, n: int) -> dict:
    settings = CollectorSettings(
        db=work / "db.duckdb",
        flush_interval_s=3600,
        bucket=bucket_url,
        bucket_endpoint_url=endpoint,
        export_s=3600,
    )
    c = Collector(settings)
    await c.start()
    try:
        for i in range(n):
            c.log(record(i))
        await c.flush()
        bucket = Bucket.from_url(bucket_url, endpoint_url=endpoint)
        start = time.perf_counter()
        rows = await c.query(lambda store: export_round(store, bucket, work / "scratch"))
        to_bucket = time.perf_counter() - start
        start = time.perf_counter()
        await c.query(lambda s: readonly.export(s.con, "exchanges", work / "all.parquet"))
        local = time.perf_counter() - start
    finally:
        await c.close()
    return {"rows": rows, "to_bucket_s": to_bucket, "local_copy_s": local}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=50)
    parser.add_argument("--segment-kib", type=int, default=256)
    parser.add_argument("--exchanges", type=int, default=20_000)
    args = harness.parse(parser)
    load_before = os.getloadavg()
    proc, endpoint = moto()
    work = Path(tempfile.mkdtemp(prefix="onjob-bench-handoff-"))
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        bucket = Bucket.from_url("s3://bench/onjob", endpoint_url=endpoint)
        loader = work / "loader"
        loader.mkdir()
        uploader = Uploader(work / "host", bucket, "host-a")
        (work / "host").mkdir()
        fetcher = Fetcher(loader, bucket, lease_s=60, holder="bench-loader")
        idle_upload = timed(uploader.upload, 20)
        idle_fetch = timed(fetcher.fetch, 20)

        spool = segments(work, args.segments, args.segment_kib)
        size = sum(p.stat().st_size for p in spool.directory.glob("*.jsonl"))
        copies = work / "copies"
        copies.mkdir()
        local = timed(
            lambda: [shutil.copy(p, copies / p.name) for p in spool.directory.glob("*.jsonl")]
        )
        upload = timed(uploader.upload)
        fetch = timed(fetcher.fetch)
        fetcher.close()
        mib = size / (1 << 20)
        exported = asyncio.run(export_bench(work, "s3://bench/export", endpoint, args.exchanges))
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "segments": args.segments,
        "segment_kib": args.segment_kib,
        "idle_upload_round_ms": round(idle_upload * 1000, 1),
        "idle_fetch_round_ms": round(idle_fetch * 1000, 1),
        "upload_segments_per_s": round(args.segments / upload, 1),
        "upload_mib_per_s": round(mib / upload, 1),
        "fetch_segments_per_s": round(args.segments / fetch, 1),
        "fetch_mib_per_s": round(mib / fetch, 1),
        "local_copy_mib_per_s": round(mib / local, 1),
        "export_rows": exported["rows"],
        "export_rows_per_s": round(exported["rows"] / exported["to_bucket_s"]),
        "local_export_rows_per_s": round(exported["rows"] / exported["local_copy_s"]),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    for k, v in result.items():
        print(f"{k:28} {v}")
    harness.save("handoff", result, args.out)


if __name__ == "__main__":
    main()
