"""The minimal HTTP/1.1 of the test servers (tests/realtools/queue_server.py and
tests/fixtures/mock_server.py): stdlib asyncio streams, one request per connection."""

from __future__ import annotations

import json


async def read_request(reader):
    """(method, path without query, lower-cased headers, body) of one HTTP/1.1 request."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    return method, path.split("?")[0], headers, body


def send_json(writer, status: str, obj) -> None:
    """A whole JSON response, then close."""
    data = json.dumps(obj).encode()
    writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)


async def answer_get(writer, path: str, model: str, owner: str) -> None:
    """GET /v1/models lists ``model``; any other GET (/health) says ok."""
    if path.startswith("/v1/models"):
        send_json(writer, "200 OK", {"object": "list", "data": [
            {"id": model, "object": "model", "owned_by": owner}]})
    else:
        send_json(writer, "200 OK", {"status": "ok"})
    await writer.drain()
