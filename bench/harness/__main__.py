"""`python -m bench.harness`: is this machine quiet enough to time something? Samples
the other processes' CPU for a second (`quiet.others`), prints it with the busiest, and
exits 1 when they use more than a tenth of a core."""

from __future__ import annotations

import sys

from bench.harness import quiet


def main() -> int:
    total, busiest = quiet.others()
    print(f"other processes: {total:.0%} of a core over 1 s (quiet below {quiet.LIMIT:.0%})")
    for cores, pid, cmd in busiest:
        print(f"  {cores:5.0%}  pid {pid}  {cmd}")
    return 1 if total > quiet.LIMIT else 0


if __name__ == "__main__":
    sys.exit(main())
