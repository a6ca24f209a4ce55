"""A training job's start (`trainer.runner = "job"`, `onjob train --jobs`): how long from
the server's submitting a snapshot to the bucket until a job watching it takes it, until
its training process has the model loaded and trains, and until the checkpoint is
published. moto's S3 server on this machine; the bundled SmolLM2-135M; 4 groups of the
demo's shape (`bench/trainer/train_run.py`).

    .venv/bin/python -m bench.trainer.train_job                 # ~2 minutes
    .venv/bin/python -m bench.trainer.train_job --poll-s 1

The job looks for work every `--poll-s` (5 s, `onjob train --jobs`'s default): a run
waits half of that on average before it is taken.
Writes bench/results/train_job-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench import harness
from bench.scale import handoff
from bench.trainer import train_run
from onjob import bundled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--poll-s", type=float, default=5.0, help="the job's looks (5)")
    parser.add_argument("--groups", type=int, default=4, help="groups to train on (4)")
    args = harness.parse(parser)
    from onjob.trainer import jobs
    from onjob.trainer.settings import TrainSettings

    moto, endpoint = handoff.moto()
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    httpx.put(f"{endpoint}/jobs")  # moto: the bucket
    url = "s3://jobs/onjob"
    marks: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            snap = Path(tmp) / "snapshot.parquet"
            train_run.snapshot(snap, args.groups)
            job = subprocess.Popen(
                [sys.executable, "-m", "onjob.cli", "train", "--jobs", url, "--once",
                 "--poll-s", str(args.poll_s), "--base-model", str(bundled.prepare())],
                cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            time.sleep(args.poll_s * 0.5)  # submitted at a random point of its wait, on average
            store = jobs.Store.at(url)
            settings = TrainSettings(threads=1, groups_per_step=2, lora_rank=16)
            submitted = time.monotonic()
            jobs.submit(store, jobs.Job("bench-run", None, settings), snap)

            def read() -> None:
                for line in job.stdout:
                    now = time.monotonic() - submitted
                    if line.startswith("training job") and "taken_s" not in marks:
                        marks["taken_s"] = now
                    if "step 1" in line and "first_step_done_s" not in marks:
                        marks["first_step_done_s"] = now

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            while jobs.outcome(store, "bench-run").state == "waiting":
                assert job.poll() is None or job.returncode == 0, "the job failed"
                time.sleep(0.2)
            marks["published_s"] = time.monotonic() - submitted
            job.wait(timeout=120)
            reader.join(timeout=5)
    finally:
        moto.terminate()
        moto.wait()
    marks = {k: round(v, 2) for k, v in marks.items()}
    print(f"from submitting: {marks}")
    harness.save("train_job", {"args": vars(args), "seconds": marks}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
