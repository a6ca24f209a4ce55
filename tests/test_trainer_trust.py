"""The trust region a run keeps (trainer/trust.py): a learning rate that would overshoot
is backed off and the run stays within its KL budget on the policy's own answers, the
figure the release's KL guard reads; a run far on the tokens it trained on but near on
its own answers keeps its steps; a lineage past its budget trains no further;
unbounded, nothing is undone. A tiny model with the real tokenizer, real peft, a real
Parquet snapshot."""

from __future__ import annotations

import pytest

from onjob.collector import Store
from onjob.deploy.act.runs import record as record_run
from onjob.deploy.act.training import kl_budget
from onjob.deploy.decide import trust as guard
from onjob.deploy.settings import DeploySettings, LoopSettings
from onjob.trainer import NothingToTrain, TrainSettings
from onjob.trainer.loop import train
from tests.test_trainer_rules import group_of, write


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


# A rate at which one step moves the tiny model nats per token from where it started.
OVERSHOOT = 0.01


def settings(tiny_model_dir, **kw) -> TrainSettings:
    given = {"lora_rank": 8, "groups_per_step": 1, "learning_rate": OVERSHOOT, "kl_own_prompts": 2}
    return TrainSettings(base_model=tiny_model_dir, **(given | kw))


def test_a_rate_that_would_overshoot_is_backed_off_and_the_run_stays_within_budget(
    tmp_path, tiny_model_dir, base
):
    snap = write(tmp_path / "s.parquet", {g: group_of(base) for g in "abcdef"})
    free = train(snap, tmp_path / "free", settings(tiny_model_dir), progress=False,
                 echo=lambda _: None)  # fmt: skip
    budget = 0.01
    # Unbounded, the same run goes far past the budget on the policy's own answers (the
    # figure the region holds and the guard reads): the region is what holds it.
    assert free.metrics.kl_to_base_own > 2 * budget
    assert free.metrics.undone_steps == 0 and free.metrics.kl_budget is None

    lines = []
    held = train(snap, tmp_path / "held", settings(tiny_model_dir, kl_budget=budget),
                 progress=False, echo=lines.append)  # fmt: skip
    m = held.metrics
    assert m.kl_budget == budget
    assert m.kl_to_base_own <= budget and m.kl_to_start <= budget
    assert m.undone_steps >= 1
    assert any("past its KL budget" in line and "undone" in line for line in lines), lines
    undone = [h for h in held.history if h.undone]
    assert undone and all(h.kl_to_base > budget or h.kl_to_start > budget for h in undone[:1])
    assert all(h.kl_on == "own" for h in undone)  # the sampler's tokens only screen
    # Each back-off halves the rate of the steps after it.
    first = undone[0].step
    after = [h.lr for h in held.history if h.step > first]
    assert after and all(lr <= OVERSHOOT / 2 + 1e-12 for lr in after)
    assert m.steps == sum(not h.undone for h in held.history)

    # The release's guard, at the bound the budget is half of, passes what was written.
    store = Store(tmp_path / "onjob.duckdb")
    record_run(store, "run-1", held, tmp_path / "held", None)
    verdict = guard.kl_guard(store, held.name, LoopSettings(max_kl_to_base=2 * budget))
    store.close()
    assert verdict.tripped is None, verdict


def test_a_run_far_on_the_tokens_it_trained_on_but_near_on_its_own_answers_keeps_its_steps(
    tmp_path, tiny_model_dir, base
):
    """The snapshot's tokens are the ones the run fits: reweighted toward the policy, they
    read it where every change it made is (in-sample), far past the budget, while its own
    answers, fresh samples, read it near. The own answers decide: every step kept, and the
    release's guard, reading the same figure, passes the candidate (on a tool task the
    probe held runs to a tenth of the movement the guard allows)."""
    snap = write(tmp_path / "s.parquet", {g: group_of(base) for g in "abcdef"})
    budget = 0.15
    manifest = train(snap, tmp_path / "ckpt", settings(tiny_model_dir, kl_budget=budget),
                     progress=False, echo=lambda _: None)  # fmt: skip
    m = manifest.metrics
    assert m.kl_to_base > 2 * budget  # the sampler's tokens: far
    assert m.kl_to_base_own <= budget and m.kl_to_start <= budget  # its own answers: near
    assert m.undone_steps == 0 and m.steps == 6
    # The first step is read on the policy's own answers (the screen's scale, how much
    # further they read than the sampler's tokens, is unknown until then), and so is
    # each step the scaled screen reads past the budget.
    assert manifest.history[0].kl_on == "own"
    assert all(h.kl_to_base <= budget for h in manifest.history if h.kl_on == "own")

    store = Store(tmp_path / "onjob.duckdb")
    record_run(store, "run-1", manifest, tmp_path / "ckpt", None)
    verdict = guard.kl_guard(store, manifest.name, LoopSettings(max_kl_to_base=2 * budget))
    store.close()
    assert verdict.tripped is None, verdict


def test_three_steps_past_the_budget_stop_the_run_and_none_within_it_writes_nothing(
    tmp_path, tiny_model_dir, base
):
    """PPO's target-KL rule: the third step past the budget ends the run. Here even the
    first step, at an eighth of the rate, is past it, so no weights but the start's are
    within it: the run says so and writes nothing (the loop records the groups as used,
    as for any run with nothing to train)."""
    snap = write(tmp_path / "s.parquet", {g: group_of(base) for g in "abcdefgh"})
    lines = []
    with pytest.raises(NothingToTrain, match="no step of the run stayed within its KL budget"):
        train(snap, tmp_path / "ckpt", settings(tiny_model_dir, kl_budget=1e-6),
              progress=False, echo=lines.append)  # fmt: skip
    undone = [line for line in lines if "past its KL budget" in line]
    assert len(undone) == 3, lines
    assert "learning rate halved (x0.5)" in undone[0] and "(x0.25)" in undone[1]
    assert "stopped after 3 steps past the KL budget" in undone[2]
    assert not (tmp_path / "ckpt").exists()


def test_a_lineage_already_past_its_budget_trains_no_further(tmp_path, tiny_model_dir, base):
    snap = write(tmp_path / "s.parquet", {g: group_of(base) for g in "abcd"})
    train(snap, tmp_path / "one", settings(tiny_model_dir, kl_own_prompts=0), progress=False,
          echo=lambda _: None)  # fmt: skip
    with pytest.raises(NothingToTrain, match="this lineage has used its budget"):
        train(snap, tmp_path / "two", settings(tiny_model_dir, kl_budget=1e-3), progress=False,
              parent=tmp_path / "one", echo=lambda _: None)  # fmt: skip
    assert not (tmp_path / "two").exists()


def test_the_budget_is_half_the_release_bound_unless_set():
    assert kl_budget(DeploySettings()) == 0.25  # production's bound, 0.5
    assert kl_budget(DeploySettings(loop=LoopSettings(max_kl_to_base=1.0))) == 0.5
    assert kl_budget(DeploySettings(loop=LoopSettings(max_kl_to_base=None))) is None
    assert kl_budget(DeploySettings(trainer=TrainSettings(kl_budget=0.1))) == 0.1
