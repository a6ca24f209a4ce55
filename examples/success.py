"""A held-out success figure: the fraction of successes with a 95% Wilson interval."""

from __future__ import annotations

import math


def success(right: int, n: int, z: float = 1.96) -> dict:
    p = right / n if n else 0.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n) if n else 0.5
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n) if n else 0.5
    return {"success": p, "n": n, "ci95": [max(0.0, centre - half), min(1.0, centre + half)]}
