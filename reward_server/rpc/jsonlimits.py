"""JSON read with bounded nesting and a bounded number of values, checked before any Python
object is built, and booleans refused where a message has numbers.

Python's ``json`` parser builds every object of a document before anything can look at it: a
64 MiB body of ``{}`` items became 1.7 GB of dicts, a list of tiny items held the event loop for
seconds, and a label nested 50,000 deep ended in RecursionError. We chose a pre-scan over a
streaming parser: no well-kept streaming JSON parser is installed here (ijson's fast backend
needs yajl), ``json_format`` needs the whole document as dicts anyway, and the pre-scan runs in C
(``re``, ``bytes.count``, ``bytes.replace``) at about the speed of reading the body:

1. every string is a value: more than ``max_values`` pairs of quotes is refused at once;
2. strings are blanked (their contents cannot hide structure), and the values the document can
   hold are at most one per ``[``, ``{``, ``,`` and ``:`` plus one: more than ``max_values`` is
   refused;
3. its depth is the number of passes that delete innermost ``[]`` pairs (brackets only, ``{}``
   read as ``[]``) until nothing is left: more than ``max_depth`` passes is refused.

Only then are the objects built, whose number is now bounded.

Numbers: an integer literal longer than :data:`MAX_INT_DIGITS` digits is read as a float
(``inf`` past 1e308), which no reward.v1 field takes, so it is refused with the message's other
parse errors (400): read as an ``int`` such a literal cost time quadratic in its length, past
4,300 digits Python refused it with a ValueError, and one of 4,300 digits in a double field
overflowed the float conversion (both were 500s).

Both steps keep every single C call short, so that a large body, read in a worker thread, never
holds the interpreter lock (and with it the event loop, health checks included) for long: one
``re``/``bytes`` call over 64 MiB took 100-250 ms on a 2-core host, and ``json.loads`` of a
body at ``max_values`` or of 60 MB of long strings 200-400 ms. So the pre-scan walks the body in
windows of ``WINDOW`` bytes (the lock can pass to another thread between them), and a body
larger than ``WINDOW`` is decoded one piece at a time (:class:`_Pieces`): each member of the
top-level object, and each element of a member that is an array (a Score body's items), is
one ``raw_decode`` call, at most ``MAX_PIECE_BYTES`` long.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from reward_server.api import jsonmap
from reward_server.errors import InvalidRequest

M = TypeVar("M", bound=Message)

# unrolled: fast in re; never starting at an escaped quote (only inside a string, where a
# string cut by a window's end would otherwise be retried at every one of them)
_STRING = re.compile(rb'(?<!\\)"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
MAX_DEPTH = 32  # reward.v1 requests nest at most ~8 levels
MAX_VALUES = 500_000  # a request at every service limit holds ~300,000
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NUMERIC = {
    FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_ENUM,
}


MAX_INT_DIGITS = 20  # an int64 / uint64 needs at most 20 digits


def integer(literal: str) -> int | float:
    """A JSON integer literal: an ``int`` when it fits :data:`MAX_INT_DIGITS` digits, else a
    float (see the module doc)."""
    return int(literal) if len(literal.lstrip("-")) <= MAX_INT_DIGITS else float(literal)


WINDOW = 64 * 1024  # bytes per C call of the pre-scan and of the piecewise decoding
MAX_PIECE_BYTES = 4 << 20  # one member or element of a large body: twice the largest valid item
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_TAIL = re.compile(r"[0-9eE.+-]*")


def _string_end(raw: bytes | bytearray, pos: int) -> int:
    """The end of the string that opens at ``pos`` (the end of ``raw`` if it never closes),
    found with ``find`` (memchr) and a look at the backslashes before each quote."""
    i = pos + 1
    while True:
        j = raw.find(b'"', i)
        if j < 0:
            return len(raw)
        k = j
        while raw[k - 1] == 0x5C:  # a backslash: an odd run escapes the quote
            k -= 1
        if (j - k) % 2 == 0:
            return j + 1
        i = j + 1


def check(text: bytes | bytearray | str, *, max_depth: int, max_values: int, what: str) -> None:
    """Refuse (InvalidRequest naming ``what``) JSON text nested deeper than ``max_depth`` or
    holding more than ``max_values`` values, before it is parsed."""
    raw = text.encode() if isinstance(text, str) else text
    refused = InvalidRequest(f"{what} holds more than {max_values} JSON values (server.http."
                             "max_json_values); send fewer items per request")
    n = len(raw)
    quotes = sum(raw.count(b'"', i, i + WINDOW) for i in range(0, n, WINDOW))
    if quotes // 2 > max_values:  # every string is a value: too many, no regex needed
        raise refused
    values, pieces, pos = 1, [], 0
    while pos < n:  # one window at a time, cut where no string is open
        end = min(n, pos + WINDOW)
        piece = raw[pos:end]
        # at most max_values strings, so blanking them builds a bounded number of pieces
        skeleton = _STRING.sub(b'""', piece) if b'"' in piece else piece
        # a string left open at the window's end: its opening quote is the first one that
        # is not a blanked "" (its own quotes are all escaped, and no complete string follows
        # it, so that tail is as in the body); end the window before it, or past it if it
        # opens the window
        left = skeleton.replace(b'""', b"") if end < n else b""
        if (first := left.find(b'"')) >= 0:
            tail = len(left) - first
            if tail < len(piece):
                end, skeleton = end - tail, skeleton[:len(skeleton) - tail]
            else:
                end, skeleton = _string_end(raw, pos), b'""'
        values += sum(skeleton.count(c) for c in (b"[", b"{", b",", b":"))
        if values > max_values:
            raise refused
        pieces.append(skeleton.translate(_TO_SQUARE, _NOT_BRACKETS))
        pos = end
    brackets = b"".join(pieces)  # at most two per value: bounded
    for _ in range(max_depth):
        if not brackets:
            return
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return  # unbalanced: not JSON, which the parser says (a deep one: RecursionError)
        brackets = shorter
    if brackets:
        raise InvalidRequest(f"{what} is nested deeper than {max_depth} levels (server.http."
                             "max_json_depth)")


def loads(text: bytes | bytearray | str, *, max_depth: int, max_values: int, what: str) -> Any:
    """``json.loads(text)`` after :func:`check` (piecewise for a large body, see the module
    doc); InvalidRequest when it is not JSON."""
    check(text, max_depth=max_depth, max_values=max_values, what=what)
    try:
        if not isinstance(text, str) and len(text) > WINDOW:
            return _Pieces(text, what).document()
        return json.loads(text, parse_int=integer)
    except (ValueError, OverflowError) as e:  # JSONDecodeError and UnicodeDecodeError included
        raise InvalidRequest(f"{what} is not a JSON document ({e})") from None
    except RecursionError:  # not reached within max_depth; kept as a guard
        raise InvalidRequest(f"{what} is nested too deeply") from None


class _Pieces:
    """A JSON document decoded one member (of the top-level object) or one element (of an
    array member) at a time, each with one ``raw_decode`` call on a window of the body decoded
    to text; raises what ``json.loads`` raises for text that is not JSON."""

    def __init__(self, raw: bytes | bytearray, what: str) -> None:
        self._raw, self._what = raw, what
        self._decoder = json.JSONDecoder(parse_int=integer)
        self._size = WINDOW
        self._text, self._start, self._i, self._final = "", 0, 0, False
        self._fill(0)

    def _pos(self) -> int:  # the byte offset of the text's index _i
        t = self._text
        return self._start + (self._i if t.isascii() else len(t[:self._i].encode()))

    def _fill(self, pos: int) -> None:
        raw = self._raw
        end = min(len(raw), pos + self._size)
        chunk = raw[pos:end]
        try:
            text = chunk.decode()
        except UnicodeDecodeError as e:
            if end == len(raw) or e.reason != "unexpected end of data":
                raise
            text = chunk[:e.start].decode()  # a character cut by the window's end
        self._text, self._start, self._i, self._final = text, pos, 0, end == len(raw)

    def _refill(self) -> None:
        """Decode on from the current position; from there already: with a window four
        times as large."""
        if self._i > 0:
            self._fill(self._pos())
            return
        if self._size >= MAX_PIECE_BYTES:
            raise InvalidRequest(f"{self._what} has one JSON member or element of more than "
                                 f"{MAX_PIECE_BYTES} bytes; send smaller items")
        self._size = min(4 * self._size, MAX_PIECE_BYTES)
        self._fill(self._start)

    def _peek(self) -> str:
        while True:
            self._i = _WS.match(self._text, self._i).end()  # type: ignore[union-attr]
            if self._i < len(self._text) or self._final:
                return self._text[self._i:self._i + 1]
            self._fill(self._pos())

    def _expect(self, chars: str) -> str:
        c = self._peek()
        if not c or c not in chars:
            raise json.JSONDecodeError(f"Expecting one of {chars!r}", self._text, self._i)
        self._i += 1
        return c

    def _value(self) -> Any:
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._text, self._i)
                # not cut by the window's end (a number cut as 1.5|e3 reads as 1.5, so what
                # follows one must not run to the end either)
                if self._final or (end < len(self._text) and not (
                        type(value) in (int, float)
                        and _NUMBER_TAIL.match(self._text, end).end() == len(self._text))):  # type: ignore[union-attr]
                    self._i = end
                    return value
            except json.JSONDecodeError:
                if self._final:
                    raise
            self._refill()

    def document(self) -> Any:
        if self._peek() != "{":
            return self._value()
        self._i += 1
        out: dict[str, Any] = {}
        if self._peek() == "}":
            self._i += 1
        else:
            while True:
                if self._peek() != '"':
                    raise json.JSONDecodeError("Expecting property name enclosed in double "
                                               "quotes", self._text, self._i)
                key = self._value()
                self._expect(":")
                out[key] = self._array() if self._peek() == "[" else self._value()
                if self._expect(",}") == "}":
                    break
        if self._peek():
            raise json.JSONDecodeError("Extra data", self._text, self._i)
        return out

    def _array(self) -> list[Any]:
        self._i += 1
        items: list[Any] = []
        if self._peek() == "]":
            self._i += 1
            return items
        while True:
            items.append(self._value())
            if self._expect(",]") == "]":
                return items


def refuse_booleans(descriptor: Any, data: Any, where: str) -> None:
    """InvalidRequest when ``data`` (decoded JSON for the message ``descriptor``) has a JSON
    boolean where the message has a number or an enum (``json_format`` would read true as 1)."""
    if not isinstance(data, dict):
        return
    fields = {f.name: f for f in descriptor.fields}
    fields.update({f.json_name: f for f in descriptor.fields})
    for key, value in data.items():
        f = fields.get(key)
        if f is None:
            continue
        values = value if isinstance(value, list) else [value]
        if f.message_type is not None:
            if f.message_type.GetOptions().map_entry:
                continue  # no request message has a numeric map
            for i, v in enumerate(values):
                at = f"{where}.{key}[{i}]" if isinstance(value, list) else f"{where}.{key}"
                refuse_booleans(f.message_type, v, at)
        elif f.type in _NUMERIC and any(isinstance(v, bool) for v in values):
            raise InvalidRequest(f"{where}.{key}: a JSON boolean where a number is expected; "
                                 "send a number")


def parse_message(cls: type[M], body: bytes | bytearray, *, max_depth: int, max_values: int) -> M:
    """``cls`` from a JSON body read with bounded nesting and values (:func:`loads`), booleans
    refused where numbers are expected, in the JSON convention of
    :mod:`reward_server.api.jsonmap`."""
    data = loads(body, max_depth=max_depth, max_values=max_values, what="the body")
    refuse_booleans(cls.DESCRIPTOR, data, "body")
    return jsonmap.parse_dict(cls, data, "the body")
