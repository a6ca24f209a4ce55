"""Loop settings fitted to the traffic (issue 45 item 3): the held-out share and the groups
that start a run follow what the log shows unless `[loop]` sets them, and `onjob status`
says which. Real DuckDB files; `onjob status` as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from onjob.collector import Store
from onjob.deploy import fit, holdout
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
        # An old group and an unscored one are not the last ten minutes' traffic.
        store.con.execute(
            "INSERT INTO groups (id, scenario_id, kind, status, created) VALUES "
            "('old', 'scn-0', 'turn', 'scored', now() - INTERVAL 1 HOUR), "
            "('open', 'scn-0', 'turn', 'sampling', now())"
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
    assert f.traffic == fit.Traffic(scenarios=12, conversations=48, recent_groups=0)
    assert "holdout_share 30% (fitted)" in f.line()


def test_new_scenarios_are_placed_at_the_share_fitted_when_first_seen(tmp_path):
    db = tmp_path / "onjob.duckdb"
    traffic(db, 12)
    store = Store(db)
    try:
        held = set(fit.held_out(store, DeploySettings()))
        rows = store.query("SELECT scenario_id, held, share FROM holdout_slice ORDER BY share")
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
    f = fitted(db, DeploySettings(loop={"holdout_share": 0.05, "min_new_groups": 7}))
    assert (f.holdout_share, f.min_new_groups, f.fitted) == (0.05, 7, ())
    assert "holdout_share 5% (set)" in f.line() and "min_new_groups 7 (set)" in f.line()
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
        "loop settings: holdout_share 30% (fitted), min_new_groups 5 (fitted); from 12 "
        "scenarios, 48 conversations, 5 groups scored in the last 10 minutes" in done.stdout
    ), done.stdout
