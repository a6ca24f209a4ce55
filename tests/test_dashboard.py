"""The dashboard in a real browser: Playwright driving Debian's Chromium against `onjob
serve` over a database filled by real traffic (tool-using conversations through the
proxy), a real judge pass and a real paired comparison. Each page's numbers are checked
against the database; a group leads to its conversation; every page is screenshotted
(into $ONJOB_SCREENSHOTS, default build/screenshots)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from onjob.cli.process import ServerProcess, free_port
from onjob.client import Client
from onjob.collector import Store
from onjob.deploy import progress
from onjob.deploy.act import registry

from .conftest import TOOL_QUESTION, TOOLS, debian_program, make_adapter, rows

ROOT = Path(__file__).resolve().parents[1]
ONJOB = str(Path(sys.executable).with_name("onjob"))
SHOTS = Path(os.environ.get("ONJOB_SCREENSHOTS", ROOT / "build" / "screenshots"))
CHROMIUM = "/usr/bin/chromium"
# As the machine's notes say: without these, Chromium's background connections are
# refused by the closed network, many at a time.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
CONFIG = """
[proxy]
admin_key = "sesame"
[judge]
group_size = 3
temperature = 1.0
max_tokens = 16
settle_s = 0
[judge.rewards]
tool = { fn = "my_rewards:tool" }
[loop]
interval_s = 0
pairs_per_round = 4
min_pairs = 10
# The users' ratings below are arbitrary against the `tool` reward: with the judge-agreement
# guard on, a run where they happen to disagree rolls the canary back (tested where it is).
min_judge_agreement = 0.0
"""
REWARDS = """
def tool(r):
    return 1.0 if r.tool_calls else len(r.text or "") % 3 / 2
"""


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, installed here if missing (Playwright's own download cannot work
    on these machines)."""
    return debian_program(CHROMIUM, "chromium")


def onjob(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [ONJOB, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=os.environ
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory, tool_engine, tool_model_dir):
    """A database with real traffic, judged groups, a canary and a paired round."""
    work = tmp_path_factory.mktemp("dashboard")
    (work / "onjob.toml").write_text(CONFIG)
    (work / "my_rewards.py").write_text(REWARDS)
    db = work / "onjob.duckdb"
    args = ["--config", str(work / "onjob.toml"), "--engine-url", tool_engine.url]
    args += ["--db", str(db)]
    adapter = make_adapter(
        tool_model_dir, work / "mild", seed=4, r=8, targets=["q_proj", "v_proj"], std=0.001
    )
    store = Store(db)
    registry.add(store, adapter, "mild", tool_model_dir)
    store.close()
    nowhere = ["--server", f"http://127.0.0.1:{free_port()}"]  # no server: the DB directly
    onjob(work, "canary", "agent", "mild", "--fraction", "0.5", *nowhere)
    with ServerProcess(args) as server:  # the canary restored, its adapter loaded
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        for i in range(6):
            messages = [*TOOL_QUESTION]
            meta = {"trajectory_id": f"dash-{i}"}
            first = client.chat.completions.create(
                model="agent",
                messages=messages,
                tools=TOOLS,
                max_tokens=24,
                temperature=0,
                metadata=meta,
            )
            call = first.choices[0].message.tool_calls[0]
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": f"{10 + i} °C, sunny"},
            ]
            client.chat.completions.create(
                model="agent", messages=messages, tools=TOOLS, max_tokens=12, metadata=meta
            )
            # Users' feedback through onjob's client: a named metric on the first answer,
            # the unnamed kind on the whole conversation.
            with Client(server.url) as onjob_client:
                onjob_client.feedback(i % 2, exchange_id=first.id, metric="thumbs")
                onjob_client.feedback(i / 5, trajectory_id=f"dash-{i}", comment=f"rated {i}")
    onjob(work, "judge", "--once", "--engine-url", tool_engine.url)  # ./onjob.toml, its DB
    said = onjob(work, "loop", "--once", "--engine-url", tool_engine.url)
    assert "canary mild against base: wait" in said, said  # still a canary to show
    httpx.post(f"{tool_engine.url}/unload_lora_adapter", json={"lora_name": "mild"}, timeout=60)
    return work, args


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_the_dashboard_shows_what_the_database_holds(site, browser):
    work, args = site
    db = work / "onjob.duckdb"
    exchanges = rows(db, "SELECT count(*) AS n FROM exchanges WHERE source = 'production'")[0]
    # All of the agent's traffic was trainable (the local engine states its logprobs and
    # its counts agree); one answer is marked as the proxy marks a short stream.
    store = Store(db)
    marked = "SELECT count(*) AS n FROM exchanges WHERE untrainable IS NOT NULL AND source = ?"
    assert store.dicts(marked, ["production"]) == [{"n": 0}]
    store.con.execute(
        "UPDATE exchanges SET untrainable = 'count' WHERE id = "
        "(SELECT min(id) FROM exchanges WHERE source = 'production')"
    )
    store.close()
    untrainable = rows(
        db,
        "SELECT count(*) AS n FROM exchanges "
        "WHERE source = 'production' AND untrainable IS NOT NULL",
    )[0]
    per_arm = {
        r["arm"]: r["n"]
        for r in rows(
            db,
            "SELECT arm, count(*) AS n FROM exchanges WHERE source = 'production' GROUP BY arm",
        )
    }
    top = rows(db, "SELECT id, count FROM scenarios ORDER BY count DESC, id LIMIT 1")[0]
    turn = rows(db, "SELECT id FROM groups WHERE kind = 'turn' AND status = 'scored' "
                    "ORDER BY created DESC, id LIMIT 1")[0]["id"]  # fmt: skip
    scores = rows(
        db,
        "SELECT m.position, s.score FROM scores s JOIN members m ON m.id = s.member_id "
        "WHERE s.group_id = ? AND s.source = 'combined' ORDER BY m.position",
        [turn],
    )
    store = Store(db)
    rewards = progress.reward_by_checkpoint(store)
    store.close()
    # A pair: the turns the test answered of one conversation (their mean difference).
    pairs = rows(
        db,
        "SELECT count(DISTINCT p.trajectory_id) AS n FROM groups g JOIN exchanges p "
        "ON p.id = g.prefix_exchange WHERE g.kind = 'ab' AND g.status = 'scored'",
    )
    assert exchanges["n"] == 12 and pairs[0]["n"] > 0 and rewards

    with ServerProcess(args) as server:
        assert httpx.get(f"{server.base}/dashboard").status_code == 401  # the admin key
        context = browser.new_context(
            http_credentials={"username": "admin", "password": "sesame"},
            viewport={"width": 1300, "height": 900},
        )
        page = context.new_page()
        failed = []
        page.on("requestfailed", lambda r: failed.append(r.url))

        page.goto(f"{server.base}/dashboard")
        assert page.locator("#total-exchanges").inner_text() == str(exchanges["n"])
        assert page.locator("#total-untrainable").inner_text() == str(untrainable["n"]) == "1"
        for arm, n in per_arm.items():
            row = page.locator(f'#traffic tr[data-arm="{arm}"]')
            assert row.locator(".requests").inner_text() == str(n)
        assert "mild" in page.locator("#routing").inner_text()  # the canary
        # The chart library came from onjob itself (no CDN) and drew the chart.
        assert page.evaluate("Chart.getChart('per-minute') !== undefined")
        shot(page, "overview")

        # The request explorer: every exchange, then filtered by arm and by text.
        page.click("nav >> text=Requests")
        page.wait_for_url("**/dashboard/requests")
        listed = page.locator("#requests tr[data-id]")
        assert listed.count() == exchanges["n"]
        assert (
            page.locator("#requests tr[data-id] .conversation")
            .first.get_attribute("href")
            .startswith("/dashboard/trajectories/")
        )
        page.select_option("#explore select[name=arm]", "canary")
        page.click("#explore button[type=submit]")
        page.wait_for_url("**/dashboard/requests?*arm=canary*")
        assert listed.count() == per_arm.get("canary", 0) > 0
        assert set(page.locator("#requests tr[data-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.arm)")) == {"canary"}  # fmt: skip
        page.goto(f"{server.base}/dashboard/requests?q=sunny")
        assert listed.count() == 6  # the second turns: their tool results say "sunny"
        page.goto(f"{server.base}/dashboard/requests?q=nothing-says-this")
        assert listed.count() == 0 and "no requests match" in page.inner_text("#requests")
        page.goto(f"{server.base}/dashboard/requests")
        shot(page, "requests")

        page.click("nav >> text=Feedback")
        page.wait_for_url("**/dashboard/feedback")
        for metric in ("", "thumbs"):
            row = page.locator(f'#metrics tr[data-metric="{metric}"]')
            assert row.locator(".count").inner_text() == "6"
        assert page.locator("#feedback tr[data-id]").count() == 12
        shot(page, "feedback")

        page.click("nav >> text=Checkpoints")
        page.wait_for_url("**/dashboard/checkpoints")
        mild = page.locator('#checkpoints tr[data-name="mild"]')
        assert mild.locator(".status").inner_text() == "canary"
        assert mild.locator(".served").inner_text() == str(per_arm["canary"])
        shot(page, "checkpoints")

        page.click("text=Scenarios")
        page.wait_for_url("**/dashboard/scenarios")
        first = page.locator("#scenarios tr[data-id]").first
        assert first.get_attribute("data-id") == top["id"]
        assert first.locator(".count").inner_text() == str(top["count"])
        shot(page, "scenarios")

        page.click("nav >> text=Groups")
        page.wait_for_url("**/dashboard/groups")
        page.click(f'a[href="/dashboard/groups/{turn}"]')
        page.wait_for_url(f"**/dashboard/groups/{turn}")
        shown = page.locator('.member tr[data-source="combined"] .score').all_inner_texts()
        assert shown == [f"{s['score']:.2f}" for s in scores]
        assert "What is the weather in Paris?" in page.inner_text("#prompt")  # what they answer
        assert page.locator(".member .tool-call").count() > 0  # the tool call, readable
        shot(page, "group")

        page.locator(".trajectory-link").first.click()
        page.wait_for_url("**/dashboard/trajectories/*")
        dialogue = page.locator("#dialogue")
        assert "What is the weather in Paris?" in dialogue.inner_text()
        assert "get_weather" in dialogue.locator(".tool-call").first.inner_text()
        assert dialogue.locator(".message.tool").count() == 1  # the tool's result
        # Who really answered each turn, as the engine said: the checkpoint routed to.
        turn = page.locator("#turns tr").nth(1)
        checkpoint = turn.locator("td").nth(2).inner_text()
        served = turn.locator(".served").inner_text()
        assert served == ("toolbot" if checkpoint == "base" else checkpoint)
        # What users said of it: the thumbs on its first answer, the rating of the whole.
        said = page.locator("#feedback tr[data-metric]")
        assert sorted(said.evaluate_all("rows => rows.map(r => r.dataset.metric)")) == [
            "",
            "thumbs",
        ]
        assert page.locator("#scores tr[data-source]").count() > 0  # its groups' scores
        shot(page, "trajectory")

        page.click("text=Learning")
        page.wait_for_url("**/dashboard/learning")
        for r in rewards:
            row = page.locator(f'#rewards tr[data-checkpoint="{r.checkpoint or "base"}"]')
            assert row.locator(".reward").inner_text() == f"{r.reward:.3f}"
        assert page.evaluate("Chart.getChart('reward-curve') !== undefined")
        shot(page, "learning")

        page.click("text=A/B")
        page.wait_for_url("**/dashboard/ab")
        section = page.locator('.comparison[data-alias="agent"]')
        assert section.locator(".decision").inner_text() == "wait"
        assert section.locator(".pairs").inner_text() == str(pairs[0]["n"])
        assert page.locator("#deployments tr").count() == 2  # header + the canary
        # The loop's prose, its commands as code. Which mode it is depends on whether the
        # coach agrees with users' feedback on answers sampled at temperature 1: `review`
        # names `onjob promote`; `users` (it agreed, by chance, in 2 runs of many) none.
        mode = page.locator("#release-mode")
        assert "`" not in mode.inner_text()
        if mode.get_attribute("data-mode") == "review":
            assert mode.locator("code").inner_text() == "onjob promote"
        else:
            assert mode.get_attribute("data-mode") == "users", mode.inner_text()
        # The test drawn: its e-values after each pair, the outcomes, each arm's latency.
        assert page.evaluate("Chart.getChart('evalue-1').data.labels.length") == pairs[0]["n"]
        assert page.evaluate("Chart.getChart('outcomes-1').data.datasets[0].data") == [
            int(section.locator(".wins").inner_text()),
            int(section.locator(".ties").inner_text()),
            int(section.locator(".losses").inner_text()),
        ]
        assert page.evaluate("Chart.getChart('latency-1') !== undefined")
        shot(page, "ab")

        # A button asks first; declined, nothing changes.
        page.evaluate("window.stayed = true")  # gone if the page reloaded
        page.once("dialog", lambda d: d.dismiss())
        section.locator('button[data-action="rollback"]').click()
        assert section.locator(".decision").inner_text() == "wait"
        # Accepted: the canary is rolled back and the page updated in place.
        page.once("dialog", lambda d: d.accept())
        section.locator('button[data-action="rollback"]').click()
        page.wait_for_selector("#no-canary")
        assert page.evaluate("window.stayed") is True
        assert page.locator("#deployments tr").count() == 3
        assert "dashboard" in page.locator("#deployments tr").nth(1).inner_text()

        # Pause and resume the loop (on in this server: conftest's 300 s), in place.
        page.goto(f"{server.base}/dashboard")
        said = []

        def answer(dialog) -> None:
            said.append(dialog.message)
            dialog.accept()

        page.on("dialog", answer)
        page.locator('button[data-action="pause"]').click()
        page.wait_for_selector('button[data-action="resume"]')
        assert "paused" in page.inner_text("main")
        page.locator('button[data-action="resume"]').click()
        page.wait_for_selector('button[data-action="pause"]')
        page.remove_listener("dialog", answer)
        assert ["Pause the loop?" in said[0], "Resume the loop" in said[1]] == [True, True]
        # A change the routing refuses is said, and changes nothing: no canary is left.
        refused = page.request.post(
            f"{server.base}/dashboard/act", data={"action": "promote", "lineage": "agent"}
        )
        assert refused.status == 409 and "canary" in refused.json()["error"]["message"]
        not_json = page.request.post(
            f"{server.base}/dashboard/act",
            data="action=pause",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert not_json.status == 415  # what another site's form would send
        assert not failed, failed
        context.close()
