"""onjob's one logprob definition, shared by the engines, the proxy and the trainer.

The trainer's importance ratio divides the policy's logprob of each sampled token by
the sampler's. The policy's is always the model's raw distribution: log-softmax of
the logits, before temperature, top-p or penalties. So the sampler's must be too:
the local engine returns exactly that, and vLLM does when started with
`--logprobs-mode raw_logprobs` (its default has changed between releases, so
`onjob engine --backend vllm` passes it explicitly).

Every logged exchange records the definition its engine used (`exchanges.logprobs_mode`):
what the engine's model list states (the local engine says it), else what
`proxy.engine_logprobs` declares (vLLM's model list does not say). The trainer refuses a
group with a member recorded under another definition.
"""

from __future__ import annotations

from typing import Final, Literal

# vLLM's `--logprobs-mode` choices.
LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]

TRAINED: Final = "raw_logprobs"  # the definition the trainer's ratio needs
