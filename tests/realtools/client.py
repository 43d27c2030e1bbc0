"""A minimal open-loop streaming client (stdlib asyncio) for tests of queue_server: it sends each
request at its intended time and stamps every SSE chunk, so TTFT is measured from the intended
send like a load-test tool does."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse


@dataclass
class Result:
    """One request as the client saw it; times are time.monotonic() seconds."""

    intended_s: float
    sent_s: float = 0.0
    chunk_s: list = field(default_factory=list)
    usage: dict | None = None
    status: str = "ok"

    @property
    def ttft_ms(self) -> float:
        return (self.chunk_s[0] - self.intended_s) * 1e3

    @property
    def tpot_ms(self) -> float:
        n = len(self.chunk_s)
        return (self.chunk_s[-1] - self.chunk_s[0]) * 1e3 / (n - 1) if n > 1 else float("nan")


async def stream_request(url: str, *, prompt: str, max_tokens: int, intended_s: float | None = None,
                         chat: bool = True) -> Result:
    """Send one streaming request and stamp each content chunk on arrival."""
    u = urlparse(url)
    res = Result(intended_s if intended_s is not None else time.monotonic())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": "mock-llm", "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()
        res.sent_s = time.monotonic()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            res.status = "error"
            return res
        while True:
            line = await reader.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                break
            obj = json.loads(payload)
            if obj.get("choices"):
                res.chunk_s.append(time.monotonic())
            if obj.get("usage"):
                res.usage = obj["usage"]
    finally:
        writer.close()
    return res


async def open_loop(url: str, offsets_s, *, prompt: str, max_tokens: int) -> tuple[float, list]:
    """Send one request at each offset (seconds from now), never waiting for answers; returns
    (t0, results) with t0 the monotonic time the offsets count from."""
    t0 = time.monotonic() + 0.05

    async def one(off):
        delay = t0 + off - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return await stream_request(url, prompt=prompt, max_tokens=max_tokens, intended_s=t0 + off)

    return t0, await asyncio.gather(*(one(o) for o in offsets_s))
