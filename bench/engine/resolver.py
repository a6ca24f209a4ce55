"""What a replica's first request for an adapter costs when it loads it by name.

A moto S3 server (its own process), a rank-16 LoRA adapter of the bundled SmolLM2-135M
on every attention and MLP projection published N times under N names
(`onjob.published`), and one local engine started with `--adapter-cache-dir` and
`--adapter-bucket`. For each name, side by side in one run:

- `first_s`: the first request naming it: fetched from the bucket, loaded, answered;
- `warm_s`: the next request for it (loaded already);
- `by_path_s`: a second name loaded from a local path through `/v1/load_lora_adapter`,
  then asked once: what the operator's way costs for the same adapter;
- `base_s`: a request for the base model.

Every request asks for 1 token. Ratios to `warm_s` are what to compare across machines.

    python -m bench.engine.resolver              # 5 names
    python -m bench.engine.resolver --names 3

Writes bench/results/resolver-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench import harness
from onjob import bundled, published
from onjob.bucket import Bucket
from onjob.cli.process import EngineProcess, free_port

QUESTION = [{"role": "user", "content": "Say yes."}]


def _adapter(out: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundled.prepare())
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets)).save_pretrained(
        out
    )
    return out


def _ask(url: str, model: str) -> float:
    body = {"model": model, "messages": QUESTION, "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    resp = httpx.post(f"{url}/chat/completions", json=body, timeout=300)
    resp.raise_for_status()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=5)
    args = harness.parse(parser)
    creds = {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(creds)
    port = free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    work = Path(tempfile.mkdtemp(prefix="onjob-bench-resolver-"))
    engine = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(endpoint, timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "moto did not start"
                time.sleep(0.1)
        name = f"bench-{uuid.uuid4().hex[:8]}"
        import boto3

        boto3.client("s3").create_bucket(Bucket=name)
        url = f"s3://{name}/onjob/checkpoints"
        bucket = Bucket.from_url(url)
        adapter = _adapter(work / "adapter")
        size = sum(f.stat().st_size for f in adapter.iterdir())
        names = [f"ckpt-{i}" for i in range(args.names)]
        for n in names:
            published.publish(bucket, adapter, n)
        engine = EngineProcess(
            ["--threads", "1", "--adapter-cache-dir", str(work / "cache"), "--adapter-bucket", url]
        ).start()
        _ask(engine.url, "SmolLM2-135M-Instruct")  # the first forward's own warm-up
        rows = []
        for n in names:
            first = _ask(engine.url, n)
            warm = _ask(engine.url, n)
            started = time.perf_counter()
            load = {"lora_name": f"{n}-path", "lora_path": str(adapter)}
            httpx.post(f"{engine.url}/load_lora_adapter", json=load, timeout=300).raise_for_status()
            by_path = time.perf_counter() - started + _ask(engine.url, f"{n}-path")
            base = _ask(engine.url, "SmolLM2-135M-Instruct")
            for unload in (n, f"{n}-path"):  # peft's cost grows with the adapters loaded
                httpx.post(f"{engine.url}/unload_lora_adapter", json={"lora_name": unload})
            rows.append({"first_s": first, "warm_s": warm, "by_path_s": by_path, "base_s": base})
        summary = {
            k: statistics.median(r[k] for r in rows)
            for k in ("first_s", "warm_s", "by_path_s", "base_s")
        }
        result = {
            "adapter_bytes": size,
            "names": args.names,
            "median": summary,
            "first_over_warm": summary["first_s"] / summary["warm_s"],
            "first_over_by_path": summary["first_s"] / summary["by_path_s"],
            "load": os.getloadavg(),
            "cpus": os.cpu_count(),
            "runs": rows,
        }
        print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
        harness.save("resolver", result, args.out)
    finally:
        if engine is not None:
            engine.stop()
        moto.terminate()
        moto.wait()


if __name__ == "__main__":
    main()
