"""Each tenant's daily share of the one judge and the one trainer (`loop.tenant_budgets`),
on a real DuckDB file through the installed commands and a real `onjob serve`: a tenant
whose RULER share is spent waits (no new groups, no call; its groups judged the next
UTC day) while another tenant's groups are judged; a tenant whose training share is spent
is passed over by the trainer, visibly in the log, `/admin/status`, `onjob status` and
the dashboard's row for the tenant. "The next day" is today's rows moved back 24 hours."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from onjob.cli.process import ServerProcess, free_port
from onjob.collector import Store
from onjob.deploy.settings import DeploySettings

from .conftest import record_trained, rows
from .fake_judge import FakeJudge, candidates, scores_json
from .test_budgets import (
    ADMIN,
    JUDGE,
    ONJOB,
    REWARDS,
    log_conversations,
    onjob,
    to_yesterday,
    tomorrow,
)

KEYS = {"acme-k": "sk-acme-5b1e", "beta-k": "sk-beta-0c9d"}
TENANTS = """
[proxy]
admin_key = "adm-secret"
api_keys = { "acme-k" = "sk-acme-5b1e", "beta-k" = "sk-beta-0c9d" }
tenants = { acme = ["acme-k"], beta = ["beta-k"] }
"""


def statuses_by_key(db: Path) -> dict[str, list[str]]:
    found = rows(
        db,
        "SELECT DISTINCT g.id, g.status, e.api_key_id FROM groups g "
        "JOIN members m ON m.group_id = g.id JOIN exchanges e ON e.id = m.exchange_id",
    )
    out: dict[str, list[str]] = {key: [] for key in KEYS}
    for r in found:
        out[r["api_key_id"]].append(r["status"])
    return {k: sorted(v) for k, v in out.items()}


def test_a_tenant_whose_judge_share_is_spent_waits_while_another_is_judged(tmp_path):
    db = tmp_path / "onjob.duckdb"
    log_conversations(db, tuple(KEYS), scenarios=2)
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    share = "[loop.tenant_budgets]\nacme = { judge_usd_per_day = 0.1 }\n"
    # No server-wide judge budget: only acme's share of it stops calls.
    judge = JUDGE.replace("max_usd_per_day = 0.25\n", "")
    with FakeJudge(lambda n, body: (200, scores_json(dict.fromkeys(candidates(body), 0.5)))) as j:
        (tmp_path / "onjob.toml").write_text(TENANTS + judge.format(url=j.url) + share)

        first = onjob(tmp_path, "judge", "--once")
        # $0.14 a call: acme's first call spends its $0.10; its second group waits, whole.
        assert len(j.calls) == 3, first.stdout
        assert statuses_by_key(db) == {
            "acme-k": ["sampled", "scored"],
            "beta-k": ["scored", "scored"],
        }
        assert "(1 groups wait for their tenant's judge budget)" in first.stdout

        again = onjob(tmp_path, "judge", "--once")  # the same day: acme spends nothing more
        assert len(j.calls) == 3
        said = f"judge budget of tenant acme spent: $0.14 of $0.1 today; resumes {tomorrow()}"
        assert f"{said}: no new groups of acme-k" in again.stdout

        to_yesterday(db, "judgements")  # the next UTC day
        onjob(tmp_path, "judge", "--once")
        assert len(j.calls) == 4
        assert statuses_by_key(db) == {"acme-k": ["scored"] * 2, "beta-k": ["scored"] * 2}


def test_a_tenant_whose_training_share_is_spent_is_passed_over_visibly(tmp_path):
    db = tmp_path / "onjob.duckdb"
    store = Store(db)
    spent = {"duration_s": 15 * 60}  # 15 minutes trained for acme's lineage today
    config = {"lineage": "agent@acme"}
    record_trained(store, "ckpt-acme", tmp_path / "a", "base", config=config, metrics=spent)
    record_trained(store, "ckpt-shared", tmp_path / "s", "base", metrics=spent)
    store.close()
    share = "[loop.tenant_budgets]\nacme = { train_minutes_per_day = 10 }\n"
    share += "beta = { train_minutes_per_day = 30 }\n"
    (tmp_path / "onjob.toml").write_text(TENANTS + share)

    nowhere = f"http://127.0.0.1:{free_port()}"
    args = ["--engine-url", nowhere, "--db", str(db), "--config", str(tmp_path / "onjob.toml")]
    acme = f"train budget of tenant acme spent: 15.0 of 10.0 minutes today; resumes {tomorrow()}"
    beta = "train budget of tenant beta: 0.0 of 30.0 minutes spent today (UTC)"
    with ServerProcess(args, env={"ONJOB_LOOP__INTERVAL_S": "0.5"}) as server:
        shares: dict = {}
        deadline = time.monotonic() + 60
        while "its groups wait" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        loop = httpx.get(f"{server.base}/admin/status", headers=ADMIN).json()["loop"]
        shares = loop["tenant_budgets"]
        assert shares["acme"]["train"]["paused"] is True, server.output()
        assert shares["acme"]["train"]["status"] == acme
        assert shares["beta"]["train"]["status"] == beta and shares["beta"]["judge"] is None
        assert f"train agent@acme: {acme}; its groups wait" in server.output()
        # beta, and the shared lineage, are still considered: they wait for groups only.
        assert "train agent@beta: 0 new trainable groups" in server.output()
        page = httpx.get(f"{server.base}/dashboard", headers=ADMIN)
        assert page.status_code == 200
        row = page.text.split('<tr data-tenant="acme">')[1].split("</tr>")[0]
        assert "agent@acme" in row and "acme-k" in row and acme in row
    nobody = ["--server", f"http://127.0.0.1:{free_port()}"]  # no server: from the file
    shown = subprocess.run(
        [ONJOB, "status", "--db", str(db), *nobody],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert f"tenant acme: {acme}" in shown and f"tenant beta: {beta}" in shown

    to_yesterday(db, "train_runs")  # the next UTC day: acme's turn comes again
    done = onjob(tmp_path, "loop", "--once")
    assert "train budget of tenant acme spent" not in done.stdout
    assert "train agent@acme: 0 new trainable groups" in done.stdout


def test_a_budget_for_a_tenant_the_settings_do_not_hold_is_refused_by_name():
    with pytest.raises(ValidationError, match="names 'zeta', which is not a tenant"):
        DeploySettings.model_validate(
            {
                "proxy": {"api_keys": KEYS, "tenants": {"acme": ["acme-k"]}},
                "loop": {"tenant_budgets": {"zeta": {"train_minutes_per_day": 5}}},
            }
        )
    assert json.loads(
        DeploySettings.model_validate(
            {
                "proxy": {"api_keys": KEYS, "tenants": {"acme": ["acme-k"]}},
                "loop": {"tenant_budgets": {"acme": {"judge_usd_per_day": 1}}},
            }
        ).loop.model_dump_json()
    )["tenant_budgets"]["acme"] == {"train_minutes_per_day": None, "judge_usd_per_day": 1.0}


def test_each_lineage_is_fitted_to_its_own_traffic(tmp_path):
    """`min_new_groups` and `canary_fraction` fitted per lineage: a quiet tenant beside a
    busy one waits for what its own last ten minutes gave the judge, not for the busy one's
    count, and canaries the share its own pace needs."""
    from onjob.deploy.decide import fit
    from onjob.proxy import ProxySettings
    from onjob.proxy.tenants import Tenants

    db = tmp_path / "onjob.duckdb"
    log_conversations(db, ("acme-k",), scenarios=7)
    log_conversations(db, ("beta-k",), scenarios=2)
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    judge = '[judge]\nsettle_s = 0\n[judge.rewards]\nshort = { fn = "my_rewards:short" }\n'
    (tmp_path / "onjob.toml").write_text(TENANTS + judge + "[loop]\nholdout_share = 0\n")
    onjob(tmp_path, "judge", "--once")
    settings = DeploySettings(
        proxy=ProxySettings(api_keys=KEYS, tenants={"acme": ["acme-k"], "beta": ["beta-k"]}),
        loop={"min_guard_conversations": 2},
    )
    tenants = Tenants.of(settings.proxy)
    store = Store(db)
    try:
        scopes = {t: tenants.lineage("agent", t).scope for t in ("acme", "beta")}
        recent = {t: fit.recent_groups(store, scope) for t, scope in scopes.items()}
        started = {t: fit.recent_conversations(store, scope) for t, scope in scopes.items()}
        server = fit.current(store, settings)
    finally:
        store.close()
    assert recent == {"acme": 7, "beta": 2}
    assert server.min_new_groups == 9  # the whole server's pace: what beta waited for before
    assert fit.min_groups(settings, recent["acme"]) == 7
    assert fit.min_groups(settings, recent["beta"]) == fit.MIN_GROUPS
    # The canary's share, likewise: a tenant's canary sees only its own keys' conversations
    # (2 per scenario), so the quiet one gives its canary more of them to fill its guards.
    assert started == {"acme": 14, "beta": 4}
    assert server.canary_fraction == fit.canary_fraction(settings, 18) == round(2 / 9, 3)
    assert fit.canary_fraction(settings, started["acme"]) == round(2 / 7, 3)
    assert fit.canary_fraction(settings, started["beta"]) == 0.5  # 2/2, at the ceiling
