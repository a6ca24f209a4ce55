"""The trust region a run keeps: a KL budget per token, to the base model and to the
policy the run started from, held step by step (PPO's target-KL rule, with a learning
rate that backs off).

    probe  = the first chunk of the first `KL_GROUPS` groups trained on: the tokens the
             release's KL guard reads as the checkpoint's `kl_to_base`
    before the first step: the starting policy's logprobs on the probe
    after each optimizer step, on the probe, each token weighted by policy / sampler:
        k3(policy ‖ base), k3(policy ‖ start)
        both within `kl_budget`  kept: the weights and AdamW's moments remembered
        either past it           undone: the last kept weights and moments restored,
                                 the learning rate halved
        undone `MAX_BACKOFFS` times: the run stops there, with the last kept weights
    at the end: the guard's other figure, `kl_to_base_own` (answers the policy samples
        itself), against the budget; past it, the run steps back to earlier kept weights

So a candidate the trainer writes is within its budget on the very figures the release's
guard reads (`deploy/decide/trust.py`), and the budget is below the guard's bound (half
of `loop.max_kl_to_base` unless set): a run's work is never thrown away by its own guard.
A lineage that has used its budget to the base model trains no further (the run says so
and writes nothing), which is what the bound means.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from .data import Group, Sequence
from .errors import OverBudget
from .forward import Head, chunks, decoder_of, sampled_logprobs, sampler_logprobs
from .maths import k3, k3_of_sampled, token_logprobs

KL_GROUPS = 2  # groups the probe reads: enough for a guard, a bounded cost
MAX_BACKOFFS = 3  # halvings of the learning rate before the run stops at its budget
KEPT = 3  # earlier kept weights the end's check may step back to

Verdict = Literal["kept", "undone", "stopped"]


@dataclass(frozen=True)
class Drift:
    """k3 per token of the policy against a reference, and the tokens it read."""

    kl: float
    tokens: int


@dataclass(frozen=True)
class Reading:
    """The probe read once: the policy against the base model and against the start."""

    to_base: Drift
    to_start: Drift

    def worst(self) -> float:
        return max(self.to_base.kl, self.to_start.kl)


@dataclass
class Saved:
    """Weights and AdamW's moments after a kept step (step 0: the start), and the probe's
    reading of them (None: unbounded, nothing read)."""

    step: int
    weights: list[torch.Tensor]
    moments: dict
    reading: Reading | None = None


@dataclass
class Region:
    """The run's budget and what it has done to keep it. `budget` None: unbounded (the
    probe is read at the end only, for the manifest)."""

    model: object
    head: Head
    probe: list[list[Sequence]]
    device: object
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    budget: float | None
    start: list[torch.Tensor] = field(default_factory=list)  # the start's logprobs, per chunk
    kept: list[Saved] = field(default_factory=list)  # newest last, at most KEPT + 1
    backoffs: int = 0
    scale: float = 1.0  # the learning rate's factor: halved at each back-off
    latest: Reading | None = None  # the newest reading, within the budget or not
    stopped: str | None = None

    @classmethod
    def open(cls, model, head: Head, groups: list[Group], limit: int, device, params,
             optimizer, budget: float | None) -> Region:  # fmt: skip
        """The region at the run's start: the probe chosen, the start's logprobs on it, and
        the start remembered. A start already past the budget to the base model (a lineage
        that has used it) is refused: `OverBudget`."""
        probe = [next(iter(chunks(g, limit))) for g in groups[:KL_GROUPS]]
        region = cls(model, head, probe, device, params, optimizer, budget)
        with torch.no_grad():
            region.start = [sampled_logprobs(model, head, c, device) for c in probe]
        reading = region.read() if budget is not None else None
        region.kept.append(region._save(0, reading))
        if reading is not None and reading.to_base.kl > budget:
            raise OverBudget(
                f"the starting policy is already {reading.to_base.kl:.3g} nats per "
                f"token from the base model, past the run's KL budget {budget:g}: this "
                "lineage has used its budget (trainer.kl_budget, loop.max_kl_to_base)"
            )
        return region

    @property
    def last(self) -> Reading | None:
        """The reading of the weights kept last: the newest within the budget."""
        return self.kept[-1].reading

    def read(self) -> Reading:
        """The probe now: policy against base and against the start, weighted by policy /
        sampler (`maths.k3_of_sampled`: the tokens are the sampler's)."""
        base_sum = base_w = start_sum = start_w = 0.0
        tokens = 0
        with torch.no_grad():
            for chunk, start in zip(self.probe, self.start, strict=True):
                logp = sampled_logprobs(self.model, self.head, chunk, self.device)
                with self.model.disable_adapter():
                    ref = sampled_logprobs(self.model, self.head, chunk, self.device)
                old = sampler_logprobs(chunk, self.device)
                part, weight = k3_of_sampled(logp, ref, old)
                base_sum, base_w = base_sum + part, base_w + weight
                part, weight = k3_of_sampled(logp, start, old)
                start_sum, start_w = start_sum + part, start_w + weight
                tokens += logp.numel()
        return Reading(
            Drift(base_sum / base_w if base_w else 0.0, tokens),
            Drift(start_sum / start_w if start_w else 0.0, tokens),
        )

    def after_step(self, step: int, echo: Callable[[str], None]) -> Verdict:
        """The step just applied, kept or undone (see the module's docstring)."""
        if self.budget is None:
            return "kept"
        reading = self.latest = self.read()
        if reading.worst() <= self.budget:
            self.kept.append(self._save(step, reading))
            del self.kept[1:-KEPT]  # the start and the newest KEPT
            return "kept"
        self._restore(self.kept[-1])
        self.backoffs += 1
        said = (
            f"step {step} took the policy past its KL budget {self.budget:g} "
            f"(to the base model {reading.to_base.kl:.3g}, to the run's start "
            f"{reading.to_start.kl:.3g} nats per token): undone"
        )
        if self.backoffs >= MAX_BACKOFFS:
            self.stopped = (
                f"stopped after {self.backoffs} steps past the KL budget {self.budget:g}, "
                f"with the weights of step {self.kept[-1].step}"
            )
            echo(f"{said}; {self.stopped}")
            return "stopped"
        self.scale /= 2
        echo(f"{said}, the learning rate halved (x{self.scale:g})")
        return "undone"

    def settle(self, own: Callable[[], Drift], echo) -> tuple[Reading, Drift, int | None]:
        """The end: the guard's figures for the weights the run writes, stepping back to
        earlier kept weights while the policy's own answers read past the budget. The
        reading, the own-answer drift, and the step whose weights are written (None:
        unbounded, the last)."""
        if self.budget is None:
            return self.read(), own(), None
        # The weights now are the last kept (an undone step restored them): read already.
        reading, mine = self.last, own()
        while mine.kl > self.budget and len(self.kept) > 1:
            dropped = self.kept.pop()
            self._restore(self.kept[-1])
            echo(
                f"the policy's own answers read {mine.kl:.3g} nats per token from the base "
                f"model, past the KL budget {self.budget:g}: the weights of step "
                f"{dropped.step} dropped for those of step {self.kept[-1].step}"
            )
            reading, mine = self.last, own()
        return reading, mine, self.kept[-1].step

    def _save(self, step: int, reading: Reading | None) -> Saved:
        moments = {
            id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for p, s in self.optimizer.state.items()
        }
        return Saved(step, [p.detach().clone() for p in self.params], moments, reading)

    def _restore(self, saved: Saved) -> None:
        with torch.no_grad():
            for p, w in zip(self.params, saved.weights, strict=True):
                p.copy_(w)
        for p in self.params:
            state = saved.moments.get(id(p))
            if state is None:
                self.optimizer.state.pop(p, None)
            else:
                self.optimizer.state[p] = {
                    k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()
                }


# Tokens the policy samples per prompt for `kl_to_base_own`.
OWN_TOKENS = 32


def own_drift(model, head: Head, groups: list[Group], device) -> Drift:
    """k3(policy ‖ base) per token on answers the trained policy samples itself (one per
    group's prompt, `OWN_TOKENS` tokens, temperature 1): the estimator
    is unbiased only on the policy's own samples, and a candidate that learned a new
    way to answer (a hedge the old sampler never wrote) moved most there.

    The prompts are sampled together, left-padded (`generate` places each row's
    positions by its mask), and the policy's logprobs are the logits `generate` sampled
    from; the base scores every answer in one forward, right-padded (a causal model's
    pads after a row change nothing before them), its head on the answers' rows only.
    One prompt at a time, decoding and scoring with the policy again cost 4 prompts
    ~11 s of a 16-group run's ~57 CPU s (docs/benchmarks.md, "A training run's
    overhead")."""
    prompts = [g.members[0].tokens[: g.members[0].first_loss] for g in groups]
    if not prompts:
        return Drift(0.0, 0)
    pad = _pad_id(model.config)
    pad = 0 if pad is None else pad
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=OWN_TOKENS,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
        answers = [_until_end(row.tolist(), model.config) for row in out.sequences[:, width:]]
        sampled = torch.stack(out.logits, 1).float().log_softmax(-1)  # [rows, steps, vocab]
        rows = [p + a for p, a in zip(prompts, answers, strict=True)]
        longest = max(len(r) for r in rows)
        batch = torch.tensor([r + [pad] * (longest - len(r)) for r in rows], device=device)
        with model.disable_adapter():
            hidden = decoder_of(model)(input_ids=batch, use_cache=False).last_hidden_state
            total, tokens = 0.0, 0
            for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
                if not a:
                    continue
                target = torch.tensor(a, device=device)
                logp = sampled[i, : len(a)].gather(-1, target[:, None]).squeeze(-1)
                ref = token_logprobs(hidden[i, len(p) - 1 : len(p) + len(a) - 1], head, target)
                total += k3(logp, ref).sum().item()
                tokens += len(a)
    return Drift(total / max(tokens, 1), tokens)


def _until_end(tokens: list[int], config) -> list[int]:
    """A sampled row up to and including its first end-of-sequence id (`generate` pads a
    finished row with one)."""
    ends = _eos_ids(config)
    for n, t in enumerate(tokens):
        if t in ends:
            return tokens[: n + 1]
    return tokens


def _eos_ids(config) -> list:
    """The end-of-sequence ids: a family may list several; any of them ends a row."""
    eos = config.eos_token_id
    return list(eos) if isinstance(eos, list | tuple) else [eos]


def _pad_id(config) -> int | None:
    """`generate` pads finished rows with this: the first end-of-sequence id."""
    return next(iter(_eos_ids(config)), None)
