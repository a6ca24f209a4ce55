"""Load with faults, for minutes: every client gets a well-formed answer or an
OpenAI-shaped error, and nothing answered is missing from DuckDB.

The scenario is `onjob.testing.faults` (`onjob serve` with a canary in front of
`onjob.testing.faulty_upstream`, the engine killed and restarted part-way; its docstring
lists every check); tests/test_faults_under_load.py runs it for ~15 s, this for longer.

    python -m bench.proxy.faults --minutes 5
    python -m bench.proxy.faults --seconds 20 --concurrency 16 --fraction 0.5

Writes bench/results/faults-<timestamp>.json; exits 1 when a check found something.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench import harness
from onjob.testing import faults


def main() -> int:
    parser = faults.parser()
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("--minutes", type=float, help="run this long (overrides --seconds)")
    args = harness.parse(parser, timed=False)
    if args.minutes:
        args.seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="onjob-faults-") as tmp:
        report = faults.run(Path(tmp), args)
    found = faults.violations(report)
    print(
        f"{report['requests']} requests ({report['requests_per_s']}/s, "
        f"{report['streamed']} streamed) over {args.seconds:g} s"
    )
    for outcome, n in report["answers"].items():
        print(f"  {outcome:<20} {n}")
    print(f"canary: {json.dumps(report['canary'], default=str)[:600]}")
    print(f"engine restart: {json.dumps(report['restart'])}")
    print(
        f"database: {json.dumps(report['db']['rows_by_arm_and_status'])}; "
        f"{report['db']['exchange_ids_received']} received ids, "
        f"{len(report['db']['missing'])} missing"
    )
    print(
        f"/health: {report['health']['polls']} polls, {len(report['health']['failed'])} failed, "
        f"max {report['health']['max_ms']} ms"
    )
    print("violations: " + (json.dumps(found, default=str)[:2000] if found else "none"))
    fields = {"args": {k: str(v) for k, v in vars(args).items()}, "report": report}
    harness.save("faults", {**fields, "violations": found}, args.out)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
