"""RULER on the local engine: latency and tokens per group, with the real SmolLM2-135M.

For each prompt the engine samples a turn group (`--group-size` answers, as the
judge's re-sampling does), then the same engine judges the group through litellm
exactly as `onjob judge` calls it. The small model is a poor judge (it rarely writes
the JSON asked for): the figures are what a RULER call costs on this machine, and
whether it parsed is reported, not assumed.

    .venv/bin/python -m bench.judge.judge [--groups 3] [--group-size 4] [--judge-max-tokens 256]

Prints a table and the first RULER prompt; writes bench/results/judge-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio

import httpx

from bench import harness
from onjob import bundled
from onjob.cli.process import EngineProcess
from onjob.judge import JudgeSettings, Rollout
from onjob.judge import rubric as prompts
from onjob.judge.ruler import judge
from onjob.judge.sampling import sample

QUESTIONS = [
    "What is 17 + 25? Answer briefly.",
    "Name the capital of Italy in one sentence.",
    "Give one tip for writing clear emails.",
    "Which is heavier, a kilogram of iron or a kilogram of feathers?",
]


async def run(args) -> dict:
    settings = JudgeSettings(
        model=f"openai/{bundled.MODEL_NAME}",
        attempts=1,
        judge_max_tokens=args.judge_max_tokens,
        timeout_s=600,
    )
    rows, first_prompt = [], None
    with EngineProcess(["--threads", str(args.threads)]) as engine:
        settings = settings.model_copy(update={"api_base": engine.url})
        async with httpx.AsyncClient(base_url=engine.url, timeout=600) as client:
            for i in range(args.groups):
                messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
                body = {
                    "model": bundled.MODEL_NAME,
                    "messages": messages,
                    "n": args.group_size,
                    "temperature": 1.0,
                    "max_tokens": 48,
                    "logprobs": True,
                    "return_token_ids": True,
                }
                drawn = await sample(client, body)
                rollouts = [
                    Rollout(f"m{c}", [*messages, choice["message"]])
                    for c, choice in enumerate(drawn.response["choices"])
                ]
                if first_prompt is None:
                    first_prompt = prompts.prompt(
                        settings.rubric, messages, None, [r.messages[1:] for r in rollouts]
                    )
                result = await judge(settings, rollouts)
                rows.append(
                    {
                        "group_size": len(rollouts),
                        "sample_s": drawn.latency_ms / 1000,
                        "judge_s": result.latency_ms / 1000,
                        "prompt_tokens": result.prompt_tokens,
                        "completion_tokens": result.completion_tokens,
                        "status": result.status,
                        "error": result.error,
                    }
                )
                r = rows[-1]
                print(
                    f"group {i + 1}: {r['group_size']} members, sampled in {r['sample_s']:.1f} s; "
                    f"judged in {r['judge_s']:.1f} s, {r['prompt_tokens']} prompt + "
                    f"{r['completion_tokens']} completion tokens: {r['status']}"
                    + (f" ({r['error'][:90]})" if r["error"] else ""),
                    flush=True,
                )
    n = len(rows)
    return {
        "model": bundled.MODEL_NAME,
        "args": vars(args),
        "groups": rows,
        "mean": {
            "judge_s": sum(r["judge_s"] for r in rows) / n,
            "prompt_tokens": sum(r["prompt_tokens"] for r in rows) / n,
            "completion_tokens": sum(r["completion_tokens"] for r in rows) / n,
            "parsed": sum(r["status"] == "ok" for r in rows) / n,
        },
        "sample_prompt": first_prompt,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--judge-max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = harness.parse(parser)
    result = asyncio.run(run(args))
    m = result["mean"]
    print(
        f"\nper group (mean of {args.groups}): {m['judge_s']:.1f} s, "
        f"{m['prompt_tokens']:.0f} prompt + {m['completion_tokens']:.0f} completion tokens; "
        f"parsed {m['parsed']:.0%}"
    )
    print("\nThe first RULER prompt:\n")
    for message in result["sample_prompt"]:
        print(f"--- {message['role']} ---\n{message['content']}\n")
    harness.save("judge", result, args.out)


if __name__ == "__main__":
    main()
