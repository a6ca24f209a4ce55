"""What reading a request body once costs (`onjob/protocol/body.py`): msgspec's decoding
alone against `decode_body` (decoding, the depth bound and the duplicate-key check), and
the proxy's whole check of a chat request (`proxy.exchange.parse_request`: `decode_body`,
then every field against `protocol.ChatCompletionRequest`), per body, on typical chat
bodies: a 20-message conversation with tools, the same with a
tool call's JSON arguments and a colon in every message, pretty-printed, and a 700 KB one.

    .venv/bin/python -m bench.proxy.body_check [--repeats 2000]

Prints microseconds per body and writes bench/results/body_check-<timestamp>.json. Run it
on an idle machine: the figures are CPU time on the event loop of the proxy.
"""

from __future__ import annotations

import argparse
import json
import timeit

import msgspec

from bench import harness
from onjob.protocol import decode_body
from onjob.proxy.exchange import parse_request
from onjob.proxy.settings import ProxySettings


def bodies() -> dict[str, bytes]:
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"f{i}",
                "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
            },
        }
        for i in range(5)
    ]
    plain = [
        {"role": ("user", "assistant")[i % 2], "content": "some words of a chat turn " * 8}
        for i in range(20)
    ]
    colons = [{**m, "content": "Note: see http://example.com/a?b=c " * 6} for m in plain]
    call = {"id": "c1", "type": "function", "function": {"name": "f0", "arguments": '{"a": "x"}'}}
    colons += [{"role": "assistant", "content": None, "tool_calls": [call]}]
    colons += [{"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'}]
    chat = {"model": "agent", "messages": plain, "tools": tools}
    return {
        "chat, 20 messages, tools": json.dumps(chat).encode(),
        "with colons and a tool call": json.dumps({**chat, "messages": colons}).encode(),
        "pretty-printed": json.dumps(chat, indent=2).encode(),
        "700 KB": json.dumps({**chat, "messages": plain * 150}).encode(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2000)
    args = harness.parse(parser)
    results = []
    settings = ProxySettings()
    for name, raw in bodies().items():
        n = max(10, args.repeats if len(raw) < 100_000 else args.repeats // 100)
        alone = min(timeit.repeat(lambda raw=raw: msgspec.json.decode(raw), number=n, repeat=5))
        checked = min(timeit.repeat(lambda raw=raw: decode_body(raw), number=n, repeat=5))
        whole = min(timeit.repeat(lambda raw=raw: parse_request(raw, settings), number=n, repeat=5))
        row = {
            "body": name,
            "bytes": len(raw),
            "msgspec_us": round(alone / n * 1e6, 2),
            "decode_body_us": round(checked / n * 1e6, 2),
            "parse_request_us": round(whole / n * 1e6, 2),
        }
        row["added_us"] = round(row["decode_body_us"] - row["msgspec_us"], 2)
        results.append(row)
        print(
            f"{name:30} {len(raw):>8} B  msgspec {row['msgspec_us']:>8.1f} µs  "
            f"decode_body {row['decode_body_us']:>8.1f} µs  (+{row['added_us']:.1f})  "
            f"parse_request {row['parse_request_us']:>8.1f} µs"
        )
    harness.save("body_check", {"args": vars(args), "results": results}, args.out)


if __name__ == "__main__":
    main()
