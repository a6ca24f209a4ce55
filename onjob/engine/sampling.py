"""Per-choice sampling and the text it releases.

Reported logprobs are the model's raw log-softmax at temperature 1 (vLLM's
default `raw_logprobs`), whatever temperature, top-p, logit bias, penalties or
grammar mask the sampler used: the trainer computes its policy logprobs the same
way, so importance ratios are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    min_tokens: int = 0
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # `parallel_tool_calls: false` with tools: the answer ends with its first complete call
    # (a forced call's grammar ends it there too; under "auto" nothing else would).
    stop_after_call: bool = False


def generator_for(sampling: Sampling, index: int) -> torch.Generator | None:
    """A seeded generator per choice, so `seed` makes every choice reproducible."""
    if sampling.seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(sampling.seed + index)
    return g


def sample(
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
    block: list[int],
    output_ids: list[int],
) -> int:
    """Draw a token id from one row of logits; ids in `block` are never drawn.

    Logit bias and OpenAI's presence and frequency penalties (over the tokens this
    choice has sampled so far) change what is drawn, never the logprobs reported."""
    penalised = output_ids and (sampling.presence_penalty or sampling.frequency_penalty)
    if block or sampling.logit_bias or penalised:
        logits = logits.clone()
    for token, bias in sampling.logit_bias:
        logits[token] += bias
    if penalised:
        counts = torch.bincount(torch.tensor(output_ids), minlength=logits.shape[-1])
        counts = counts[: logits.shape[-1]].to(logits.dtype)
        logits -= sampling.frequency_penalty * counts + sampling.presence_penalty * (counts > 0)
    if block:
        logits[block] = float("-inf")
    if sampling.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < sampling.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        return int(order[torch.multinomial(sorted_probs, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))


class TextStream:
    """Decodes a growing list of token ids into text deltas, honouring stop strings.

    Text that could still become a stop string, or that ends in a partial UTF-8
    character, is held back until the next token settles it.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._released = 0
        self.text = ""

    def update(self, token_ids: list[int], final: bool) -> tuple[str, bool]:
        """Return (new text to release, whether a stop string was hit)."""
        full = self._tokenizer.decode(
            token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        cut = self._find_stop(full)
        if cut is not None:
            self.text = full[:cut]
            return self._release(cut), True
        self.text = full
        if final:
            return self._release(len(full)), False
        end = len(full)
        if full.endswith("\ufffd"):
            end = len(full.rstrip("\ufffd"))
        end -= self._partial_stop(full[:end])
        return self._release(max(end, self._released)), False

    def _release(self, end: int) -> str:
        delta = self.text[self._released : end]
        self._released = max(self._released, end)
        return delta

    def _find_stop(self, text: str) -> int | None:
        if not self._stop:
            return None
        start = max(0, self._released - max(len(s) for s in self._stop))
        hits = [i for s in self._stop if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _partial_stop(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
