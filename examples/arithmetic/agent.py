"""An ordinary agent: asks "What is A + B?" through the official `openai` client. Only its
`base_url` points at onjob; nothing else knows onjob exists.

    python examples/arithmetic/agent.py --base-url http://127.0.0.1:8000/v1 --questions 100
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.arithmetic import task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="agent")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")

    def ask(q: str) -> bool:
        reply = client.chat.completions.create(
            model=args.model, messages=task.messages(q), max_tokens=48, temperature=1.0
        )
        return task.correct(q, reply.choices[0].message.content)

    questions = task.training_questions(args.questions, args.seed)
    right = 0
    with ThreadPoolExecutor(args.concurrency) as pool:
        for i, ok in enumerate(pool.map(ask, questions), 1):
            right += ok
            if i % 10 == 0 or i == len(questions):
                print(f"{i} questions, {right} answered right ({right / i:.0%})", flush=True)


if __name__ == "__main__":
    main()
