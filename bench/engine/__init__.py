"""The engines: the local engine against vLLM, adapters (cold cache, loading by name),
prefill, logprob agreement, live traffic first, and the accelerator run."""
