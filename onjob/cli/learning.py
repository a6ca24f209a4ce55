"""`onjob judge`, `onjob train` and `onjob loop`: the stages that turn traffic into checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import CONFIG, DATABASE, ENGINE, load_settings
from .exits import Exit, Failed, NothingToDo, Refused


def cmd_judge(args: argparse.Namespace) -> int:
    import asyncio

    from ..collector import StorageError
    from ..deploy.judging import judge
    from ..judge import ConfigError

    settings = load_settings(
        args,
        proxy={"engine_url": args.engine_url},
        collector={"db": args.db},
        judge={"model": args.model, "api_base": args.api_base, "group_size": args.group_size},
    )
    try:
        asyncio.run(judge(settings, once=args.once, echo=lambda line: print(line, flush=True)))
    except StorageError as exc:
        raise Refused(
            f"{exc} (a running `onjob serve` runs the judge in its loop every loop.interval_s)"
        ) from exc
    except ConfigError as exc:
        raise Refused(str(exc)) from exc
    return Exit.OK


def train_child(snapshot_path: Path, out: Path, settings_file: Path | None, parent: Path | None):
    """The child's side of `deploy.act.training.train` (`onjob train --snapshot`): torch is
    imported here and only here, in a process of its own."""
    from ..trainer import NothingToTrain, TrainerError, TrainSettings
    from ..trainer.loop import train as run

    s = (
        TrainSettings.model_validate_json(settings_file.read_text())
        if settings_file
        else TrainSettings()
    )
    try:
        run(snapshot_path, out, s, parent=parent, echo=lambda line: print(line, flush=True))
    except NothingToTrain as exc:
        raise NothingToDo(str(exc)) from exc
    except TrainerError as exc:
        raise Failed(str(exc)) from exc
    return Exit.OK


def cmd_train(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from ..collector import Collector, StorageError
    from ..deploy.act.training import live_checkpoint, train
    from ..deploy.errors import DeployError, TrainingFailed

    if args.jobs:
        from .train_job import watch

        return watch(
            args.jobs,
            once=args.once,
            ranks=args.ranks,
            poll_s=args.poll_s,
            base_model=args.base_model,
            echo=lambda line: print(line, flush=True),
        )
    if args.snapshot and args.publish:
        from .train_job import run_one

        return run_one(
            args.snapshot,
            args.publish,
            Path(args.out) if args.out else None,
            Path(args.settings) if args.settings else None,
            Path(args.base_model) if args.base_model else None,
        )
    if args.snapshot:
        if not args.out:
            raise Refused("--snapshot needs --out")
        return train_child(
            Path(args.snapshot),
            Path(args.out),
            Path(args.settings) if args.settings else None,
            Path(args.parent) if args.parent else None,
        )
    settings = load_settings(
        args,
        collector={"db": args.db},
        trainer={"base_model": args.base_model, "checkpoints_dir": args.checkpoints_dir},
    )

    async def run():
        db = Collector(settings.collector)
        await db.start()
        try:
            parent = args.parent
            if parent is None:
                parent = await db.query(lambda st: live_checkpoint(st, settings))
            return await train(db, settings, parent=parent or None)
        finally:
            await db.close()

    try:
        manifest = asyncio.run(run())
    except TrainingFailed as exc:  # before DeployError, its base
        raise Failed(str(exc)) from exc
    except (StorageError, DeployError, ValueError) as exc:
        raise Refused(str(exc)) from exc
    return Exit.OK if manifest is not None else Exit.NOTHING


def cmd_loop(args: argparse.Namespace) -> int:
    import asyncio

    from ..collector import StorageError
    from ..deploy.errors import DeployError, TrainingFailed
    from ..deploy.loop import run
    from ..judge import ConfigError, JudgeError

    settings = load_settings(args, proxy={"engine_url": args.engine_url}, collector={"db": args.db})
    try:
        asyncio.run(run(settings, once=args.once, echo=lambda line: print(line, flush=True)))
    except StorageError as exc:
        raise Refused(f"{exc} (a running `onjob serve` runs the loop itself)") from exc
    except (JudgeError, TrainingFailed) as exc:  # before DeployError, its base
        raise Failed(str(exc)) from exc
    except (ConfigError, DeployError, ValueError) as exc:
        raise Refused(str(exc)) from exc
    return Exit.OK


def add_commands(sub) -> None:
    _judge_command(sub)
    _train_command(sub)
    _loop_command(sub)


def _judge_command(sub) -> None:
    judge = sub.add_parser(
        "judge",
        help="re-sample groups from logged traffic and score them (RULER, reward functions)",
        description=(
            "Judge passes (one with --once): re-sample logged turns into groups (the logged "
            "answer plus judge.group_size alternatives from the engine), group finished "
            "conversations "
            "by scenario, and score every unscored group with RULER (--model, any litellm "
            "model), the reward functions in [judge.rewards] and posted feedback. Works on a "
            "database no server holds; `onjob serve` runs the same pass every "
            "loop.interval_s. Settings as for `onjob serve` ([judge] section)."
        ),
        parents=[CONFIG, DATABASE, ENGINE],
    )
    judge.add_argument("--once", action="store_true", help="one pass, then exit")
    judge.add_argument(
        "--model", help='RULER judge as a litellm model name, e.g. "openai/gpt-4.1-mini"'
    )
    judge.add_argument("--api-base", help="the judge's OpenAI-compatible base URL")
    judge.add_argument("--group-size", type=int, help="alternatives sampled per turn (4)")
    judge.set_defaults(func=cmd_judge)


def _train_command(sub) -> None:
    train = sub.add_parser(
        "train",
        help="GRPO on scored groups: write a LoRA checkpoint (PEFT format)",
        description=(
            "Export the scored groups not trained on yet (with a spread of rewards, sampled by "
            "the live checkpoint or up to trainer.max_staleness checkpoints back) to a Parquet "
            "snapshot, train a LoRA adapter on them in a child process, and record it in the "
            "checkpoints table as a candidate. With --snapshot, run just the training on a "
            "snapshot (what the child does). Exit 0: checkpoint written; 3: nothing to train "
            "on; 1: the run failed; 2: bad settings. Settings: [trainer] in the TOML file."
        ),
        parents=[CONFIG, DATABASE],
    )
    train.add_argument(
        "--parent",
        help="checkpoint to continue (name; with --snapshot, its directory); default: the live "
        'one from [proxy.aliases]; "" = start from the base model',
    )
    train.add_argument("--base-model", help="base model directory (default: bundled SmolLM2)")
    train.add_argument("--checkpoints-dir", help="where checkpoints go (default ./checkpoints)")
    train.add_argument("--snapshot", help="train on this snapshot only (the child's mode)")
    train.add_argument("--out", help="with --snapshot: the checkpoint directory to write")
    train.add_argument("--settings", help="with --snapshot: trainer settings as JSON")
    train.add_argument(
        "--publish",
        help="with --snapshot: publish the checkpoint under this s3://.../checkpoints prefix; "
        "--snapshot may then be a submitted job, s3://name/prefix/snapshots/NAME",
    )
    train.add_argument(
        "--jobs",
        help='s3://name/prefix (trainer.bucket): take the runs servers with trainer.runner = "job" '
        "submit there, train each and publish its checkpoint",
    )
    train.add_argument("--once", action="store_true", help="with --jobs: one run, then exit")
    train.add_argument(
        "--ranks", type=int, default=1, help="with --jobs: processes per run (torchrun, DDP)"
    )
    train.add_argument(
        "--poll-s", type=float, default=5.0, help="with --jobs: seconds between looks"
    )
    train.set_defaults(func=cmd_train)


def _loop_command(sub) -> None:
    loop = sub.add_parser(
        "loop",
        help="resample, judge, train, canary, compare, decide (what onjob serve runs)",
        description=(
            "One iteration: undecided candidates a crashed iteration left are decided or "
            "retired; if loop.alias has a canary, one canary round (more pairs while its test "
            "is open, then promote, ready for review, roll back at a tripped guard, a lost "
            "test or its cap in rounds and wall time, or wait); a judge pass; else, with "
            "loop.min_new_groups trainable groups and neither the training budget nor the "
            "back-off in the way, a training run whose candidate takes its offline test at "
            "the engine's speed (held-out prompts, then the last day's traffic it did not "
            "train on, judged by the referee: loop.gate or the training reward) and is "
            "stopped there or becomes the canary. State lives in DuckDB, so an interrupted "
            "iteration is resumed by the next. For a database no server holds, or as one more "
            "worker on a DuckLake (collector.catalog), where each lineage is worked by one "
            "worker at a time and one held by another is passed by; `onjob serve` runs it "
            "every loop.interval_s. Settings: [loop], [judge], [trainer]."
        ),
        parents=[CONFIG, DATABASE, ENGINE],
    )
    loop.add_argument("--once", action="store_true", help="one iteration, then exit")
    loop.set_defaults(func=cmd_loop)
