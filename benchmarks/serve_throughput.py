"""``rlkit serve`` throughput: requests/s and time-to-first-token under 1, 4 and 16 concurrent clients.

Starts ``rlkit serve`` in-process on a model, then for each concurrency C runs C clients that each
send streamed chat completions back to back (``stream: true``, ``max_tokens`` fixed, temperature
1, a different prompt and seed per request) until ``--requests`` (default 4*C, at least 8) are done.
It reports requests/s, completion tokens/s, time-to-first-token (first non-empty content delta)
and latency percentiles, and the mean number of requests the sampler decoded together — the
server batches concurrent requests into one decode, so req/s should grow with C.

The baseline row for each C is the same requests sent with ``sample()`` directly (no HTTP), so the
difference is the cost of the HTTP layer. Not a test.

    python benchmarks/serve_throughput.py                       # smollm2-135m-instruct, 32 tokens
    python benchmarks/serve_throughput.py --model tiny --concurrency 1 4 16 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from typing import Any, Dict, List

import httpx

import rlkit
from rlkit.chat import prompt_tokens
from rlkit.serve import FixedModel, Limits, create_app, start_server
from rlkit.types import SamplingParams


def prompt(i: int) -> List[Dict[str, str]]:
    a, b = 10 + (i * 7) % 89, 10 + (i * 13) % 89
    return [{"role": "user", "content": f"What is {a} + {b}? Explain briefly."}]


def pct(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def one_request(http: httpx.AsyncClient, url: str, model: str, i: int, max_tokens: int) -> Dict[str, float]:
    body = {"model": model, "messages": prompt(i), "max_tokens": max_tokens, "temperature": 1.0, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with http.stream("POST", url + "/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if ttft is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - start
    return {"ttft": latency if ttft is None else ttft, "latency": latency, "tokens": tokens}


async def http_run(url: str, model: str, concurrency: int, total: int, max_tokens: int, offset: int) -> Dict[str, Any]:
    counter = iter(range(total))
    results: List[Dict[str, float]] = []

    async def worker(http: httpx.AsyncClient) -> None:
        for i in counter:
            results.append(await one_request(http, url, model, offset + i, max_tokens))

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"wall": wall, "results": results}


def direct_run(client: Any, concurrency: int, total: int, max_tokens: int, offset: int) -> Dict[str, Any]:
    tok = client.get_tokenizer()
    lock, counter, results = threading.Lock(), iter(range(total)), []

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            start = time.perf_counter()
            ids = prompt_tokens(tok, prompt(offset + i))
            r = client.sample(ids, 1, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=offset + i)).result()
            latency = time.perf_counter() - start
            results.append({"ttft": latency, "latency": latency, "tokens": r.usage.decode_tokens})

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall": time.perf_counter() - start, "results": results}


def summarize(kind: str, concurrency: int, run: Dict[str, Any], batches: List[int]) -> Dict[str, Any]:
    res = run["results"]
    return {
        "path": kind,
        "clients": concurrency,
        "requests": len(res),
        "req_per_s": len(res) / run["wall"],
        "tok_per_s": sum(r["tokens"] for r in res) / run["wall"],
        "ttft_p50_ms": 1000 * pct([r["ttft"] for r in res], 0.5),
        "ttft_p95_ms": 1000 * pct([r["ttft"] for r in res], 0.95),
        "lat_p50_ms": 1000 * pct([r["latency"] for r in res], 0.5),
        "mean_batch": statistics.mean(batches) if batches else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=None, help="requests per concurrency level (default max(8, 4*C))")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-direct", action="store_true", help="skip the direct sample() baseline")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()

    service = rlkit.connect("local", precision=args.precision)
    client = service.create_sampling_client(base_model=args.model)
    sampler = client._runtime.sampler.sampler  # instrumented: how many requests each decode held
    batches: List[int] = []
    original = sampler.sample

    def recording(requests):
        batches.append(len(requests))
        return original(requests)

    sampler.sample = recording
    source = FixedModel(client, name=args.model, base_model=args.model)
    server = start_server(create_app(source, limits=Limits(max_tokens=max(args.max_tokens, 256), max_n=16)))
    url = server.base_url
    print(f"model={args.model} precision={args.precision} max_tokens={args.max_tokens} temperature=1 "
          f"threads={os.cpu_count()} torch_threads={__import__('torch').get_num_threads()} server={url}")
    asyncio.run(http_run(url, args.model, 2, 2, 4, 10_000))  # warm-up (model, HTTP, allocator)
    rows, offset = [], 0
    try:
        for c in args.concurrency:
            total = args.requests or max(8, 4 * c)
            if not args.no_direct:
                batches.clear()
                rows.append(summarize("direct sample()", c, direct_run(client, c, total, args.max_tokens, offset), list(batches)))
            batches.clear()
            rows.append(summarize("HTTP stream", c, asyncio.run(http_run(url, args.model, c, total, args.max_tokens, offset)), list(batches)))
            offset += total
            print(f"  done: {c} client(s)", flush=True)
    finally:
        server.stop()
        service.close()

    header = f"{'path':<16} {'clients':>7} {'reqs':>5} {'req/s':>7} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p95':>9} {'lat p50':>8} {'batch':>6}"
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        print(f"{r['path']:<16} {r['clients']:>7} {r['requests']:>5} {r['req_per_s']:>7.2f} {r['tok_per_s']:>7.1f} "
              f"{r['ttft_p50_ms']:>7.0f}ms {r['ttft_p95_ms']:>7.0f}ms {r['lat_p50_ms']:>6.0f}ms {r['mean_batch']:>6.1f}")
    print("\nTTFT = first non-empty content delta (for direct sample(), which has no stream: the whole latency).\n"
          "HTTP streams are sent token by token as the sampler decodes (docs/serve.md, Streaming).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
