"""Request bodies as bytes: parsed by us, so a malformed body is INVALID_ARGUMENT, and a large one
is parsed one element at a time instead of in one C call that holds the event loop.

gRPC Python would parse a request with the message class's ``FromString`` before our handler
runs and answer a malformed body UNKNOWN; the server registers our methods without a request
deserializer instead (they receive the raw bytes) and parses them here.

A ``ScoreRequest`` is one repeated field of items; on the wire that is one length-delimited
record per item (protobuf never packs message fields), so :func:`split_repeated` walks the top
level of the encoding (tags and lengths only) and each item is then parsed on its own, with the
event loop free between items.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from reward_server.errors import InvalidRequest

M = TypeVar("M", bound=Message)

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _malformed(what: str, problem: str) -> InvalidRequest:
    return InvalidRequest(
        f"the request body is not a valid {what} ({problem}); send a serialized {what}"
    )


def _varint(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise _malformed(what, f"truncated at byte {pos}")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _malformed(what, f"varint too long at byte {pos}")


def split_repeated(raw: bytes, number: int, what: str) -> tuple[list[memoryview], bytes]:
    """``(elements, rest)``: the encoded elements of the length-delimited repeated field
    ``number`` of the message ``raw`` (views, in order) and the encoding of its other fields.
    Raises InvalidRequest when the top level is not valid protobuf wire format."""
    buf = memoryview(raw)
    pos = 0
    elements: list[memoryview] = []
    rest = bytearray()
    while pos < len(buf):
        start = pos
        key, pos = _varint(buf, pos, what)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise _malformed(what, f"field number 0 at byte {start}")
        body = pos
        if wire_type == _VARINT:
            _, pos = _varint(buf, pos, what)
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        elif wire_type == _LENGTH:
            n, body = _varint(buf, pos, what)
            pos = body + n
        else:
            raise _malformed(what, f"wire type {wire_type} at byte {start}")
        if pos > len(buf):
            raise _malformed(what, f"field {field} at byte {start} runs past the end")
        if field == number and wire_type == _LENGTH:
            elements.append(buf[body:pos])
        else:
            rest += buf[start:pos]
    return elements, bytes(rest)


def parse(cls: type[M], raw: bytes | memoryview, what: str | None = None) -> M:
    """``cls`` parsed from ``raw``; InvalidRequest naming ``what`` if it is not valid."""
    try:
        return cls.FromString(raw)  # type: ignore[arg-type]  # upb takes any buffer
    except DecodeError as e:
        name = what or f"reward.v1.{cls.DESCRIPTOR.name}"
        raise InvalidRequest(
            f"the request body is not a valid {name} ({e}); send a serialized {name}"
        ) from None
