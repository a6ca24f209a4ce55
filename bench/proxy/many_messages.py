"""How long one request of very many messages holds the proxy's event loop.

    .venv/bin/python -m bench.proxy.many_messages [--messages 400000] [--max-messages N]

Starts onjob/testing/fake_upstream.py and `onjob serve` in front of it (a fresh DuckDB file),
posts one chat request of `--messages` tiny messages (400,000: ~12 MiB, under the 16 MiB
body limit) while another thread asks `/health` every 5 ms, and prints the request's
status and time and the longest `/health` wait meanwhile (what every other client of the
process waited at worst). `--max-messages` sets `proxy.max_messages` (a value above
`--messages`: the request is checked and hashed as before the cap).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time

import httpx

from bench import harness
from bench.harness.procs import fake_engine_cmd
from onjob.cli.process import ServerProcess, free_port


def body(messages: int) -> bytes:
    one = b'{"role":"user","content":"ab"}'
    return b'{"model":"agent","max_tokens":1,"messages":[' + b",".join([one] * messages) + b"]}"


def probe(url: str, stop: threading.Event, waits: list[float]) -> None:
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            started = time.perf_counter()
            client.get(url)
            waits.append(time.perf_counter() - started)
            time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--max-messages", type=int, help="proxy.max_messages (default: its)")
    args = harness.parse(parser, out=False)
    port = free_port()
    fake = subprocess.Popen(fake_engine_cmd(port))
    env = {}
    if args.max_messages:
        env["ONJOB_PROXY__MAX_MESSAGES"] = str(args.max_messages)
    payload = body(args.messages)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            serve = ["--engine-url", f"http://127.0.0.1:{port}/v1", "--db", f"{tmp}/b.duckdb"]
            with ServerProcess(serve, env=env) as server:
                httpx.post(  # warm: the first request's imports and connections
                    f"{server.url}/chat/completions",
                    content=body(2),
                    headers={"Content-Type": "application/json"},
                    timeout=60,
                )
                stop, waits = threading.Event(), []
                prober = threading.Thread(target=probe, args=(f"{server.base}/health", stop, waits))
                prober.start()
                time.sleep(0.3)
                started = time.perf_counter()
                answer = httpx.post(
                    f"{server.url}/chat/completions",
                    content=payload,
                    headers={"Content-Type": "application/json"},
                    timeout=300,
                )
                took = time.perf_counter() - started
                time.sleep(0.3)
                stop.set()
                prober.join()
    finally:
        fake.terminate()
        fake.wait()
    print(
        f"{args.messages} messages, {len(payload) / 2**20:.1f} MiB, max_messages "
        f"{args.max_messages or 'default'}: status {answer.status_code} in {took:.2f} s; "
        f"longest /health wait {max(waits) * 1000:.0f} ms (median "
        f"{sorted(waits)[len(waits) // 2] * 1000:.1f} ms, {len(waits)} probes)"
    )
    if answer.status_code != 200:
        print("  ", answer.text[:200])


if __name__ == "__main__":
    main()
