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

Only then does ``json.loads`` build the objects, whose number is now bounded.
"""

from __future__ import annotations

import json
import re
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from reward_server.errors import InvalidRequest

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: fast in re
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


def check(text: bytes | str, *, max_depth: int, max_values: int, what: str) -> None:
    """Refuse (InvalidRequest naming ``what``) JSON text nested deeper than ``max_depth`` or
    holding more than ``max_values`` values, before it is parsed."""
    raw = text.encode() if isinstance(text, str) else text
    refused = InvalidRequest(f"{what} holds more than {max_values} JSON values (server.http."
                             "max_json_values); send fewer items per request")
    if raw.count(b'"') // 2 > max_values:  # every string is a value: too many, no regex needed
        raise refused
    # at most max_values strings now, so blanking them builds a bounded number of pieces
    skeleton = _STRING.sub(b'""', raw) if b'"' in raw else raw
    if 1 + sum(skeleton.count(c) for c in (b"[", b"{", b",", b":")) > max_values:
        raise refused
    brackets = skeleton.translate(_TO_SQUARE, _NOT_BRACKETS)
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


def loads(text: bytes | str, *, max_depth: int, max_values: int, what: str) -> Any:
    """``json.loads(text)`` after :func:`check`; InvalidRequest when it is not JSON."""
    check(text, max_depth=max_depth, max_values=max_values, what=what)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"{what} is not a JSON document ({e})") from None
    except RecursionError:  # not reached within max_depth; kept as a guard
        raise InvalidRequest(f"{what} is nested too deeply") from None


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
