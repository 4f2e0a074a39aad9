"""Load generator for a running ``minfer serve``: output tok/s, TTFT and inter-token latency.

    minfer serve -m MODEL.gguf --parallel 128 &
    python benchmarks/loadgen.py --url http://127.0.0.1:8080 [-c 1,32,128] [-n 128] [--requests R]

For each concurrency level, that many clients send streaming /v1/completions requests
(``ignore_eos`` so every output is exactly ``-n`` tokens) back to back until ``--requests`` (default:
4 x concurrency, at least 8) have finished. Output tok/s is the sum of completion tokens (from the
usage chunk) over the wall time of the level; TTFT is request start to first text chunk; ITL is the
gap between consecutive text chunks (one token each unless a character spans tokens). Prints a
markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import httpx

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


async def one(client: httpx.AsyncClient, body: dict, ttfts: list, itls: list) -> int:
    t0 = time.perf_counter()
    last, tokens = None, 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if not chunk["choices"] or not chunk["choices"][0]["text"]:
                continue
            now = time.perf_counter()
            if last is None:
                ttfts.append(now - t0)
            else:
                itls.append(now - last)
            last = now
    return tokens


async def level(url: str, concurrency: int, n_requests: int, max_tokens: int, prompt: str) -> dict:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    ttfts, itls, totals = [], [], []
    todo = iter(range(n_requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client):
        for _ in todo:
            got = await one(client, body, ttfts, itls)
            if got != max_tokens:  # ignore_eos: anything else is a failed request, not a figure
                raise RuntimeError(f"a request returned {got} of its {max_tokens} tokens")
            totals.append(got)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(600.0)) as client:
        await one(client, dict(body, max_tokens=4), [], [])  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"c": concurrency, "requests": len(totals), "tok_s": sum(totals) / wall, "ttft": ttfts, "itl": itls}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))] * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (loopback)")
    ap.add_argument("-c", "--concurrency", default="1,32,128", help="comma-separated levels (default: 1,32,128)")
    ap.add_argument("-n", "--max-tokens", type=int, default=128, help="output tokens per request (default: 128)")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: 4 x concurrency, >= 8)")
    ap.add_argument("--prompt", default=PROMPT)
    a = ap.parse_args(argv)
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    rows = []
    for c in levels:
        n = a.requests or max(8, 4 * c)
        r = asyncio.run(level(a.url, c, n, a.max_tokens, a.prompt))
        rows.append(r)
        print(f"loadgen: concurrency {c}: {r['requests']} requests, {r['tok_s']:.1f} tok/s", file=sys.stderr)
    print("| concurrency | requests | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | ITL p99 (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['c']} | {r['requests']} | {r['tok_s']:.1f} | {pct(r['ttft'], 50):.1f} | {pct(r['ttft'], 99):.1f} "
              f"| {pct(r['itl'], 50):.2f} | {pct(r['itl'], 99):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
