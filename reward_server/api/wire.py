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

from collections.abc import Callable
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


MAX_OTHER_FIELDS = 64  # top-level fields besides the repeated one (a ScoreRequest has none)


def split_repeated(
    raw: bytes, number: int, what: str, *, max_elements: int | None = None,
    too_many: Callable[[int], None] | None = None,
) -> tuple[list[memoryview], bytes]:
    """``(elements, rest)``: the encoded elements of the length-delimited repeated field
    ``number`` of the message ``raw`` (views, in order) and the encoding of its other fields.

    The walk stops at the first element past ``max_elements`` (``too_many(n)`` raises the
    caller's own message; by default InvalidRequest) and at the first field past
    ``MAX_OTHER_FIELDS`` others, so a body of millions of tiny fields costs no more than the cap:
    the work is bounded by the caps, not by the size of the body. Raises InvalidRequest when
    the top level is not valid protobuf wire format."""
    buf = memoryview(raw)
    pos = 0
    elements: list[memoryview] = []
    rest = bytearray()
    others = 0
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
            if max_elements is not None and len(elements) >= max_elements:
                _too_many(len(elements) + 1, max_elements, what, too_many)
            elements.append(buf[body:pos])
        else:
            others += 1
            if others > MAX_OTHER_FIELDS:
                raise _malformed(what, f"more than {MAX_OTHER_FIELDS} fields besides field "
                                 f"{number} (at byte {start})")
            rest += buf[start:pos]
    return elements, bytes(rest)


def _too_many(n: int, limit: int, what: str, too_many: Callable[[int], None] | None) -> None:
    if too_many is not None:
        too_many(n)  # raises the caller's message
    raise InvalidRequest(f"{what}: more than {limit} elements; send fewer")


def parse(cls: type[M], raw: bytes | memoryview, what: str | None = None) -> M:
    """``cls`` parsed from ``raw``; InvalidRequest naming ``what`` if it is not valid."""
    try:
        return cls.FromString(raw)  # type: ignore[arg-type]  # upb takes any buffer
    except DecodeError as e:
        name = what or f"reward.v1.{cls.DESCRIPTOR.name}"
        raise InvalidRequest(
            f"the request body is not a valid {name} ({e}); send a serialized {name}"
        ) from None
