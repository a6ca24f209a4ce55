"""The one-command rehearsal of many hosts (`examples/scale_out/rehearse.py`) runs and
says every check holds: with the fake engines, as a newcomer would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_scale_out_rehearsal_runs_and_every_check_holds(tmp_path):
    small = ["--conversations", "4", "--turns", "2", "--dir", str(tmp_path)]
    out = subprocess.run(
        [sys.executable, "-m", "examples.scale_out.rehearse", "--engine", "fake", *small],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    oks = [line for line in out.stdout.splitlines() if "] ok   " in line]
    assert len(oks) == 4, out.stdout
    assert "answered 8; loaded 8; trajectories 4" in out.stdout
