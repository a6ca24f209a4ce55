"""The proxies onjob is measured against, installed on first use under build/peers/.

- `litellm`: the LiteLLM proxy (`litellm[proxy]`, one worker, no database), in a
  virtualenv of its own so its pins never touch onjob's;
- `portkey`: the Portkey gateway (Node, from npm; `@hono/node-server` pinned to 1.13.5,
  as the gateway's start script needs);
- `aiohttp`: bench/proxy/passthrough.py, a bare aiohttp relay: Python's floor;
- `litestar`: bench/proxy/passthrough_litestar.py, a bare relay on Litestar, uvicorn and the
  aiohttp client (onjob's stack until its hot routes bypassed Litestar's router and
  aiohttp's client): what that stack costs before any work.

Each `Peer` knows its command, the model name clients send, the path that says it
is up, and any headers its requests need.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE.parents[1] / "build" / "peers"
LITELLM_VERSION = "1.106.0"
PORTKEY_VERSION = "1.15.2"
NAMES = ("aiohttp", "litestar", "litellm", "portkey")


@dataclass
class Peer:
    name: str
    cmd: list[str]
    model: str
    health: str
    headers: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def peer(name: str, port: int, engine_port: int, workdir: Path) -> Peer:
    engine = f"http://127.0.0.1:{engine_port}/v1"
    if name == "aiohttp":
        cmd = [sys.executable, str(HERE / "passthrough.py"), "--port", str(port)]
        return Peer(name, [*cmd, "--upstream", engine], "fake", "/health")
    if name == "litestar":
        script = HERE / "passthrough_litestar.py"
        cmd = [sys.executable, str(script), "--port", str(port), "--upstream", engine]
        return Peer(name, cmd, "fake", "/health")
    if name == "litellm":
        config = workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            "  - model_name: agent\n"
            "    litellm_params:\n"
            "      model: openai/fake\n"
            f"      api_base: {engine}\n"
            "      api_key: unused\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
        )
        cmd = [str(_litellm()), "--config", str(config), "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--num_workers", "1"]
        # No keys, as onjob runs in the bench: the same work per request on both sides.
        env = {
            "LITELLM_LOG": "ERROR",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        }
        return Peer(name, cmd, "agent", "/health/liveliness", env=env)
    if name == "portkey":
        start = (
            _portkey() / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
        )
        headers = {"x-portkey-provider": "openai", "x-portkey-custom-host": engine}
        cmd = ["node", str(start), f"--port={port}", "--headless"]
        return Peer(name, cmd, "fake", "/", headers)
    raise ValueError(f"unknown peer {name!r}: one of {', '.join(NAMES)}")


def _litellm() -> Path:
    venv = PEERS / f"litellm-{LITELLM_VERSION}"
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        print(f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
    return exe


def _portkey() -> Path:
    where = PEERS / f"portkey-{PORTKEY_VERSION}"
    if not (where / "node_modules" / "@portkey-ai" / "gateway").exists():
        if shutil.which("npm") is None:
            raise RuntimeError("the Portkey gateway needs Node.js and npm")
        print(f"installing @portkey-ai/gateway@{PORTKEY_VERSION} into {where} (once)", flush=True)
        where.mkdir(parents=True, exist_ok=True)
        # An override, not a top-level dependency: the gateway otherwise gets a nested
        # newer @hono/node-server, with which every streamed answer fails with a 500.
        package = {
            "private": True,
            "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION},
            "overrides": {"@hono/node-server": "1.13.5"},
        }
        (where / "package.json").write_text(json.dumps(package, indent=2) + "\n")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=where, check=True)
    return where
