"""onjob's LoRA resolver inside vLLM: a vLLM general plugin (entry point
`vllm.general_plugins: onjob_adapters`) that fills vLLM's resolver directory from the
bucket checkpoints are published to.

vLLM's own filesystem resolver loads `<VLLM_LORA_RESOLVER_CACHE_DIR>/<name>` when a
request names an adapter it does not serve; this one, registered beside it, first fetches
`<name>` from `ONJOB_ENGINE_ADAPTER_BUCKET` into that directory (`onjob.published`), then
answers as the filesystem resolver does, with the same checks (`resolver.Resolver.find`).
`onjob engine --backend vllm --adapter-cache-dir DIR --adapter-bucket s3://...` sets both
variables; without them this plugin registers nothing. vLLM asks resolvers only with
runtime LoRA updating on, which onjob always sets.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from .vllm import BUCKET_VARIABLE


def register() -> None:
    """The entry point vLLM calls in each of its processes at start."""
    cache, bucket_url = (
        os.environ.get("VLLM_LORA_RESOLVER_CACHE_DIR"),
        os.environ.get(BUCKET_VARIABLE),
    )
    if not (cache and bucket_url):
        return
    from vllm.lora.request import LoRARequest
    from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

    from ..bucket import Bucket
    from .resolver import Resolver

    bucket = Bucket.from_url(bucket_url)
    finders: dict[str, Resolver] = {}

    class BucketResolver(LoRAResolver):
        async def resolve_lora(self, base_model_name: str, lora_name: str):
            finder = finders.setdefault(
                base_model_name, Resolver(Path(cache), base_model_name, bucket)
            )
            path = await asyncio.to_thread(finder.find, lora_name)
            if path is None:
                return None
            return LoRARequest(
                lora_name=lora_name, lora_int_id=abs(hash(lora_name)), lora_path=str(path)
            )

    LoRAResolverRegistry.register_resolver("onjob bucket", BucketResolver())
