"""What a run trains on and when it refuses: the snapshot cut at the judged turn, every
turn's checkpoint checked, one exchange trained once, the baseline of one sampling
distribution, members too long, groups the sampler disagrees with, a parent adapter
that differs from the settings, and no dropout in the ratio. Real DuckDB, a tiny model
with the real tokenizer, real peft."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pydantic import ValidationError

from onjob.collector import Store
from onjob.deploy.act.runs import record as record_run
from onjob.trainer import ParentMismatch, TrainSettings, snapshot
from onjob.trainer.data import load
from onjob.trainer.errors import NothingToTrain
from onjob.trainer.loop import train

# A three-turn conversation as the engine logged it: each prompt holds the earlier turns.
P1, C1 = [1, 2, 3], [10, 11]
P2, C2 = [*P1, *C1, 4, 5], [20]
P3, C3 = [*P2, *C2, 6], [30, 31]


class Db:
    def __init__(self, path):
        self.store = Store(path)

    def exchange(self, id, trajectory, turn, prompt, completion, *, checkpoint=None, **kw):
        self.store.con.execute(
            "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id, checkpoint, "
            "request, prompt_token_ids, completion_token_ids, completion_logprobs, status, "
            "source, untrainable) VALUES (?, now(), ?, ?, 's', ?, ?, ?, ?, ?, 200, ?, ?)",
            [
                id,
                trajectory,
                turn,
                checkpoint,
                json.dumps(kw.get("request", {})),
                prompt,
                kw.get("choices", [completion]),
                [[-0.5] * len(c) for c in kw.get("choices", [completion])],
                kw.get("source", "production"),
                kw.get("untrainable"),
            ],
        )

    def group(self, id, kind, members: list[tuple[str, str, float, str]], prefix=None):
        """members: (exchange id, trajectory id, combined reward, origin), choice 0 each."""
        con = self.store.con
        con.execute(
            "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, checkpoints, status, "
            "created) VALUES (?, 's', ?, ?, [], 'scored', now())",
            [id, prefix, kind],
        )
        for position, (exchange, trajectory, reward, origin) in enumerate(members):
            member = f"{id}-m{position}"
            con.execute(
                "INSERT INTO members VALUES (?, ?, ?, ?, 0, ?, ?)",
                [member, id, position, exchange, trajectory, origin],
            )
            con.execute(
                "INSERT INTO scores (id, group_id, member_id, source, score, created) "
                "VALUES (?, ?, ?, 'combined', ?, now())",
                [f"{member}-s", id, member, reward],
            )


@pytest.fixture
def db(tmp_path):
    db = Db(tmp_path / "onjob.duckdb")
    # Conversation t1, judged at its second turn; its third turn came later.
    db.exchange("x1", "t1", 1, P1, C1)
    db.exchange("x2", "t1", 2, P2, C2)
    db.exchange("x3", "t1", 3, P3, C3)
    db.exchange("y1", "t2", 1, P1, [12])
    db.group(
        "conversations",
        "trajectory",
        [("x2", "t1", 1.0, "production"), ("y1", "t2", 0.0, "production")],
    )
    yield db
    db.store.close()


def export(db: Db, path, **settings):
    return snapshot.export(db.store, path, TrainSettings(**settings), live=None)


def test_a_conversation_is_cut_at_its_judged_turn(db, tmp_path):
    """Turn 3 was logged after the group was judged at turn 2: it earned no advantage."""
    export(db, tmp_path / "s.parquet")
    rows = {r["member_id"]: r for r in pq.read_table(tmp_path / "s.parquet").to_pylist()}
    judged = rows["conversations-m0"]
    assert judged["exchange_ids"] == ["x1", "x2"]
    assert judged["completion_ids"] == [C1, C2]
    (group,), _ = load(tmp_path / "s.parquet", TrainSettings())
    trained = next(m for m in group.members if m.member_id == "conversations-m0")
    assert trained.tokens == [*P2, *C2]


def test_a_conversation_with_one_turn_from_a_stale_checkpoint_is_not_exported(db, tmp_path):
    """Its last turn is the live model's, its first an old checkpoint's: the ratio of that
    first turn would compare with weights long gone."""
    db.exchange("z1", "t3", 1, P1, C1, checkpoint="ancient")
    db.exchange("z2", "t3", 2, P2, C2)
    db.exchange("w1", "t4", 1, P1, [13])
    db.group(
        "stale", "trajectory", [("z2", "t3", 1.0, "production"), ("w1", "t4", 0.0, "production")]
    )
    info = export(db, tmp_path / "s.parquet")
    assert info.groups == ["conversations"]


def test_a_conversation_with_one_untrainable_turn_is_not_exported(db, tmp_path):
    """One rule for what is trained on (`onjob.logprobs.untrainable`): a turn whose token
    ids did not add up to the engine's count (a streamed chunk vLLM 0.11 dropped) keeps
    its whole group out of every snapshot."""
    db.exchange("u1", "t5", 1, P1, C1, untrainable="count")
    db.exchange("u2", "t5", 2, P2, C2)
    db.exchange("v1", "t6", 1, P1, [14])
    db.group(
        "lost", "trajectory", [("u2", "t5", 1.0, "production"), ("v1", "t6", 0.0, "production")]
    )
    assert snapshot.trainable(db.store, TrainSettings()).groups == 1
    info = export(db, tmp_path / "s.parquet")
    assert info.groups == ["conversations"]


def test_an_exchange_in_a_turn_group_and_a_conversation_is_trained_once(db, tmp_path):
    """x1 is the logged member of a turn group and turn 1 of conversation t1: the turn
    group trains it (rivals for the same prompt, the better baseline); the conversation
    keeps it as context."""
    db.exchange("r1", "t1", 1, P1, None, choices=[[14], [15]], source="resample")
    db.group(
        "turn", "turn", [("x1", "t1", 1.0, "logged"), ("r1", "t1", 0.0, "sampled")], prefix="x1"
    )
    export(db, tmp_path / "s.parquet")
    groups, notes = load(tmp_path / "s.parquet", TrainSettings())
    conversation = next(g for g in groups if g.id == "conversations")
    judged = next(m for m in conversation.members if m.member_id == "conversations-m0")
    assert judged.loss_mask == [False] * len(P2) + [True]  # turn 2's answer only
    assert notes.trained_elsewhere == 1
    turn = next(g for g in groups if g.id == "turn")
    assert [m.tokens[len(P1) :] for m in turn.members] == [C1, [14]]


def test_a_logged_answer_sampled_otherwise_is_scored_against_its_rivals_not_in_their_mean(
    db, tmp_path
):
    db.exchange("q", "t5", 1, P1, [40], request={"temperature": 0.2})
    db.exchange(
        "r",
        "t5",
        1,
        P1,
        None,
        choices=[[41], [42]],
        source="resample",
        request={"temperature": 1.0, "top_p": 1.0},
    )
    con = db.store.con
    con.execute(
        "INSERT INTO groups (id, scenario_id, prefix_exchange, kind, checkpoints, status, "
        "created) VALUES ('tg', 's', 'q', 'turn', [], 'scored', now())"
    )
    for position, (exchange, choice, reward, origin) in enumerate(
        [("q", 0, 1.0, "logged"), ("r", 0, 0.2, "sampled"), ("r", 1, 0.4, "sampled")]
    ):
        con.execute(
            "INSERT INTO members VALUES (?, 'tg', ?, ?, ?, 't5', ?)",
            [f"tg{position}", position, exchange, choice, origin],
        )
        con.execute(
            "INSERT INTO scores (id, group_id, member_id, source, score, created) "
            "VALUES (?, 'tg', ?, 'combined', ?, now())",
            [f"s{position}", f"tg{position}", reward],
        )
    export(db, tmp_path / "s.parquet")
    groups, notes = load(tmp_path / "s.parquet", TrainSettings())
    tg = next(g for g in groups if g.id == "tg")
    assert [m.advantage for m in tg.members] == pytest.approx([0.7, -0.1, 0.1])
    assert [m.tokens[-1] for m in tg.members] == [40, 41, 42]
    assert notes.outside_baseline == 1


# --- runs on a tiny model


def logprobs_of(model, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return (
        torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1).tolist()
    )


def write(
    path,
    groups: dict[str, list[tuple[list[int], list[int], float, list[float]]]],
    sampler: str | None = None,
):
    rows = [
        {
            "group_id": g,
            "kind": "turn",
            "member_id": f"{g}-{i}",
            "position": i,
            "reward": reward,
            "checkpoint": sampler,
            "prompt_ids": [prompt],
            "completion_ids": [completion],
            "logprobs": [lps],
        }
        for g, members in groups.items()
        for i, (prompt, completion, reward, lps) in enumerate(members)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


PROMPT = [1, 500, 600, 700, 800]
ANSWERS = [[900, 901, 902], [910, 911], [920, 921, 922, 923]]


def group_of(model, rewards=(1.0, 0.0, 0.5)):
    return [
        (PROMPT, a, r, logprobs_of(model, PROMPT, a)) for a, r in zip(ANSWERS, rewards, strict=True)
    ]


def test_a_group_the_sampler_disagrees_with_is_skipped_and_recorded_and_the_run_goes_on(
    tmp_path, tiny_model_dir, base
):
    """One token logged at -1e4 (another model sampled it): the ratio was inf and the whole
    run Diverged, so the same snapshot failed on every run. Now the group is skipped with
    its reason and recorded as used; the others train."""
    bad = group_of(base)
    bad[1] = (PROMPT, ANSWERS[1], 0.0, [-1e4, bad[1][3][1]])
    snap = write(tmp_path / "s.parquet", {"good": group_of(base), "bad": bad})
    lines = []
    manifest = train(
        snap,
        tmp_path / "ckpt",
        TrainSettings(base_model=tiny_model_dir, lora_rank=8),
        progress=False,
        echo=lines.append,
    )
    assert manifest.groups == ["good"]
    assert "differ from the logged ones" in manifest.skipped_groups["bad"]
    assert any(line.startswith("group bad:") for line in lines)
    assert manifest.metrics.skipped_groups == 1
    assert manifest.metrics.logprob_gap_step0_max > 1e3  # the metric shows it
    store = Store(tmp_path / "onjob.duckdb")
    record_run(store, "run-1", manifest, tmp_path / "ckpt", None)
    used = store.dicts("SELECT groups_used FROM train_runs")[0]["groups_used"]
    store.close()
    assert sorted(used) == ["bad", "good"]


def test_a_member_longer_than_max_tokens_per_member_is_skipped_with_its_reason(
    tmp_path, tiny_model_dir, base
):
    long_answer = list(range(1000, 1100))
    members = [*group_of(base), (PROMPT, long_answer, 0.2, logprobs_of(base, PROMPT, long_answer))]
    snap = write(tmp_path / "s.parquet", {"g": members})
    groups, notes = load(snap, TrainSettings(max_tokens_per_member=64))
    assert len(groups[0].members) == 3 and notes.too_long == 1
    assert any(
        "105 tokens, above trainer.max_tokens_per_member (64)" in line for line in notes.lines
    )


def test_the_ratio_starts_at_one_when_continuing_a_parent_written_with_dropout(
    tmp_path, tiny_model_dir, base
):
    """A parent with lora_dropout 0.5: in train mode its dropout made the first ratio
    noisy (and the clip fraction non-zero) although the weights were the sampler's."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    config = LoraConfig(
        r=8,
        lora_alpha=32,
        lora_dropout=0.5,
        init_lora_weights=False,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
    )
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config).save_pretrained(
        tmp_path / "parent"
    )
    sampler = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "parent"
    ).eval()
    snap = write(tmp_path / "s.parquet", {"g": group_of(sampler)}, sampler="parent")
    settings = TrainSettings(base_model=tiny_model_dir, lora_rank=8, learning_rate=1e-3)
    manifest = train(
        snap,
        tmp_path / "ckpt",
        settings,
        parent=tmp_path / "parent",
        progress=False,
        echo=lambda _: None,
    )
    first = manifest.history[0]
    assert first.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert first.clip_fraction == 0
    assert manifest.metrics.logprob_gap_step0_max < 1e-5


def test_continuing_a_parent_of_another_rank_is_refused_before_any_step(
    tmp_path, tiny_model_dir, base
):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config).save_pretrained(
        tmp_path / "parent"
    )
    snap = write(tmp_path / "s.parquet", {"g": group_of(base)})
    with pytest.raises(
        ParentMismatch, match=r"has rank 8, alpha 16, targets \['q_proj', 'v_proj'\]"
    ):
        train(
            snap,
            tmp_path / "ckpt",
            TrainSettings(base_model=tiny_model_dir, lora_rank=16),
            parent=tmp_path / "parent",
            progress=False,
            echo=lambda _: None,
        )
    assert not (tmp_path / "ckpt").exists()


def test_a_rank_the_engine_refuses_is_refused_in_the_settings():
    with pytest.raises(ValidationError, match=r"above trainer\.max_lora_rank 64"):
        TrainSettings(lora_rank=128)
    assert TrainSettings(lora_rank=128, max_lora_rank=128).lora_rank == 128


def test_the_sampler_check_runs_before_the_first_update_and_skips_other_weights_only(
    tmp_path, tiny_model_dir, base
):
    """Each group was checked on its first forward, after the steps before it: in a run of
    64 groups the later ones met a policy the run itself had moved 1-2 nats per token and
    were skipped as "sampled by other weights". Now every group is checked once, against
    the policy at the run's start: a group another model sampled is still skipped, and
    the run's own drift, however large, skips nothing."""
    bad = group_of(base)
    bad[1] = (PROMPT, ANSWERS[1], 0.0, [-1e4, bad[1][3][1]])
    groups = {g: group_of(base) for g in "abcdef"} | {"z": bad}
    snap = write(tmp_path / "s.parquet", groups)
    lines = []
    manifest = train(
        snap,
        tmp_path / "ckpt",
        # A rate that moves the tiny model far in one step, no budget to stop it, and a
        # check far tighter than the default (1 nat per token).
        TrainSettings(
            base_model=tiny_model_dir, lora_rank=8, groups_per_step=1, learning_rate=0.05,
            kl_own_prompts=0, max_logprob_gap=0.05,
        ),
        progress=False,
        echo=lines.append,
    )  # fmt: skip
    assert manifest.groups == list("abcdef")
    assert list(manifest.skipped_groups) == ["z"]
    assert "before the first update" in manifest.skipped_groups["z"]
    assert manifest.steps == 6
    # The run did move the policy far from the sampler on the groups it met later (their
    # mean ratio to it past 1.5): the check on each group's first forward, at this bound,
    # would have skipped them as sampled by other weights.
    assert max(h.ratio_mean for h in manifest.history[1:]) > 1.5


def test_groups_sampled_before_the_runs_start_are_checked_against_their_samplers_weights(
    tmp_path, tiny_model_dir, base
):
    """After a promotion the next run starts from the new live checkpoint while most of its
    groups were sampled by the one before (`trainer.max_staleness` 1). Measured against
    the run's start, a lineage that had moved past `max_logprob_gap` lost every group (a
    languages run of the learning bench lost a 64-group run so). Now each
    member is measured against the weights that sampled it: the base model's, or an
    earlier checkpoint's loaded for the check. A group another model sampled is still
    skipped."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    settings = TrainSettings(
        base_model=tiny_model_dir, lora_rank=8, groups_per_step=1, learning_rate=0.05,
        kl_own_prompts=0, max_logprob_gap=0.05,
    )  # fmt: skip
    one, two = tmp_path / "ckpt-one", tmp_path / "ckpt-two"
    quiet = {"progress": False, "echo": lambda _: None}
    train(
        write(tmp_path / "s1.parquet", {g: group_of(base) for g in "abc"}), one, settings, **quiet
    )

    # Sampled by the base model, trained from ckpt-one, which moved past the bound.
    bad = group_of(base)
    bad[1] = (PROMPT, ANSWERS[1], 0.0, [-1e4, bad[1][3][1]])
    snap = write(tmp_path / "s2.parquet", {"d": group_of(base), "e": group_of(base), "z": bad})
    manifest = train(snap, two, settings, parent=one, **quiet)
    assert manifest.groups == ["d", "e"] and list(manifest.skipped_groups) == ["z"]
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), one)
    moved = [
        abs(a - b)
        for answer in ANSWERS
        for a, b in zip(
            logprobs_of(tuned, PROMPT, answer), logprobs_of(base, PROMPT, answer), strict=True
        )
    ]
    assert sum(moved) / len(moved) > settings.max_logprob_gap  # against the start: skipped

    # Sampled by ckpt-one, trained from ckpt-two: ckpt-one's weights are loaded beside it
    # for the check; a sampler whose folder is gone is measured against the start.
    by_one = [
        (PROMPT, a, r, logprobs_of(tuned, PROMPT, a))
        for a, r in zip(ANSWERS, (1.0, 0.0, 0.5), strict=True)
    ]
    said: list[str] = []
    manifest = train(
        write(tmp_path / "s3.parquet", {"f": by_one, "g": by_one}, sampler="ckpt-one"),
        tmp_path / "ckpt-three", settings, parent=two, progress=False, echo=said.append,
    )  # fmt: skip
    assert manifest.groups == ["f", "g"] and not manifest.skipped_groups
    assert manifest.steps == 2  # the policy's own adapter trained after the check
    gone = write(tmp_path / "s4.parquet", {"h": by_one}, sampler="ckpt-gone")
    with pytest.raises(NothingToTrain):
        train(gone, tmp_path / "ckpt-four", settings, parent=two, progress=False, echo=said.append)
    assert any("sampled by ckpt-gone: its weights are not found beside" in line for line in said)


def test_a_lineage_continues_its_optimizer_moments_across_runs(tmp_path, tiny_model_dir, base):
    """Each run started AdamW from nothing, so its first update moved every parameter by
    about the learning rate in the sign of one small batch's gradient."""
    snap = write(tmp_path / "s.parquet", {"a": group_of(base), "b": group_of(base)})
    settings = TrainSettings(base_model=tiny_model_dir, lora_rank=8, groups_per_step=1)
    train(snap, tmp_path / "one", settings, progress=False, echo=lambda _: None)
    first = torch.load(tmp_path / "one" / "optimizer.pt", weights_only=True)
    assert {float(v["step"]) for v in first["state"].values()} == {2.0}

    said = []
    train(
        snap, tmp_path / "two", settings, parent=tmp_path / "one", progress=False, echo=said.append
    )
    second = torch.load(tmp_path / "two" / "optimizer.pt", weights_only=True)
    assert {float(v["step"]) for v in second["state"].values()} == {4.0}
    assert any("moments continued" in line for line in said), said
    # Unset, the rate is fitted to the model's width (the tiny model's 64: 4.5e-3).
    width = json.loads((tiny_model_dir / "config.json").read_text())["hidden_size"]
    assert second["param_groups"][0]["lr"] == settings.rate_for(width) == 5e-4 * 576 / width

    fresh = settings.model_copy(update={"keep_optimizer_state": False})
    train(
        snap, tmp_path / "three", fresh, parent=tmp_path / "one", progress=False, echo=said.append
    )
    third = torch.load(tmp_path / "three" / "optimizer.pt", weights_only=True)
    assert {float(v["step"]) for v in third["state"].values()} == {2.0}


def test_an_unset_learning_rate_is_fitted_to_the_models_width_and_a_set_one_is_kept():
    fitted = TrainSettings()
    assert fitted.learning_rate is None
    assert fitted.rate_for(576) == 5e-4  # SmolLM2-135M, where the rate was measured
    assert 6.9e-5 < fitted.rate_for(4096) < 7.1e-5  # an 8B model's width
    assert TrainSettings(learning_rate=1e-5).rate_for(576) == 1e-5


def test_the_learning_rate_warms_up_linearly_and_a_child_warms_up_to_its_own_rate(
    tmp_path, tiny_model_dir, base
):
    """`warmup_steps`: the rate the optimizer stepped with rises k/n over n steps, then
    stays; a lineage's child (its parent's moments continued) warms up to its own rate,
    not to the one the parent's schedule left in the saved optimizer state."""
    snap = write(tmp_path / "s.parquet", {g: group_of(base) for g in "abcd"})
    settings = TrainSettings(
        base_model=tiny_model_dir,
        lora_rank=8,
        groups_per_step=1,
        learning_rate=1e-3,
        warmup_steps=3,
        kl_own_prompts=0,
    )
    one = train(snap, tmp_path / "one", settings, progress=False, echo=lambda _: None)
    assert [h.lr for h in one.history] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])

    child = settings.model_copy(update={"learning_rate": 3e-4, "warmup_steps": 2})
    two = train(
        snap, tmp_path / "two", child, parent=tmp_path / "one", progress=False, echo=lambda _: None
    )
    assert [h.lr for h in two.history] == pytest.approx([1.5e-4, 3e-4, 3e-4, 3e-4])


def test_two_epochs_make_two_passes_the_second_off_policy_under_the_clip(
    tmp_path, tiny_model_dir, base
):
    """`epochs`: every group again in a second pass, whose ratios are no longer 1 (the
    policy moved since the sampler; the clip bounds how far each token counts)."""
    snap = write(tmp_path / "s.parquet", {g: group_of(base) for g in "ab"})
    settings = TrainSettings(
        base_model=tiny_model_dir, lora_rank=8, groups_per_step=1, learning_rate=1e-2, epochs=2
    )
    manifest = train(
        snap, tmp_path / "ckpt", settings.model_copy(update={"kl_own_prompts": 0}),
        progress=False, echo=lambda _: None,
    )  # fmt: skip
    history = manifest.history
    assert [h.epoch for h in history] == [0, 0, 1, 1]
    assert history[0].ratio_mean == pytest.approx(1.0, abs=1e-4)
    assert all(abs(h.ratio_mean - 1.0) > 1e-3 for h in history[2:]), history
