"""Guards on what no reward sees: how far a checkpoint moved from the base model, and
whether the judges that trained and referee it agree with users.

- **KL to the base model** (`loop.max_kl_to_base`): the trainer measures k3(policy ‖ base)
  per token on answers the candidate samples itself (`kl_to_base_own`; a continued
  checkpoint carries its lineage's whole drift), the figure its trust region holds, and
  the guard reads it; the same on the snapshot's tokens, sampled by the previous
  checkpoint and weighted by policy / sampler (`kl_to_base`), is shown beside it and
  read only for a run without own answers. A policy that moved far to please a reward
  has usually found a blind spot in it; past the bound the candidate is stopped before
  any canary, and a canary is rolled back.
- **The judges against users** (`loop.min_judge_agreement`): where feedback exists,
  `judge.agreement` says how often each judge orders a group's members as users do. When
  the coach (`judge.model`, `judge.rewards`) or the referee (`loop.gate`) is, with 95%
  confidence, below the bound over `agreement.MIN_PAIRS` pairs or more, its rewards do
  not follow users: nothing it trained or refereed is promoted (candidate stopped,
  canary rolled back). Judges without enough feedback are not held against anyone.

Each returns its figures with its outcome (`evidence.Drift`, `evidence.JudgeAgreement`), like
`shape.guards`.

And who may promote (`release_mode`): the loop promotes a canary by itself only when
something other than its coach judges it. Either a referee (`loop.gate`) scores the
pairs, or users' feedback checks the coach (every coach judge agrees with users, with
`agreement.MIN_PAIRS` rated pairs or more, each with one of the canary's own answers).
Otherwise a canary that wins its pairs is
only *ready for review*: its coach says it is better, which is what a candidate that
learned to game that coach would also make it say, so a person decides (`onjob promote`
or `onjob rollback`).
"""

from __future__ import annotations

import json

from ...judge import agreement
from ..settings import DeploySettings, LoopSettings
from .evidence import Drift, JudgeAgreement, ReleaseMode


def static_mode(settings: DeploySettings) -> ReleaseMode:
    """The mode the settings alone give (`onjob serve`'s start-up line): `referee` with a
    `loop.gate`, else `review` until users' feedback checks the coach."""
    gate = settings.loop.gate
    if gate.configured:
        names = ([f"ruler:{gate.model}"] if gate.model else []) + [f"fn:{n}" for n in gate.rewards]
        return ReleaseMode.of(
            "referee",
            f"automatic: canaries are refereed by loop.gate ({', '.join(names)}), not by "
            "the reward they were trained on",
        )
    coach = ", ".join(settings.judge.scorers) or "feedback alone"
    return ReleaseMode.of(
        "review",
        "review: no loop.gate, so canaries are judged by their coach (the scorer they were "
        f"trained on: {coach}); one that "
        "wins its pairs waits for `onjob promote` (automatic once users' feedback agrees "
        f"with the coach on {agreement.MIN_PAIRS}+ rated pairs per judge, with the "
        "canary's own answers in each)",
    )


def release_mode(store, settings: DeploySettings, candidate: str | None = None) -> ReleaseMode:
    """`static_mode`, with users' feedback read: every coach judge that `agrees` with users
    (`judge.agreement`: its 95% interval above chance, over `agreement.MIN_PAIRS` rated
    pairs or more) makes a `review` server automatic. With a `candidate`, only the rated
    pairs one of whose answers it gave count: a coach users trusted on older answers says
    nothing yet about a candidate that may have learnt to please it."""
    mode = static_mode(settings)
    coach = settings.judge.scorers
    if mode.automatic or not coach:
        return mode
    records: dict[str, list[agreement.Agreement]] = {j: [] for j in coach}
    for r in agreement.judge_agreement(store, per_scenario=False, checkpoint=candidate):
        if r.judge in records:
            records[r.judge].append(r)

    def checked(judge: str) -> bool:
        """It agrees with users on some feedback metric and is warned on none."""
        verdicts = {r.verdict for r in records[judge]}
        return "agrees" in verdicts and not verdicts & agreement.WARNED

    unchecked = [j for j in coach if not checked(j)]
    on = f" on {candidate}'s answers" if candidate else ""
    if unchecked:
        said = "; ".join(
            "; ".join(r.summary() for r in records[j]) or f"{j}: no rated pairs{on}"
            for j in unchecked
        )
        return ReleaseMode.of("review", f"{mode.reason}; now: {said}")
    return ReleaseMode.of(
        "users",
        f"automatic: users' feedback{on} agrees with the coach ("
        + "; ".join(r.summary() for j in coach for r in records[j])
        + ")",
    )


def kl_guard(store, checkpoint: str | None, settings: LoopSettings) -> Drift:
    """The checkpoint's recorded KL to the base model against `loop.max_kl_to_base`."""
    out = Drift(bound=settings.max_kl_to_base)
    if checkpoint is None:
        return out
    metrics = store.scalar(
        "SELECT t.metrics FROM checkpoints c JOIN train_runs t ON t.id = c.train_run "
        "WHERE c.name = ?",
        [checkpoint],
    )
    metrics = json.loads(metrics) if isinstance(metrics, str) else (metrics or {})
    # The candidate's own answers: k3 is unbiased on the policy's samples only. On the
    # previous sampler's tokens it reads the policy where that sampler went, which a run
    # that learned to avoid its mistakes left most (a tool task: 0.47 there, 0.05 on the
    # candidate's own answers); that figure decides only for a run that read no own
    # answers (`trainer.kl_own_prompts` 0).
    kl = metrics.get("kl_to_base_own")
    kl = metrics.get("kl_to_base") if kl is None else kl
    out.kl_to_base = metrics.get("kl_to_base")
    out.kl_to_base_own = metrics.get("kl_to_base_own")
    if kl is not None and settings.max_kl_to_base is not None and kl > settings.max_kl_to_base:
        out.tripped = (
            f"KL guard: {checkpoint} is {kl:.3g} nats per token from the base model "
            f"(more than {settings.max_kl_to_base:g})"
        )
    return out


def agreement_guard(store, judges: list[str], settings: LoopSettings) -> JudgeAgreement:
    """Each of `judges` (score sources: `ruler:<model>`, `fn:<name>`) with enough pairs
    with feedback, against `loop.min_judge_agreement`."""
    bound = settings.min_judge_agreement
    out = JudgeAgreement(bound=bound)
    if bound is None or not judges:
        return out
    for record in agreement.judge_agreement(store, per_scenario=False):
        if record.judge not in judges:
            continue
        named = f" ({record.metric})" if record.metric else ""  # one record per metric
        out.judges[record.judge + named] = record
        if record.verdict == "too few pairs" or record.accuracy_ci is None:
            continue
        if record.accuracy_ci[1] < bound and out.tripped is None:
            out.tripped = (
                f"judge agreement guard: {record.summary()}; below {bound:.0%} agreement "
                "with users, its rewards are not evidence"
            )
    return out
