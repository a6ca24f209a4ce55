"""`make lint`'s check that bench/ uses only onjob's public names (bench/harness/check.py):
it reports each way a bench can reach past the package's public surface, passes the
public equivalents, and passes bench/ as it is."""

from __future__ import annotations

from pathlib import Path

from bench.harness.check import main, problems

BAD = """
import onjob.collector._internal
from onjob.deploy.decide import prompts
from onjob.deploy.decide.prompts import _turns
from onjob._private import thing
from onjob.collector import Collector
from examples.arithmetic import demo


async def run(settings, other: Collector):
    prompts._turns(None)
    c = Collector(settings)
    await c._run(print)
    store = c._store
    c._place = lambda rows: rows
    store.con = None
    setattr(c, "_spool", None)
    other._spool.rotate()
    demo._base_model("url")
"""

GOOD = """
import json
from onjob.collector import Collector
from onjob.deploy.decide import prompts


class Timed:
    def __init__(self, con):
        self._con = con  # its own attribute, not onjob's


async def run(settings):
    prompts.source_turns(None, None, "", [], [], [])
    c = Collector(settings)
    store = await c.query(lambda store: store)
    store.con = Timed(store.con)
    c.spool.max_segment_bytes = 1 << 20
    json._default_decoder  # not onjob's
    return c.__class__.__name__
"""


def test_each_private_use_is_reported_with_its_line():
    found = problems(BAD, "bad.py")
    said = "\n".join(found)
    for what in (
        "bad.py:2: imports private module onjob.collector._internal",
        "bad.py:4: imports private onjob.deploy.decide.prompts._turns",
        "bad.py:5: imports from private module onjob._private",
        "bad.py:11: uses private prompts._turns",
        "bad.py:13: uses private c._run",
        "bad.py:14: uses private c._store",
        "bad.py:15: assigns private c._place",
        "bad.py:17: setattr of private '_spool'",
        "bad.py:18: uses private other._spool",
        "bad.py:19: uses private demo._base_model",
    ):
        assert what in said, (what, found)
    assert not any(":16:" in line for line in found)  # `store.con`: a public attribute


def test_public_names_pass():
    assert problems(GOOD, "good.py") == []


def test_bench_as_it_is_passes(capsys):
    bench = Path(__file__).resolve().parents[1] / "bench"
    assert main([str(bench)]) == 0, capsys.readouterr().out
