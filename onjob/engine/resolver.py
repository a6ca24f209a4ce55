"""Adapters loaded by name on first request: vLLM's LoRA resolver contract, for the local
engine and (through `vllm_plugin.py`) for vLLM.

A request for a model the engine does not serve names an adapter to look for in the
resolver directory (`adapter_cache_dir`, vLLM's `VLLM_LORA_RESOLVER_CACHE_DIR`):
`<dir>/<name>` is loaded when its `adapter_config.json` says `peft_type: LORA` and a
`base_model_name_or_path` equal to the engine's own model (what it was started with:
vLLM compares `model_config.model`, the `model` argument of `vllm serve`, not the served
name), exactly what vLLM's filesystem resolver checks. A name that would leave the
directory (absolute, `..`, a link out of it) is never looked up. With `adapter_bucket`
the directory is this host's cache of the published checkpoints (`onjob.published`): a
name not in it is fetched first. Nothing found: 404, as for any unknown model.

So a replica started after a promotion, or restarted, serves the promoted checkpoint on
its first request instead of answering 503 until the operator loads it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from .. import published
from ..bucket import Bucket, BucketError

# A name just looked up and not found is not looked up again for this long: a client
# sending made-up model names costs one bucket request per name per window, not per request.
MISS_TTL_S = 2.0
MISSES_KEPT = 1024


class Resolver:
    def __init__(self, directory: Path, base: str, bucket: Bucket | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = Path(os.path.realpath(directory))
        self.base = base
        self.bucket = bucket
        self._misses: dict[str, float] = {}
        self._lock = asyncio.Lock()

    def find(self, name: str) -> Path | None:
        """The adapter directory for `name`, fetched from the bucket when it is not cached;
        None when there is none this engine may load (blocking: bucket requests)."""
        path = self._inside(name)
        if path is None:
            return None
        if not path.exists() and self.bucket is not None and published.valid_name(name):
            try:
                published.fetch(self.bucket, name, self.directory)
            except BucketError:
                return None  # the store is down: unknown for now, as without a bucket
        return path if self._fits(path) else None

    async def load(self, batcher, name: str) -> bool:
        """Find `name` and load it into the batcher's model; False when not found (the
        caller answers 404). At most one lookup at a time: resolving is the rare path."""
        async with self._lock:
            if name in batcher.loaded.adapters:
                return True
            if time.monotonic() - self._misses.get(name, -MISS_TTL_S) < MISS_TTL_S:
                return False
            path = await asyncio.to_thread(self.find, name)
            if path is None:
                self._missed(name)
                return False

            def load() -> None:
                if name not in batcher.loaded.adapters:
                    batcher.loaded.load_adapter(name, str(path), batcher.busy())

            await batcher.call(load)
            return True

    def _inside(self, name: str) -> Path | None:
        try:
            if not name or os.path.isabs(name):
                return None
            path = Path(os.path.realpath(self.directory / name))
        except (ValueError, OSError):  # a NUL byte, a name too long for the file system
            return None
        inside = os.path.commonpath([self.directory, path]) == str(self.directory)
        return path if inside and path != self.directory else None

    def _fits(self, path: Path) -> bool:
        try:
            config = json.loads((path / "adapter_config.json").read_text())
        except (OSError, ValueError):
            return False
        return (
            isinstance(config, dict)
            and config.get("peft_type") == "LORA"
            and config.get("base_model_name_or_path") == self.base
        )

    def _missed(self, name: str) -> None:
        if len(self._misses) >= MISSES_KEPT:
            self._misses.clear()
        self._misses[name] = time.monotonic()
