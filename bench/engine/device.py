"""onjob's trainer and local engine on an accelerator: a self-contained benchmark for a
lent GPU host with no model files and no network.

The model is a Llama of SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads, 3 KV
heads, MLP 1536, vocabulary 49152, tied embeddings) with random weights, saved beside a
synthetic byte-level tokenizer carrying a ChatML template (the real SmolLM2 tokenizer
comes from a pip package the host cannot fetch). `--tiny` uses the tests' tiny Llama
shape (`tests/conftest.py`, `_tiny_model`) instead, to check the script on a CPU.

1. train: `onjob.trainer.loop.train`, the trainer's own entry point (as
   bench/trainer/train_run.py drives it), on a snapshot of synthetic groups (default 16 groups
   x 8 members, ~40 prompt and ~60 completion tokens each, the sampler's logprobs the
   base model's own), once per dtype. Seconds per GRPO step (the run's first step left
   out as warm-up), trained tokens/s, the whole run's time, peak CUDA memory.
2. engine: the local engine (`onjob.engine.main.serve`, what `onjob engine` runs) in a
   child process on a free port, `--requests` concurrent chat requests of
   `--max-tokens` tokens each (stdlib HTTP client, ignore_eos) after one warm-up:
   output tokens/s, p50 and p90 latency, per dtype and max batch size.

One JSON line per figure on stdout, progress on stderr; everything also in
$OUT/device.json when OUT is set (rewritten after each figure), and at the end in
`--out`'s device-<timestamp>.json ($OUT when set, else bench/results/). Device: cuda
when available, else cpu. From the repository root:

    python -m bench.engine.device              # the GPU host, ~2 min
    nice -n 19 python -m bench.engine.device --tiny   # a CPU check
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import harness
from bench.harness import ROOT

# SmolLM2-135M's shape, and the tests' tiny Llama (tests/conftest.py, `_tiny_model`).
SHAPES = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    ),
}
VOCAB = 49152
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
RESULTS: list[dict] = []


def log(message: str) -> None:
    print(f"[device {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit(figure: dict) -> None:
    """One figure: a JSON line on stdout, and $OUT/device.json rewritten (so a run cut
    short keeps what it measured)."""
    RESULTS.append(figure)
    print(json.dumps(figure, default=str), flush=True)
    if out := os.environ.get("OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "device.json").write_text(json.dumps(RESULTS, indent=2, default=str))


def missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


# --- the model ---------------------------------------------------------------------------


def tokenizer():
    """A byte-level BPE tokenizer of the model's full vocabulary: SmolLM2's three special
    tokens, the 256 byte symbols, then two-symbol fillers (never produced by encoding,
    but every id the random model samples decodes to something)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for symbol in alphabet:
        vocab[symbol] = len(vocab)
    for a in alphabet:
        for b in alphabet:
            if len(vocab) == VOCAB:
                break
            vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML
    return fast


def build_model(shape: str, where: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    started = time.perf_counter()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        **SHAPES[shape],
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 2
    path = where / f"random-{shape}"
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    log(
        f"random {shape} model, {params / 1e6:.1f} M parameters, in {path} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return path


# --- 1. the trainer ----------------------------------------------------------------------


def snapshot(model_dir: Path, path: Path, device: str, args) -> int:
    """A snapshot of the trainer's Parquet format (`trainer.snapshot`): `groups` turn
    groups of `members` members over random tokens, each member's logprobs the base
    model's own in float32 (what a sampler serving it would have logged), rewards 1 and 0
    in turn. Returns the completion tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM

    rng = random.Random(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    rows, tokens = [], 0
    for g in range(args.groups):
        prompt = [1] + [rng.randrange(3, VOCAB) for _ in range(args.prompt + rng.randint(-4, 4))]
        completions = []
        for _ in range(args.members):
            n = max(4, args.completion + rng.randint(-20, 20))
            completions.append([rng.randrange(3, VOCAB) for _ in range(n - 1)] + [2])
        width = len(prompt) + max(len(c) for c in completions)
        ids = torch.full((len(completions), width), 2, dtype=torch.long)
        for i, c in enumerate(completions):
            ids[i, : len(prompt) + len(c)] = torch.tensor(prompt + c)
        with torch.no_grad():
            logits = model(input_ids=ids.to(device)).logits.float()
            logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None].to(device))[..., 0]
        for i, c in enumerate(completions):
            start = len(prompt) - 1
            rows.append(
                {
                    "group_id": f"g{g:03d}",
                    "kind": "turn",
                    "member_id": f"g{g:03d}-{i}",
                    "position": i,
                    "reward": float(i % 2 == 0),
                    "checkpoint": None,
                    "prompt_ids": [prompt],
                    "completion_ids": [c],
                    "logprobs": [logp[i, start : start + len(c)].tolist()],
                }
            )
            tokens += len(c)
    pq.write_table(pa.Table.from_pylist(rows), path)
    del model
    return tokens


def bench_train(model_dir: Path, work: Path, device: str, dtypes: list[str], args) -> None:
    if gone := missing("peft", "pydantic", "pyarrow", "msgspec"):
        emit({"figure": "train", "skipped": f"not importable: {', '.join(gone)}"})
        return
    import torch

    from onjob.trainer.loop import train
    from onjob.trainer.settings import TrainSettings

    snap = work / "snapshot.parquet"
    started = time.perf_counter()
    completion_tokens = snapshot(model_dir, snap, device, args)
    log(
        f"snapshot: {args.groups} groups x {args.members} members, {completion_tokens} "
        f"completion tokens ({time.perf_counter() - started:.1f} s)"
    )
    for dtype in dtypes:
        log(f"train: {dtype} on {device}")
        settings = TrainSettings(
            base_model=model_dir,
            device=device,
            dtype=dtype,
            lora_rank=args.lora_rank,
            groups_per_step=args.groups_per_step,
            max_logprob_gap=100.0,  # never skip a group: the bench wants every step
            threads=None if device == "cuda" else os.cpu_count(),
        )
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            manifest = train(
                snap,
                work / f"adapter-{dtype}",
                settings,
                echo=lambda line: log(f"  trainer: {line}"),
                progress=True,
            )
        except Exception as exc:  # a figure that says why, and the other figures go on
            emit({"figure": "train", "device": device, "dtype": dtype, "error": repr(exc)})
            continue
        wall = time.perf_counter() - t0
        history = manifest.history
        seconds = [h.tokens / h.tokens_per_s for h in history]
        timed = history[1:] or history
        timed_s = seconds[1:] or seconds
        figure = {
            "figure": "train",
            "device": device,
            "dtype": dtype,
            "attention": manifest.precision.get("attention"),
            "groups": manifest.metrics["groups"],
            "members": manifest.metrics["members"],
            "skipped_groups": manifest.metrics["skipped_groups"],
            "steps": len(history),
            "groups_per_step": args.groups_per_step,
            "tokens_per_step": sum(h.tokens for h in timed) / len(timed),
            "seconds_per_step": statistics.median(timed_s),
            "first_step_s": seconds[0],
            "trained_tokens_per_s": sum(h.tokens for h in timed) / sum(timed_s),
            "run_s": wall,
            "run_tokens_per_s": manifest.metrics["tokens"] / wall,
            "loss_first": manifest.metrics["loss_first"],
            "loss_last": manifest.metrics["loss_last"],
            "lora_rank": args.lora_rank,
        }
        if device == "cuda":
            figure["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
            figure["peak_cuda_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
        else:
            import resource

            figure["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        emit(figure)
        del manifest
        gc.collect()


# --- 2. the local engine -----------------------------------------------------------------

ENGINE = """
import sys
from onjob.engine.main import serve
from onjob.engine.settings import EngineSettings
serve(EngineSettings(model=sys.argv[1], served_model_name="bench", port=int(sys.argv[2]),
      device=sys.argv[3], dtype=sys.argv[4], max_batch_size=int(sys.argv[5])))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float) -> tuple[dict, float]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    return answer, time.perf_counter() - started


def wait_ready(url: str, proc: subprocess.Popen, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {proc.returncode} (its stderr above)")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the engine was not ready in {limit:.0f} s")


def bench_engine(model_dir: Path, device: str, dtypes: list[str], args) -> None:
    if gone := missing("litestar", "msgspec", "uvicorn", "pydantic_settings"):
        emit({"figure": "engine", "skipped": f"not importable: {', '.join(gone)}"})
        return
    # The engine serves on CUDA (EngineSettings.device; `serve` picks cuda when available).
    rng = random.Random(1)
    words = ["the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "it"]
    for dtype in dtypes:
        for batch in args.engine_batch:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log(f"engine: {dtype}, max batch {batch}, on {device}, port {port}")
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            }
            cmd = [sys.executable, "-c", ENGINE, str(model_dir), str(port), device, dtype]
            proc = subprocess.Popen([*cmd, str(batch)], env=env, stdout=sys.stderr)
            figure = {"figure": "engine", "device": device, "dtype": dtype, "max_batch": batch}
            try:
                t0 = time.perf_counter()
                wait_ready(url, proc, args.engine_start_s)
                figure["start_s"] = time.perf_counter() - t0

                def ask(i: int, max_tokens: int, url: str = url) -> tuple[dict, float]:
                    # ~40 prompt tokens: the template's 19 and ~20 bytes of question
                    text = f"Q{i}: " + " ".join(rng.choice(words) for _ in range(5)) + "?"
                    body = {
                        "model": "bench",
                        "messages": [{"role": "user", "content": text}],
                        "max_tokens": max_tokens,
                        "temperature": 1.0,
                        "ignore_eos": True,
                    }
                    return post(f"{url}/v1/chat/completions", body, timeout=300)

                ask(-1, 8)  # warm-up
                started = time.perf_counter()
                with ThreadPoolExecutor(args.requests) as pool:
                    done = list(pool.map(lambda i: ask(i, args.max_tokens), range(args.requests)))
                wall = time.perf_counter() - started
                latencies = sorted(s for _, s in done)
                out_tokens = sum(a["usage"]["completion_tokens"] for a, _ in done)
                figure |= {
                    "requests": args.requests,
                    "max_tokens": args.max_tokens,
                    "prompt_tokens_mean": statistics.mean(
                        a["usage"]["prompt_tokens"] for a, _ in done
                    ),
                    "output_tokens": out_tokens,
                    "wall_s": wall,
                    "output_tokens_per_s": out_tokens / wall,
                    "p50_latency_s": statistics.median(latencies),
                    "p90_latency_s": latencies[int(0.9 * (len(latencies) - 1))],
                }
            except Exception as exc:
                figure["error"] = repr(exc)
            finally:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            emit(figure)


# --- main --------------------------------------------------------------------------------


def machine(device: str) -> dict:
    import torch

    info = {
        "figure": "machine",
        "device": device,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    for module in ("transformers", "peft"):
        try:
            info[module] = __import__(module).__version__
        except ImportError:
            info[module] = None
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 1e9
        info["bf16"] = torch.cuda.is_bf16_supported()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny Llama, less work")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--skip", nargs="*", default=[], choices=["train", "engine"])
    parser.add_argument("--groups", type=int, help="default 16 (4 with --tiny)")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=40, help="prompt tokens per group (mean)")
    parser.add_argument("--completion", type=int, default=60, help="tokens per member (mean)")
    parser.add_argument("--groups-per-step", type=int, default=2, help="the trainer's default")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--requests", type=int, help="concurrent; default 32 (8 with --tiny)")
    parser.add_argument("--max-tokens", type=int, help="default 64 (16 with --tiny)")
    parser.add_argument(
        "--engine-batch",
        type=int,
        nargs="+",
        help="max batch sizes; default 16 (the engine's default) and 32; with --tiny 16",
    )
    parser.add_argument("--engine-start-s", type=float, default=180.0)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ["OUT"]) if os.environ.get("OUT") else harness.RESULTS,
        help="where device-<timestamp>.json goes ($OUT when set, else bench/results/)",
    )
    args = harness.parse(parser, timed=False)
    args.groups = args.groups or (4 if args.tiny else 16)
    args.requests = args.requests or (8 if args.tiny else 32)
    args.max_tokens = args.max_tokens or (16 if args.tiny else 64)
    args.engine_batch = args.engine_batch or ([16] if args.tiny else [16, 32])

    started = time.perf_counter()
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    emit(machine(device))
    with tempfile.TemporaryDirectory(prefix="onjob-device-") as tmp:
        work = Path(tmp)
        model_dir = build_model("tiny" if args.tiny else "smollm2-135m", work)
        if "train" not in args.skip:
            bench_train(model_dir, work, device, args.dtypes, args)
        if "engine" not in args.skip:
            bench_engine(model_dir, device, args.dtypes, args)
    total = time.perf_counter() - started
    where = os.environ.get("OUT")
    log(f"done in {total:.0f} s" + (f", figures in {where}/device.json" if where else ""))
    emit({"figure": "total", "seconds": total, "args": vars(args)})
    harness.save("device", {"figures": RESULTS}, args.out)


if __name__ == "__main__":
    main()
