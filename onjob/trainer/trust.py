"""The trust region a run keeps: a KL budget per token, to the base model and to the
policy the run started from, held step by step (PPO's target-KL rule, with a learning
rate that backs off), on the figure the release's KL guard reads: k3(policy ‖ ·) on
answers the policy samples itself.

    own      = one answer per prompt of the first `kl_own_prompts` distinct prompts,
               sampled by the policy now (`OWN_TOKENS` tokens, temperature 1, the same
               seed at every reading), scored by the base model and by the run's start
    probe    = the first chunk of the first `KL_GROUPS` groups trained on, the tokens the
               previous checkpoint sampled, each weighted by policy / sampler: a reading
               without sampling, so cheap enough to screen every step
    ratio    = how much further the own answers read than the probe at the last look
               (at least 1): the screen's scale
    before the first step: the starting policy's logprobs on the probe
    after each optimizer step:
        the probe x ratio within `kl_budget` (the ratio known)   kept
        else the policy's own answers, to the base model and to the start (and the
        ratio read again):
            both within the budget    kept
            either past it            undone: the last kept weights and moments
                                      restored, the learning rate halved
        undone `MAX_BACKOFFS` times: the run stops there, with the last kept weights
    at the end: the own answers of the weights written (`kl_to_base_own`, what the guard
        reads) against the budget; past it (a step the probe screened through), the
        run steps back to earlier kept weights

Why the own answers decide: k3 is unbiased on the policy's own samples only. On another
sampler's tokens, reweighted, it reads the policy where that sampler went, and a run
that learned to avoid the sampler's mistakes moved most exactly there: on a tool task
the probe read 0.46-0.48 nats per token after one run where the candidate's own answers
read 0.02-0.06 (docs/benchmarks.md, issue 62's weather runs), and the probe held the run
to a tenth of the movement the guard allows. The probe stays as a screen (a step it
reads within the budget, scaled by how much further the own answers read at the last
look, is kept without sampling) and in the manifest (`kl_to_base`). On a task whose
answers get short the own answers read further than the probe (per token, a short answer
carries its whole drift in few tokens): sentiment's second run read 0.9 on its own
answers after three steps the unscaled probe had kept, and the end's check stepped back
to the first.

So a candidate the trainer writes is within its budget on the figure the release's guard
reads (`deploy/decide/trust.py`), and the budget is below the guard's bound (half of
`loop.max_kl_to_base` unless set): a run's work is never thrown away by its own guard.
A lineage that has used its budget to the base model trains no further (the run says so
and writes nothing), which is what the bound means. With `kl_own_prompts` 0 the probe
alone decides, and the guard reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch

from .data import Group, Sequence
from .errors import OverBudget
from .forward import Head, chunks, decoder_of, sampled_logprobs, sampler_logprobs
from .maths import k3, k3_of_sampled, token_logprobs

KL_GROUPS = 2  # groups the probe reads: enough for a screen, a bounded cost
MAX_BACKOFFS = 3  # halvings of the learning rate before the run stops at its budget
KEPT = 3  # earlier kept weights the end's check may step back to
OWN_TOKENS = 32  # tokens the policy samples per prompt for its own answers
OWN_SEED = 0  # every reading samples with it: a step's reading moves with the weights only

Verdict = Literal["kept", "undone", "stopped"]
On = Literal["probe", "own"]


@dataclass(frozen=True)
class Drift:
    """k3 per token of the policy against a reference, and the tokens it read."""

    kl: float
    tokens: int


@dataclass(frozen=True)
class Reading:
    """The policy against the base model and against the run's start, read on the probe
    (the sampler's tokens, reweighted) or on the policy's own answers."""

    to_base: Drift
    to_start: Drift
    on: On = "probe"

    def worst(self) -> float:
        return max(self.to_base.kl, self.to_start.kl)


@dataclass
class Saved:
    """Weights and AdamW's moments after a kept step (step 0: the start), and the reading
    that kept them (None: unbounded, nothing read)."""

    step: int
    weights: list[torch.Tensor]
    moments: dict
    reading: Reading | None = None


@dataclass
class Region:
    """The run's budget and what it has done to keep it. `budget` None: unbounded (read
    at the end only, for the manifest)."""

    model: object
    head: Head
    probe: list[list[Sequence]]
    prompts: list[list[int]]  # the own answers' prompts; none: the probe alone decides
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
    # How much further the own answers read than the probe at the last look (>= 1): on a
    # task whose answers get short they read the policy further (sentiment: 0.9 on its
    # own answers after three steps the probe read within 0.5), so the screen scales by it.
    ratio: float | None = None

    @classmethod
    def open(cls, model, head: Head, groups: list[Group], limit: int, device, params,
             optimizer, budget: float | None, own_prompts: int) -> Region:  # fmt: skip
        """The region at the run's start: the probe and the own answers' prompts chosen,
        the start's logprobs on the probe, and the start remembered. A start already past
        the budget to the base model (a lineage that has used it) is refused:
        `OverBudget`."""
        probe = [next(iter(chunks(g, limit))) for g in groups[:KL_GROUPS]]
        prompts = distinct_prompts(groups, own_prompts)
        region = cls(model, head, probe, prompts, device, params, optimizer, budget)
        with torch.no_grad():
            region.start = [sampled_logprobs(model, head, c, device) for c in probe]
        reading = region.read() if budget is not None else None
        region.kept.append(region._save(0, reading))
        if reading is not None and reading.to_base.kl > budget:
            raise OverBudget(
                f"the starting policy is already {reading.to_base.kl:.3g} nats per "
                f"token from the base model ({_named(reading)}), past the run's KL budget "
                f"{budget:g}: this lineage has used its budget (trainer.kl_budget, "
                "loop.max_kl_to_base)"
            )
        return region

    @property
    def last(self) -> Reading | None:
        """The reading of the weights kept last: the newest within the budget."""
        return self.kept[-1].reading

    def read(self) -> Reading:
        """The probe, then the policy's own answers, which decide, whenever the probe
        scaled by how much further the own answers read at the last look (`ratio`, at
        least 1; unknown until a look at a policy that moved) is past the budget."""
        probe = self.read_probe()
        if not self.prompts:
            return probe
        screened = self.ratio is not None and probe.worst() * self.ratio <= (self.budget or 0)
        if screened:
            return probe
        own = self.read_own()
        if probe.worst() > 0:
            self.ratio = max(1.0, own.worst() / probe.worst())
        return own

    def read_probe(self) -> Reading:
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

    def read_own(self) -> Reading:
        """The policy's own answers now, scored by the base model and by the run's start
        (its weights swapped in for one forward; before the first step it is the start)."""
        answers = Answers.sample(self.model, self.prompts, self.device)
        with self.model.disable_adapter():
            to_base = answers.drift(self.model, self.head, self.device)
        if not self.kept:
            return Reading(to_base, Drift(0.0, to_base.tokens), "own")
        with self._weights(self.kept[0]):
            to_start = answers.drift(self.model, self.head, self.device)
        return Reading(to_base, to_start, "own")

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
            f"{reading.to_start.kl:.3g} nats per token, {_named(reading)}): undone"
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

    def settle(self, echo) -> tuple[Reading, Reading | None, int | None]:
        """The end: the figures for the weights the run writes, stepping back to earlier
        kept weights while the policy's own answers read past the budget (a step the probe
        screened through). The probe's reading, the own answers' (None: not read), and the
        step whose weights are written (None: unbounded, the last)."""
        own = self.read_own if self.prompts else lambda: None
        if self.budget is None:
            return self.read_probe(), own(), None

        def kept_own() -> Reading | None:
            # The weights kept last were read on their own answers already when the screen
            # sent them there: the same weights and seed read alike, so not sampled again.
            last = self.last
            return last if last is not None and last.on == "own" else own()

        mine = kept_own()
        while mine is not None and mine.worst() > self.budget and len(self.kept) > 1:
            dropped = self.kept.pop()
            self._restore(self.kept[-1])
            echo(
                f"the policy's own answers read {mine.to_base.kl:.3g} nats per token from "
                f"the base model, {mine.to_start.kl:.3g} from the run's start, past the KL "
                f"budget {self.budget:g}: the weights of step {dropped.step} dropped for "
                f"those of step {self.kept[-1].step}"
            )
            mine = kept_own()
        return self.read_probe(), mine, self.kept[-1].step

    def _save(self, step: int, reading: Reading | None) -> Saved:
        moments = {
            id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for p, s in self.optimizer.state.items()
        }
        return Saved(step, [p.detach().clone() for p in self.params], moments, reading)

    def _load(self, weights: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, w in zip(self.params, weights, strict=True):
                p.copy_(w)

    def _restore(self, saved: Saved) -> None:
        self._load(saved.weights)
        for p in self.params:
            state = saved.moments.get(id(p))
            if state is None:
                self.optimizer.state.pop(p, None)
            else:
                self.optimizer.state[p] = {
                    k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()
                }

    @contextlib.contextmanager
    def _weights(self, saved: Saved) -> Iterator[None]:
        """`saved`'s weights in the model for the block, the current ones back after it
        (the adapter's few tensors: cheap to copy)."""
        now = [p.detach().clone() for p in self.params]
        self._load(saved.weights)
        try:
            yield
        finally:
            self._load(now)


def _named(reading: Reading) -> str:
    return "on its own answers" if reading.on == "own" else "on the sampler's tokens"


def distinct_prompts(groups: list[Group], n: int) -> list[list[int]]:
    """The first `n` distinct prompts of the groups, in order (a scenario's groups often
    share one: four readings of one prompt say less than one of four)."""
    out: list[list[int]] = []
    for g in groups:
        first = g.members[0]
        prompt = first.tokens[: first.first_loss]
        if len(out) < n and prompt not in out:
            out.append(prompt)
    return out


@dataclass(frozen=True)
class Answers:
    """One answer per prompt sampled by the policy, and the policy's logprob of each of
    its tokens (from the logits it was sampled from)."""

    prompts: list[list[int]]
    answers: list[list[int]]
    logprobs: list[torch.Tensor]
    pad: int

    @classmethod
    def sample(cls, model, prompts: list[list[int]], device) -> Answers:
        """Sampled together, left-padded (`generate` places each row's positions by its
        mask), at temperature 1 with `OWN_SEED` (the training's own random state is left
        as it was). One prompt at a time, decoding and scoring with the policy again
        cost 4 prompts ~11 s of a 16-group run's ~57 CPU s (docs/benchmarks.md, "A
        training run's overhead"); together, ~5 s for 4 to 16 prompts on 2 cores."""
        pad = _pad_id(model.config)
        pad = 0 if pad is None else pad
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        devices = [device] if torch.device(device).type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(OWN_SEED)
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
        logprobs = [
            sampled[i, : len(a)].gather(-1, torch.tensor(a, device=device)[:, None]).squeeze(-1)
            for i, a in enumerate(answers)
        ]
        return cls(prompts, answers, logprobs, pad)

    def drift(self, model, head: Head, device) -> Drift:
        """k3(policy ‖ the model as it stands) per token on the answers: the reference
        scores every answer in one forward, right-padded (a causal model's pads after a
        row change nothing before them), its head on the answers' rows only."""
        rows = [p + a for p, a in zip(self.prompts, self.answers, strict=True)]
        longest = max(len(r) for r in rows)
        batch = torch.tensor([r + [self.pad] * (longest - len(r)) for r in rows], device=device)
        total, tokens = 0.0, 0
        with torch.no_grad():
            hidden = decoder_of(model)(input_ids=batch, use_cache=False).last_hidden_state
            for i, (p, a) in enumerate(zip(self.prompts, self.answers, strict=True)):
                if not a:
                    continue
                target = torch.tensor(a, device=device)
                ref = token_logprobs(hidden[i, len(p) - 1 : len(p) + len(a) - 1], head, target)
                total += k3(self.logprobs[i], ref).sum().item()
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
