"""The demo's learning curve as a PNG: each re-sampled group's mean reward over time,
coloured by the checkpoint that sampled it, with the routing changes and the held-out
success before and after; below it, every decision with its reason: what the gate and
the guards said. Needs matplotlib (`pip install 'onjob[demo]'`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from onjob.deploy.progress import GroupReward
    from onjob.deploy.records import Routing


def learning_curve(
    path: Path, groups: list[GroupReward], history: list[Routing], result: dict
) -> None:
    start = result["started"]

    def minutes(ts) -> float:
        return (ts.timestamp() - start) / 60

    events = _events(history, minutes)
    fig, (ax, notes) = plt.subplots(
        2,
        1,
        figsize=(10, 5 + 0.22 * len(events)),
        dpi=110,
        gridspec_kw={"height_ratios": [5, 0.4 + 0.22 * len(events)]},
    )
    names = list(dict.fromkeys(g.checkpoint for g in groups))
    colours = plt.get_cmap("tab10")
    for i, name in enumerate(names):
        mine = [g for g in groups if g.checkpoint == name]
        xs, ys = [minutes(g.created) for g in mine], [g.reward for g in mine]
        mean = sum(ys) / len(ys)
        label = f"{_short(name)}: mean {mean:.2f} over {len(ys)} groups"
        ax.scatter(xs, ys, s=14, alpha=0.5, color=colours(i % 10), label=label)
        ax.hlines(mean, min(xs), max(xs), colors=colours(i % 10), linewidth=2.5)
    for x, what, _ in events:
        ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
        ax.text(x, 1.13, what, rotation=90, fontsize=7, va="top", ha="right", color="grey")
    before, after = result["before"], result["after"]
    end = result["wall_s"] / 60
    for x, r, name in ((0, before, "before"), (end, after, "after")):
        low, high = r["ci95"]
        ax.errorbar(
            [x],
            [r["success"]],
            yerr=[[r["success"] - low], [high - r["success"]]],
            fmt="D",
            color="black",
            capsize=4,
        )
        ax.annotate(
            f"held-out {name}: {r['success']:.0%}",
            (x, r["success"]),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
        )
    ax.set_xlim(-0.5, end + 0.5)
    ax.set_ylim(-0.05, 1.15)
    ax.set_xlabel("minutes since the demo started")
    ax.set_ylabel("mean reward of a re-sampled group")
    ax.set_title(f"onjob demo: {result['task']}", fontsize=10)
    ax.legend(loc="upper left", fontsize=7)
    notes.axis("off")
    referee = result.get("gate", "the reward")
    notes.set_title(f"decisions (referee: {referee})", fontsize=9, loc="left")
    for i, (x, what, reason) in enumerate(events):
        line = f"{x:5.1f} min  {what:<20} {reason}"
        notes.text(0, 1 - (i + 1) / (len(events) + 1), line, fontsize=7, family="monospace",
                   transform=notes.transAxes, va="center")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _events(history: list[Routing], minutes) -> list[tuple[float, str, str]]:
    """Per routing decision: when (minutes), what, and the reason the loop recorded (the
    held-out check, the paired test, the guard that tripped or held)."""
    lines, live, canary = [], None, None
    for row in history:
        if row.canary and row.canary != canary:
            what = f"canary {_short(row.canary)}"
        elif canary and not row.canary:
            what = f"{'promoted' if row.live == canary else 'rolled back'} {_short(canary)}"
        elif row.live == live and row.canary == canary:
            stopped = re.search(r"ckpt-\S+?(?=:)", str(row.reason))
            what = f"stopped {_short(stopped.group(0)) if stopped else ''}"
        else:
            what = f"live {_short(row.live)}"
        reason = " ".join(str(row.reason or "").split())
        reason = reason.removeprefix("stopped before canary: ")
        reason = reason if len(reason) <= 100 else reason[:99] + "…"
        lines.append((minutes(row.ts), what, reason))
        live, canary = row.live, row.canary
    return lines


def _short(name: str | None) -> str:
    return "base" if not name else name[-6:] if name.startswith("ckpt-") else name
