"""The HTTP/JSON door's limits: nesting, values, booleans where numbers are expected, JSON only,
idle connections and the reserved health path. Each against a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from reward_server.backends.fake import FakeNLI

from .conftest import Running, running_server

NLI = {"response": "Paris is big.", "answer": "Paris", "preference": "big"}


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[Running]:
    async with running_server(["server.http.port=0", "server.http.max_json_values=10000",
                               "server.http.header_timeout_s=0.5",
                               "server.http.max_connections=4"]) as r:
        yield r


async def _post(r: Running, path: str, data: bytes | str,
                content_type: str | None = "application/json") -> tuple[int, Any]:
    headers = {"Content-Type": content_type} if content_type else {}
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{r.app.http_port}{path}", data=data, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_deep_nesting_is_400_before_parsing(server: Running) -> None:
    status, reply = await _post(server, "/v1/score", "[" * 5_000 + "]" * 5_000)
    assert status == 400 and "nested deeper than 32" in reply["error"]["message"], reply


async def test_an_openrlhf_label_nested_50000_deep_is_400_not_500(server: Running) -> None:
    label = "[" * 50_000 + "]" * 50_000  # one string in the body; the label inside is deep
    body = json.dumps({"query": ["q r"], "prompts": ["q"], "labels": [label]})
    status, reply = await _post(server, "/openrlhf/reward", body)
    assert status == 400, reply
    assert "sample 0: the label is nested deeper than 32" in reply["error"]["message"]


async def test_too_many_values_are_refused_before_any_is_built(server: Running) -> None:
    body = '{"items": [' + ",".join(["{}"] * 20_000) + "]}"
    status, reply = await _post(server, "/v1/score", body)
    assert status == 400 and "more than 10000 JSON values" in reply["error"]["message"], reply


async def test_a_boolean_weight_is_refused(server: Running) -> None:
    item = {"id": "w", "weighted": {"parts": [{"weight": True, "nli_constraints": NLI}]}}
    status, reply = await _post(server, "/v1/score", json.dumps({"items": [item]}))
    assert status == 400, reply
    assert "items[0].weighted.parts[0].weight: a JSON boolean" in reply["error"]["message"]
    item["weighted"]["parts"][0]["weight"] = 1.0  # type: ignore[index]
    status, reply = await _post(server, "/v1/score", json.dumps({"items": [item]}))
    assert status == 200, reply


async def test_only_json_bodies_are_read(server: Running) -> None:
    body = json.dumps({"items": [{"id": "a", "nli_constraints": NLI}]})
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"):
        status, reply = await _post(server, "/v1/score", body, kind)
        assert status == 415 and "application/json" in reply["error"]["message"], (kind, reply)
        status, _ = await _post(server, "/openrlhf/reward", body, kind)
        assert status == 415
    status, _ = await _post(server, "/v1/score", body, "application/json; charset=utf-8")
    assert status == 200


async def test_idle_connections_are_closed_and_health_keeps_a_path(server: Running) -> None:
    """More connections than server.http.max_connections that send nothing: health still
    answers meanwhile (its reserve), NOT_SERVING naming the full door, and they are closed
    after header_timeout_s, after which health is SERVING and calls are served again."""
    port = server.app.http_port
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(6)]
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/v1/health") as resp:
                body = await resp.json()
                assert resp.status == 503 and "http" in body["down"], body
        closed = await asyncio.gather(*(asyncio.wait_for(reader.read(), 5.0)
                                        for reader, _ in conns))
        assert closed == [b""] * 6  # the server closed them
        status, _ = await _post(server, "/v1/score",
                                json.dumps({"items": [{"id": "a", "nli_constraints": NLI}]}))
        assert status == 200
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/v1/health") as resp:
                assert resp.status == 200, await resp.text()
    finally:
        for _, writer in conns:
            writer.close()


async def test_huge_or_out_of_range_json_numbers_are_400_never_500(server: Running) -> None:
    """A weight of 4,300+ digits was a 500 (Python's int limit, then the float conversion's
    OverflowError); every such number is a 400 naming the field, in a small body and in one
    read piece by piece (over 64 KiB), on /v1/score, /v1/induce_rubrics and OpenRLHF's labels."""
    item = json.dumps({"id": "w", "weighted": {"parts": [{"weight": "N", "nli_constraints": NLI}]}})
    label = json.dumps({"id": "w", "weighted": {"parts": [{"weight": "N", "nli_constraints": {
        "answer": "Paris", "preference": "big"}}]}})
    induce = json.dumps({"history": [{"text": "t"}], "num_samples": "N"})

    def with_number(text: str, number: str) -> str:
        return text.replace('"N"', number)

    for number in ("9" * 4_300, "9" * 4_301, "9" * 50_000, "1e999", "-1e999", "-" + "9" * 400):
        body = '{"items": [' + with_number(item, number) + "]}"
        for padded in (body, body + " " * 70_000):
            status, reply = await _post(server, "/v1/score", padded)
            assert status == 400, (number[:10], len(padded), reply)
            assert "weight" in reply["error"]["message"], reply
        status, reply = await _post(server, "/openrlhf/reward", json.dumps(
            {"query": ["q r"], "prompts": ["q"], "labels": [with_number(label, number)]}))
        assert status == 400, (number[:10], reply)
    for number in ("9" * 30, "9" * 5_000, "1e400"):
        status, reply = await _post(server, "/v1/induce_rubrics", with_number(induce, number))
        assert status == 400 and "num_samples" in reply["error"]["message"], reply
    # in range: 20-digit integers and long fractions still read as numbers
    for number in ("12345678901234567890", "0." + "1" * 5_000):
        status, reply = await _post(server, "/v1/score",
                                    '{"items": [' + with_number(item, number) + "]}")
        assert status == 200, reply


async def test_one_address_gets_its_share_of_connections_and_others_still_get_in() -> None:
    """server.http.max_connections_per_peer=3: the 4th connection from 127.0.0.2 is closed at
    once (it sends nothing), 127.0.0.1 is served and /v1/health says SERVING."""
    async with running_server(["server.http.port=0", "server.http.max_connections_per_peer=3",
                               "server.http.header_timeout_s=30"]) as r:
        port = r.app.http_port
        conns = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
                 for _ in range(5)]
        try:
            got = await asyncio.gather(*(asyncio.wait_for(reader.read(), 2.0)
                                         for reader, _ in conns[3:]))
            assert got == [b"", b""]  # closed by the server at once
            for reader, _ in conns[:3]:  # within the share: left open
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(reader.read(), 0.2)
            status, reply = await _post(r, "/v1/score", json.dumps(
                {"items": [{"id": "a", "nli_constraints": NLI}]}))
            assert status == 200, reply
            async with aiohttp.ClientSession() as s, s.get(
                    f"http://127.0.0.1:{port}/v1/health") as resp:
                assert resp.status == 200 and (await resp.json())["status"] == "SERVING"
        finally:
            for _, writer in conns:
                writer.close()


async def test_a_body_that_stalls_is_answered_and_its_connection_closed() -> None:
    """A slow body (a byte, then nothing, of a declared 1,000): answered 504 after
    server.receive_timeout_s, with its connection closed (the rest is not waited for)."""
    async with running_server(["server.http.port=0", "server.receive_timeout_s=0.5"]) as r:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.app.http_port)
        try:
            writer.write(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{")
            await writer.drain()
            t0 = asyncio.get_running_loop().time()
            answer = await asyncio.wait_for(reader.read(), 5.0)  # to EOF: the server closes
            took = asyncio.get_running_loop().time() - t0
        finally:
            writer.close()
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 504") and b"connection: close" in head, answer[:300]
    assert b"server.receive_timeout_s=0.5" in answer
    assert 0.4 < took < 3.0


async def test_a_client_that_leaves_mid_body_is_cancelled_not_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """A client that closes its connection halfway through its body: the call ends CANCELLED
    (as a gRPC call its client reset), with no error and no traceback in the log (1,024 slow
    bodies dropped at once were logged as 1,024 unexpected errors, tracebacks included)."""
    from reward_server.metrics import RPC_CALLS

    def cancelled() -> float:
        return RPC_CALLS.labels("Score", "CANCELLED", "http")._value.get()  # type: ignore[no-any-return]

    async with running_server(["server.http.port=0"]) as r:
        before = cancelled()
        caplog.set_level("INFO")
        _, writer = await asyncio.open_connection("127.0.0.1", r.app.http_port)
        writer.write(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        for _ in range(100):
            if cancelled() > before:
                break
            await asyncio.sleep(0.02)
        assert cancelled() == before + 1
    assert not [rec for rec in caplog.records if rec.levelname == "ERROR" or rec.exc_info]


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 answer with a Content-Length, head and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    return head + await asyncio.wait_for(reader.readexactly(length), 5.0)


async def _send_and_read(port: int, pieces: list[bytes],
                         first: bytes | None = None) -> tuple[bytes, bytes]:
    """Send ``first`` (read to its answer's end), then ``pieces`` one write each; the answer
    to ``first`` and everything else the server sent until it closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        before = b""
        if first is not None:
            writer.write(first)
            before = await _read_answer(reader)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        return before, await asyncio.wait_for(reader.read(), 5.0)  # to EOF: the server closes
    finally:
        writer.close()


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


HEALTH = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
ENDLESS = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 40_000  # no end


async def test_a_request_head_may_come_in_pieces_and_is_bounded(server: Running) -> None:
    """A request's line and headers may take 16 KiB, in any pieces: one sent a byte at a time
    and one of 15,000 bytes are answered; one that passes 16 KiB without ending is a 400 and
    its connection closed: as the first request of a connection, after an answered one, and
    after one answered from the same first read (pipelined; llhttp, the door's parser, has
    no bound of its own; h11 had this one)."""
    port = server.app.http_port
    small = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    _, answer = await _send_and_read(port, _pieces(small, 1))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    padded = (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 15_000
              + b"\r\nConnection: close\r\n\r\n")
    _, answer = await _send_and_read(port, _pieces(padded, 1024))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    endless = ENDLESS[:16 * 1024 + 1]
    _, answer = await _send_and_read(port, _pieces(endless, 1024))
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    before, answer = await _send_and_read(port, _pieces(endless, 1024), first=HEALTH)
    assert before.startswith(b"HTTP/1.1 200"), before[:200]
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    before, answer = await _send_and_read(port, _pieces(ENDLESS[1024:], 1024),
                                          first=HEALTH + ENDLESS[:1024])
    assert before.startswith(b"HTTP/1.1 200"), before[:200]
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


async def test_a_body_left_unread_behind_an_early_answer_is_no_head(server: Running) -> None:
    """The rest of a 200,000-byte body that arrives after its request was answered (415,
    without reading it) is read past as a body, not counted against the 16 KiB bound on
    request heads: the connection's next request is answered."""
    head = (b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 200000\r\n\r\n")
    close = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    before, answer = await _send_and_read(
        server.app.http_port, [*_pieces(b"a" * 130_000, 4096), close],
        first=head + b"a" * 70_000)
    assert before.startswith(b"HTTP/1.1 415"), before[:200]
    assert answer.startswith(b"HTTP/1.1 200") and b"SERVING" in answer, answer[:200]


async def test_a_long_head_pipelined_behind_a_call_closes_without_a_400() -> None:
    """A request head past 16 KiB pipelined behind a call still running closes the
    connection with no 400 written: the client would read it as the call's answer."""
    body = json.dumps({"items": [{"id": "a", "nli_constraints": NLI}]}).encode()
    call = (b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    nli = FakeNLI(latency_s=1.0)
    async with running_server(["server.http.port=0"], nli=nli) as r:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.app.http_port)
        answer = b""
        try:
            calls = len(nli.batch_sizes)
            writer.write(call)
            while len(nli.batch_sizes) == calls:  # the call is read and running
                await asyncio.sleep(0.01)
            with contextlib.suppress(ConnectionError):
                for piece in _pieces(ENDLESS, 1024):
                    writer.write(piece)
                    await writer.drain()
                # to EOF (or a reset), before the call's answer (1 s): a TimeoutError fails
                while chunk := await asyncio.wait_for(reader.read(65536), 0.9):
                    answer += chunk
        finally:
            writer.close()
    assert b"HTTP/1.1" not in answer, answer[:200]

