"""Loop settings fitted to the traffic (issue 45 item 3): the held-out share, the groups
that start a run, the canary's share and the judge's settle time follow what the log shows
unless the settings set them, and `onjob status` says which. Real DuckDB files; `onjob
status` as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from onjob.collector import Store
from onjob.deploy.decide import fit, holdout
from onjob.deploy.settings import DeploySettings

ONJOB = str(Path(sys.executable).with_name("onjob"))


def traffic(db: Path, scenarios: int, conversations_each: int = 1, groups: int = 0) -> None:
    store = Store(db)
    try:
        for i in range(scenarios):
            store.con.execute(
                "INSERT INTO scenarios VALUES (?, ?, 'explicit', now(), ?)",
                [f"scn-{i}", f"k{i}", conversations_each],
            )
        for i in range(groups):
            store.con.execute(
                "INSERT INTO groups (id, scenario_id, kind, status, created) "
                "VALUES (?, 'scn-0', 'turn', 'scored', now())",
                [f"g{i}"],
            )
        # An old group and an unscored one are not the last ten minutes' traffic, nor is
        # a flat one (every member alike: nothing a run learns from).
        store.con.execute(
            "INSERT INTO groups (id, scenario_id, kind, status, created) VALUES "
            "('old', 'scn-0', 'turn', 'scored', now() - INTERVAL 1 HOUR), "
            "('open', 'scn-0', 'turn', 'sampling', now()), "
            "('flat', 'scn-0', 'turn', 'scored', now())"
        )
        for group in [f"g{i}" for i in range(groups)] + ["old", "flat"]:
            for m, score in enumerate((0.0, 0.0) if group == "flat" else (0.0, 1.0)):
                store.con.execute(
                    "INSERT INTO scores (id, group_id, member_id, source, score) "
                    "VALUES (?, ?, ?, 'combined', ?)",
                    [f"{group}-s{m}", group, f"{group}-m{m}", score],
                )
    finally:
        store.close()


def fitted(db: Path, settings: DeploySettings) -> fit.Fitted:
    store = Store(db)
    try:
        return fit.current(store, settings)
    finally:
        store.close()


def test_few_scenarios_hold_out_more_and_many_hold_out_a_tenth(tmp_path):
    settings = DeploySettings()  # holdout_pairs 12
    few, many = tmp_path / "few.duckdb", tmp_path / "many.duckdb"
    traffic(few, 12, conversations_each=4)
    traffic(many, 400)
    assert fitted(few, settings).holdout_share == 0.3  # 12 / 12, at most 30%
    assert fitted(many, settings).holdout_share == 0.1  # 12 / 400, at least 10%
    middle = tmp_path / "middle.duckdb"
    traffic(middle, 60)
    assert fitted(middle, settings).holdout_share == 0.2
    f = fitted(few, settings)
    assert f.traffic == fit.Traffic(scenarios=12, conversations=48)
    assert "holdout_share 30% (fitted)" in f.line


def test_new_scenarios_are_placed_at_the_share_fitted_when_first_seen(tmp_path):
    db = tmp_path / "onjob.duckdb"
    traffic(db, 12)
    store = Store(db)
    try:
        held = set(fit.held_out(store, DeploySettings()))
        rows = store.dicts("SELECT scenario_id, held, share FROM holdout_slice ORDER BY share")
    finally:
        store.close()
    # The first scenario seen is trained on (one cannot be both); the others by their
    # place against 30%: what 10% held none of, a third of 12 holds some.
    expected = {r["scenario_id"] for r in rows if r["share"] < 0.3} - {"scn-0"}
    assert held == expected
    assert {r["scenario_id"] for r in rows if r["held"]} == held


def test_a_run_starts_on_ten_minutes_of_groups_within_bounds(tmp_path):
    settings = DeploySettings(trainer={"max_groups": 16})
    for groups, wanted in ((0, 4), (3, 4), (9, 9), (40, 16)):
        db = tmp_path / f"g{groups}.duckdb"
        traffic(db, 2, groups=groups)
        assert fitted(db, settings).min_new_groups == wanted, groups


def test_a_value_set_in_the_loop_section_is_used_as_it_is(tmp_path):
    db = tmp_path / "onjob.duckdb"
    traffic(db, 12, groups=40)
    f = fitted(
        db,
        DeploySettings(
            loop={"holdout_share": 0.05, "min_new_groups": 7, "canary_fraction": 0.25},
            judge={"settle_s": 30},
        ),
    )
    assert (f.holdout_share, f.min_new_groups, f.canary_fraction, f.settle_s, f.fitted) == (
        0.05,
        7,
        0.25,
        30,
        (),
    )
    assert "holdout_share 5% (set)" in f.line and "min_new_groups 7 (set)" in f.line
    assert "canary_fraction 25% (set)" in f.line and "settle_s 30 (set)" in f.line
    store = Store(db)
    try:
        held = holdout.held_out(store, 0.05)  # what fit.held_out places them at
        assert set(fit.held_out(store, DeploySettings(loop={"holdout_share": 0.05}))) == set(held)
    finally:
        store.close()


def test_onjob_status_says_what_it_fitted(tmp_path):
    db = tmp_path / "onjob.duckdb"
    traffic(db, 12, conversations_each=4, groups=5)
    done = subprocess.run(
        [ONJOB, "status", "--db", str(db), "--server", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "loop settings: holdout_share 30% (fitted), min_new_groups 5 (fitted; a first run: 6), "
        "canary_fraction 50% (fitted), settle_s 120 (fitted); from 12 scenarios, 48 "
        "conversations, 5 groups with a spread of rewards scored and 0 conversations started "
        "in the last 10 minutes" in done.stdout
    ), done.stdout


def conversations(db: Path, n: int, turns: int = 1, gap_s: float = 0, ago_s: float = 0) -> None:
    """`n` production conversations started `ago_s` seconds ago, `turns` turns each,
    `gap_s` apart."""
    store = Store(db)
    try:
        for i in range(n):
            store.con.execute(
                "INSERT INTO trajectories (id, scenario_id, n_turns, first_ts, last_ts) VALUES "
                "(?, 'scn-0', ?, now() - to_seconds(?::DOUBLE), now())",
                [f"t{ago_s}-{i}", turns, ago_s],
            )
            for turn in range(turns):
                store.con.execute(
                    "INSERT INTO exchanges (id, ts, trajectory_id, turn, scenario_id) VALUES "
                    "(?, now() - to_seconds(?::DOUBLE), ?, ?, 'scn-0')",
                    [f"x{ago_s}-{i}-{turn}", ago_s - turn * gap_s, f"t{ago_s}-{i}", turn],
                )
    finally:
        store.close()


def test_a_quiet_agent_canaries_half_its_traffic_and_a_busy_one_a_tenth(tmp_path):
    settings = DeploySettings()  # min_guard_conversations 20
    for started, share in ((0, 0.5), (60, 0.5), (100, 0.4), (160, 0.25), (1000, 0.1)):
        db = tmp_path / f"c{started}.duckdb"
        conversations(db, started)
        conversations(db, 50, ago_s=3600)  # an hour ago: not the traffic's pace now
        assert fitted(db, settings).canary_fraction == share, started
    assert fitted(db, settings).traffic.recent_conversations == 1000


def test_the_judge_waits_for_a_conversation_as_long_as_its_turns_come_apart(tmp_path):
    for gap, settle in ((None, 120), (1, 10), (3, 12), (200, 300)):
        db = tmp_path / f"s{gap}.duckdb"
        conversations(db, 10, turns=3 if gap else 1, gap_s=gap or 0, ago_s=1000)
        conversations(db, 5, turns=3, gap_s=900, ago_s=9000)  # gaps older than an hour
        f = fitted(db, DeploySettings())
        assert f.settle_s == settle, gap
        assert fit.judge_settings(DeploySettings(), f).settle_s == settle
