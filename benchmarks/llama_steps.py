"""The real engine's service curve measured directly (issue 26): llama-server's decode step at
1…16 concurrent streams and its prefill time per prompt token, from streamed token timestamps.

    python benchmarks/llama_steps.py [--streams 1 2 4 8 16] [--tokens 64] [--repeats 3]
                                     [--url URL] [--out steps.json]

Starts the cached build (scripts/real_engine.sh; tests/realtools/llama.py) with 16 slots and one
thread unless --url names a running server. Controlled concurrency: N identical-length streaming
requests sent at once; every content chunk (one token: the tiny model's tokens are single
characters) is stamped on arrival. The decode step is the median gap between consecutive tokens
of a stream, counted only while all N streams are decoding (after the last first token, before
the first last token), so the batch is exactly N. llama-server's own per-request figure
(timings.predicted_per_token_ms) is reported beside it. Prefill: single requests with prompts of
increasing length, TTFT (client) and timings.prompt_ms (server) against the server's prompt_n,
slope by least squares. Not a unit test: figures depend on what else runs on the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realtools import llama  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls count stars".split()


def prompt(chars: int, salt: int) -> str:
    """A plain-ASCII prompt of about ``chars`` characters (one token each for the tiny model),
    different per ``salt`` so no slot reuses another's cached prefix."""
    rng = np.random.default_rng(salt)
    out = f"{salt} "
    while len(out) < chars:
        out += WORDS[int(rng.integers(len(WORDS)))] + " "
    return out[:chars]


async def stream(url: str, text: str, max_tokens: int) -> dict:
    """One streaming /v1/completions request: send time, a stamp per content chunk, the
    server's usage and timings."""
    u = urlparse(url)
    body = json.dumps({"model": llama.MODEL, "prompt": text, "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True},
                       "cache_prompt": False}).encode()
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    res = {"sent_s": time.monotonic(), "token_s": [], "usage": None, "timings": None}
    try:
        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.decode(errors="replace"))
        while line := await reader.readline():
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                if line == b"data: [DONE]":
                    break
                continue
            obj = json.loads(line[6:])
            now = time.monotonic()
            if any(c.get("text") for c in obj.get("choices") or []):
                res["token_s"].append(now)
            res["usage"] = obj.get("usage") or res["usage"]
            res["timings"] = obj.get("timings") or res["timings"]
    finally:
        writer.close()
    return res


def decode_gaps_ms(results: list[dict]) -> list[float]:
    """Gaps between consecutive tokens of each stream while all streams decode together."""
    start = max(r["token_s"][0] for r in results)
    end = min(r["token_s"][-1] for r in results)
    gaps = []
    for r in results:
        t = np.asarray(r["token_s"])
        keep = (t[:-1] >= start) & (t[1:] <= end)
        gaps += list(np.diff(t)[keep] * 1e3)
    return gaps


async def concurrent(url: str, n: int, tokens: int, prompt_chars: int, salt: int) -> dict:
    res = await asyncio.gather(*(stream(url, prompt(prompt_chars, salt + i), tokens)
                                 for i in range(n)))
    assert all(len(r["token_s"]) == tokens for r in res), [len(r["token_s"]) for r in res]
    gaps = decode_gaps_ms(res)
    server = [r["timings"]["predicted_per_token_ms"] for r in res if r["timings"]]
    return {"gaps": len(gaps), "step_ms": statistics.median(gaps) if gaps else float("nan"),
            "server_per_token_ms": statistics.median(server) if server else float("nan")}


async def prefill(url: str, lengths, repeats: int) -> dict:
    rows = []
    for k in range(repeats):
        for n in lengths:
            r = await stream(url, prompt(n, 10_000 * (k + 1) + n), 2)
            rows.append((r["timings"]["prompt_n"], (r["token_s"][0] - r["sent_s"]) * 1e3,
                         r["timings"]["prompt_ms"]))
    p = np.array(rows, dtype=float)
    slope_client, icpt_client = np.polyfit(p[:, 0], p[:, 1], 1)
    slope_server, icpt_server = np.polyfit(p[:, 0], p[:, 2], 1)
    return {"points": [list(map(float, r)) for r in rows],
            "ttft_ms_per_prompt_token": float(slope_client), "ttft_intercept_ms": float(icpt_client),
            "server_prompt_ms_per_token": float(slope_server),
            "server_prompt_intercept_ms": float(icpt_server)}


async def main_async(a, url: str) -> dict:
    await stream(url, prompt(64, 1), 8)                       # warm up
    steps = {}
    for n in a.streams:
        reps = [await concurrent(url, n, a.tokens, a.prompt_chars, 1000 * (k + 1) + 100 * n)
                for k in range(a.repeats)]
        steps[n] = {"step_ms": float(statistics.median(r["step_ms"] for r in reps)),
                    "server_per_token_ms": float(statistics.median(r["server_per_token_ms"] for r in reps)),
                    "repeats_step_ms": [round(float(r["step_ms"]), 3) for r in reps]}
        print(f"{n:3d} streams: decode step {steps[n]['step_ms']:.2f} ms "
              f"(repeats {steps[n]['repeats_step_ms']}), server per token "
              f"{steps[n]['server_per_token_ms']:.2f} ms", flush=True)
    pf = await prefill(url, a.prefill_chars, a.repeats)
    print(f"prefill: TTFT {pf['ttft_ms_per_prompt_token']:.3f} ms per prompt token "
          f"(+{pf['ttft_intercept_ms']:.1f} ms), server {pf['server_prompt_ms_per_token']:.3f} "
          f"ms/token (+{pf['server_prompt_intercept_ms']:.1f} ms)", flush=True)
    return {"steps": steps, "prefill": pf}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-chars", type=int, default=64)
    ap.add_argument("--prefill-chars", type=int, nargs="+", default=[32, 128, 512, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--url")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    srv = None
    if a.url is None:
        engine = llama.locate()
        if engine is None:
            print("no llama-server build: run scripts/real_engine.sh", file=sys.stderr)
            return 2
        srv = llama.start(engine)
        print(f"llama-server ready in {srv.ready_s:.2f} s: {' '.join(srv.args)}", flush=True)
    try:
        out = asyncio.run(main_async(a, a.url or srv.url))
    finally:
        if srv:
            llama.stop(srv)
    out["ready_s"] = srv.ready_s if srv else None
    out["args"] = vars(a)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
