"""The spool with several writers on a real directory: which closed segments may be loaded,
a dead writer's open segment claimed, batches closed under overlap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from onjob.collector.spool import Segment, Spool, batches

from .conftest import debian_program


def lines(segments) -> list[bytes]:
    return [line for s in segments for line in s.path.read_bytes().splitlines()]


def test_a_segment_that_closed_after_another_writers_open_segment_opened_is_held(tmp_path):
    a, b = Spool(tmp_path), Spool(tmp_path)
    a.append(b"parent")  # a's segment stays open with the earlier turn in it
    time.sleep(0.01)
    b.append(b"child")
    b.rotate()
    assert b.loadable() == []  # the child could continue a line a still holds
    a.rotate()
    assert sorted(lines(b.loadable())) == [b"child", b"parent"]


def test_a_segment_held_back_holds_back_what_closed_after_it_opened(tmp_path):
    a, b, c = Spool(tmp_path), Spool(tmp_path), Spool(tmp_path)
    c.append(b"open")  # a live writer holds everything closed after this
    time.sleep(0.01)
    a.append(b"parent")
    a.rotate()  # closed, but held by c
    time.sleep(0.01)
    b.append(b"child")
    b.rotate()
    assert c.loadable() == []
    c.rotate()
    assert sorted(lines(c.loadable())) == [b"child", b"open", b"parent"]


def test_segments_closed_before_any_open_one_opened_are_loadable(tmp_path):
    a, b = Spool(tmp_path), Spool(tmp_path)
    a.append(b"old")
    a.rotate()
    time.sleep(0.01)
    b.append(b"new")  # opened after a's closed: cannot hold what a's continues
    assert lines(a.loadable()) == [b"old"]
    assert a.others_writing()


def test_an_idle_writer_holds_nothing_back(tmp_path):
    idle, busy = Spool(tmp_path), Spool(tmp_path)
    busy.append(b"x")
    busy.rotate()
    assert lines(idle.loadable()) == [b"x"]
    assert not idle.others_writing()


WRITER = textwrap.dedent(
    """
    import sys, time
    from onjob.collector.spool import Spool
    spool = Spool(sys.argv[1])
    for i in range(50):
        spool.append(b'{"n": %d}' % i)
    print("written", flush=True)
    time.sleep(3600)
    """
)


def test_the_open_segment_of_a_killed_writer_is_claimed_and_nothing_in_it_lost(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    try:
        assert proc.stdout.readline().strip() == "written"
        loader = Spool(tmp_path)
        assert loader.loadable() == [] and loader.others_writing()  # alive: its lock holds
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not loader.others_writing()
        assert len(lines(loader.loadable())) == 50
        assert not list(tmp_path.glob("*.part"))
    finally:
        proc.kill()
        proc.wait()


def test_batches_keep_overlapping_segments_together(tmp_path):
    def seg(name: str, opened: int, closed: int) -> Segment:
        path = tmp_path / name
        path.write_bytes(b"x" * 100)
        return Segment(path, opened, closed)

    long = seg("long", 0, 50)  # open while the next two came and went
    short = [seg("s1", 10, 20), seg("s2", 30, 40)]
    later = seg("later", 60, 70)
    out = batches([long, *short, later], budget_bytes=100)
    assert [[s.name for s in b] for b in out] == [["long", "s1", "s2"], ["later"]]


def test_a_batch_stays_within_its_budget_unless_one_segment_alone_is_larger(tmp_path):
    # One load reads its whole batch into memory: a batch of at most `budget_bytes` bounds it.
    def seg(name: str, size: int, opened: int) -> Segment:
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        return Segment(path, opened, opened + 5)

    segments = [seg("a", 60, 0), seg("b", 60, 10), seg("c", 30, 20), seg("d", 250, 30)]
    out = batches(segments, budget_bytes=100)
    assert [[s.name for s in b] for b in out] == [["a"], ["b", "c"], ["d"]]


TWO_SEGMENTS = """
import sys
from onjob.collector.spool import Spool
spool = Spool(sys.argv[1], fsync=sys.argv[2])
for segment in range(2):
    for i in range(5):
        spool.append(b'{"kind": "x", "i": %d}' % i)
    spool.rotate()
"""


@pytest.mark.parametrize(
    ("policy", "fsyncs"),
    # segment: each closed file and its rename; always: each line, and each rename
    [("never", 0), ("segment", 4), ("always", 12)],
)
def test_each_fsync_policy_flushes_what_it_says(tmp_path, policy, fsyncs):
    strace = debian_program("/usr/bin/strace", "strace")
    trace = tmp_path / "trace"
    subprocess.run(
        [strace, "-f", "-e", "trace=fsync,fdatasync", "-o", str(trace),
         sys.executable, "-c", TWO_SEGMENTS, str(tmp_path / "spool"), policy],
        check=True, timeout=120,
    )  # fmt: skip
    calls = [line for line in trace.read_text().splitlines() if "fsync(" in line]
    assert len(calls) == fsyncs, calls
    assert len(list((tmp_path / "spool").glob("*.jsonl"))) == 2


def test_the_fsync_setting_names_a_policy_and_takes_the_old_switch():
    from pydantic import ValidationError

    from onjob.collector.settings import CollectorSettings

    assert CollectorSettings().fsync == "segment"
    assert [CollectorSettings(fsync=v).fsync for v in (True, "false", "always")] == [
        "always", "never", "always",
    ]  # fmt: skip
    with pytest.raises(ValidationError, match="'never', 'segment' or 'always'"):
        CollectorSettings(fsync="sometimes")
