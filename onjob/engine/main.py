"""Starting the local engine: load the model, start the batcher, serve HTTP."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .settings import EngineSettings


def serve(settings: EngineSettings) -> None:
    if settings.backend == "vllm":
        from .. import bundled
        from . import vllm

        model = settings.model or str(bundled.prepare())
        vllm.run(settings, model)
        return

    import torch
    import uvicorn

    from .. import bundled
    from .batching import Batcher
    from .model import LoadedModel
    from .server import create_app

    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    path = bundled.resolve(settings.model)
    name = settings.served_model_name or (
        bundled.MODEL_NAME if settings.model is None else Path(settings.model).name
    )
    started = time.monotonic()
    loaded = LoadedModel.load(
        path,
        name=name,
        dtype=settings.dtype,
        device=device,
        max_model_len=settings.max_model_len,
        max_resident=settings.max_cpu_loras,
    )
    for spec in settings.lora_modules:
        adapter, _, adapter_path = spec.partition("=")
        loaded.load_adapter(adapter, adapter_path)
    batcher = Batcher(
        loaded,
        max_batch=settings.max_batch_size,
        prefix_cache=settings.prefix_cache,
        prefill_chunk=settings.prefill_chunk,
        background_share=settings.background_share,
    )
    batcher.start()
    app = create_app(
        batcher,
        default_max_tokens=settings.default_max_tokens,
        adapter_token=settings.adapter_token,
        resolver=_resolver(settings, loaded.path),
    )
    print(
        f"onjob engine: {name} on {device} ({time.monotonic() - started:.1f} s to load), "
        f"http://{settings.host}:{settings.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    finally:
        batcher.stop()


def _resolver(settings: EngineSettings, base: str):
    """Adapters by name from `adapter_cache_dir` (and `adapter_bucket`), None when unset."""
    if settings.adapter_cache_dir is None:
        return None
    from ..bucket import Bucket
    from .resolver import Resolver

    bucket = Bucket.from_url(settings.adapter_bucket) if settings.adapter_bucket else None
    return Resolver(settings.adapter_cache_dir, base, bucket)
