"""Load test of `forge serve`: aggregate generated tokens/s and time to first token (p50/p95) at
several numbers of concurrent streaming clients.

Starts `forge serve` on a free loopback port (or uses --url, which must be a loopback address),
then for each concurrency level runs a bounded number of streaming /v1/completions requests
(--requests-per-stream per client, and at most --time-limit seconds per level). Prints JSON, then
a short table.

    python benchmarks/load_server.py                     # the default model, 1, 8 and 32 streams
    python benchmarks/load_server.py --model x.gguf --levels 1 4 --max-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from urllib.parse import urlparse

import httpx

WORDS = (
    "river castle engine garden winter violin harbor desert planet lantern forest mirror".split()
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        sys.exit(f"refusing to load-test a non-loopback address: {host}")


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "forge", "serve", "--port", str(port), "--max-batch",
           str(max(args.levels)), "--max-queue", "1024", "--n-ctx", str(args.n_ctx)]  # fmt: skip
    if args.model:
        cmd.insert(4, args.model)
    if args.backend:
        cmd += ["--backend", args.backend]
    log = open(args.server_log, "wb") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("forge serve exited during startup")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    sys.exit("forge serve was not ready within 300 s")


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - t0
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0, "tokens": tokens}


async def run_clients(url: str, ids: list[int], args, start_at: float) -> tuple[list, float, float]:
    """Clients `ids` (each --requests-per-stream requests in turn), starting at monotonic time
    `start_at`: their results, and the monotonic times the first began and the last ended."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    deadline = time.monotonic() + args.time_limit
    results: list[dict] = []

    async def client_loop(i: int, client: httpx.AsyncClient) -> None:
        for k in range(args.requests_per_stream):
            if time.monotonic() > deadline:
                return
            words = " ".join(WORDS[(i + k + j) % len(WORDS)] for j in range(6))
            prompt = f"Client {i} request {k}: write a story about {words}."
            results.append(await one_request(client, url, prompt, args.max_tokens))

    limits = httpx.Limits(max_connections=len(ids) + 4)
    async with httpx.AsyncClient(timeout=args.time_limit + 600, limits=limits) as client:
        t0 = time.monotonic()
        await asyncio.gather(*(client_loop(i, client) for i in ids))
        return results, t0, time.monotonic()


def _client_process(url: str, ids: list[int], args, start_at: float) -> tuple[list, float, float]:
    return asyncio.run(run_clients(url, ids, args, start_at))


def run_level(url: str, streams: int, args) -> dict:
    """One concurrency level. Clients are spread over processes of at most --clients-per-process
    (one Python process parses about 16k SSE events/s: past that the client, not the server,
    would set the rate); all start at the same moment."""
    procs = max(1, min(os.cpu_count() or 1, -(-streams // args.clients_per_process)))
    parts = [list(range(streams))[p::procs] for p in range(procs)]
    if procs == 1:
        outs = [asyncio.run(run_clients(url, parts[0], args, time.monotonic()))]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(procs) as pool:
            start_at = time.monotonic() + 2.0  # after every process has started
            futures = [pool.submit(_client_process, url, ids, args, start_at) for ids in parts]
            outs = [f.result() for f in futures]
    results = [r for out in outs for r in out[0]]
    wall = max(out[2] for out in outs) - min(out[1] for out in outs)
    ttfts = sorted(r["ttft"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {
        "streams": streams,
        "client_processes": procs,
        "requests": len(results),
        "generated_tokens": tokens,
        "seconds": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p95_s": round(_percentile(ttfts, 0.95), 3) if ttfts else None,
    }


CLIENTS_PER_PROCESS = 8
PROMPT_ROOM = 64  # KV positions budgeted per request for its prompt (about 20 tokens here)


COUNTERS = {"forge_preemptions": "preemptions", "forge_steps": "steps",
            "forge_prompt_steps": "prompt_steps"}  # fmt: skip


def counters(url: str) -> dict[str, int]:
    """The server's gauges that count: sequences preempted for KV space, forward passes, and
    passes that held prompt tokens (each slows the decoders in it)."""
    out = dict.fromkeys(COUNTERS.values(), 0)
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            out[COUNTERS[name]] = int(float(value))
    return out


def _percentile(sorted_values: list[float], q: float) -> float:
    at = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[at]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="GGUF file (default: forge's default model)")
    p.add_argument("--url", help="an already running loopback server instead of starting one")
    p.add_argument("--backend", help="backend for the started server")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    p.add_argument("--requests-per-stream", type=int, default=2)
    p.add_argument("--time-limit", type=float, default=180.0, help="seconds per level at most")
    p.add_argument(
        "--n-ctx",
        type=int,
        help="the server's KV pool in positions (default: every "
        "stream's prompt and max_tokens at once, at least 4096, so no level preempts)",
    )
    p.add_argument(
        "--clients-per-process",
        type=int,
        default=CLIENTS_PER_PROCESS,
        help="streaming clients sharing one client process",
    )
    p.add_argument("--server-log", help="file for the started server's stdout and stderr")
    p.add_argument("--json-out", help="also write the result JSON here")
    args = p.parse_args()
    if args.n_ctx is None:
        need = max(args.levels) * (PROMPT_ROOM + args.max_tokens)
        args.n_ctx = max(4096, -(-need // 1024) * 1024)
    proc = None
    if args.url:
        _check_loopback(args.url)
        url = args.url.rstrip("/")
    else:
        proc, url = start_server(args)
    try:
        # warm-up at every level: kernels compiled and decode graphs captured for these batch
        # sizes before anything is timed (a fresh kernel cache costs seconds, once)
        warm = argparse.Namespace(**{**vars(args), "max_tokens": 4, "requests_per_stream": 1})
        for n in args.levels:
            run_level(url, n, warm)
        levels = []
        for n in args.levels:
            before = counters(url)
            levels.append(run_level(url, n, args))
            levels[-1].update({k: v - before[k] for k, v in counters(url).items()})
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    base = levels[0]["tokens_per_s"] or 1.0
    for level in levels:
        level["speedup_vs_first"] = round(level["tokens_per_s"] / base, 2)
    result = {"max_tokens": args.max_tokens, "backend": args.backend, "levels": levels}
    print(json.dumps(result, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    print(f"\n{'streams':>7} {'requests':>8} {'tokens':>7} {'tok/s':>8} {'x':>6} "
          f"{'ttft p50':>9} {'ttft p95':>9} {'steps':>6} {'prompt':>6}")  # fmt: skip
    for lv in levels:
        print(f"{lv['streams']:>7} {lv['requests']:>8} {lv['generated_tokens']:>7} "
              f"{lv['tokens_per_s']:>8.2f} {lv['speedup_vs_first']:>6.2f} "
              f"{lv['ttft_p50_s']:>8.3f}s {lv['ttft_p95_s']:>8.3f}s {lv['steps']:>6} "
              f"{lv['prompt_steps']:>6}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
