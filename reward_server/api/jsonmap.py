"""THE JSON convention of reward.v1 messages: the proto3 JSON mapping (protobuf's json_format)
with the proto field names (``timings_ms``, ``policy_output``; snake_case) and every field
printed, defaults included (a reward of 0.0 is written, not left out).

Input accepts both the proto names and the lowerCamelCase JSON names (``timingsMs``), as
json_format does. The HTTP/JSON door (which reads a body with bounded nesting first,
:func:`reward_server.rpc.jsonlimits.parse_message`), the CLI's JSON output and the training
rows' templates (:mod:`reward_server.api.rows`, OpenRLHF's labels too) all use this module.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from reward_server.errors import InvalidRequest

M = TypeVar("M", bound=Message)


def to_dict(msg: Message) -> dict[str, Any]:
    """``msg`` as a JSON-ready dict in the convention above."""
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def parse(cls: type[M], body: bytes | str, what: str | None = None) -> M:
    """``cls`` from JSON text; InvalidRequest naming ``what`` (default the message's full
    name) and the problem when the text is not such a message."""
    try:
        return json_format.Parse(body, cls())
    except (json_format.ParseError, UnicodeDecodeError, ValueError) as e:
        name = what or f"reward.v1.{cls.DESCRIPTOR.name}"
        raise InvalidRequest(
            f"the body is not a JSON {name} ({_proto_names(cls, str(e))}); send its proto3 JSON mapping"
        ) from None


def parse_dict(cls: type[M], data: Any, what: str) -> M:
    """``cls`` from already-decoded JSON (a dict); InvalidRequest naming ``what``."""
    if not isinstance(data, dict):
        raise InvalidRequest(f"{what} is not a JSON object (got {type(data).__name__})")
    try:
        return json_format.ParseDict(data, cls())
    except (json_format.ParseError, ValueError) as e:
        raise InvalidRequest(
            f"{what} is not a JSON reward.v1.{cls.DESCRIPTOR.name} ({_proto_names(cls, str(e))})"
        ) from None


_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "([^"]*)" at "([^"]*)"\.?\s*'
                       r"Available Fields\(except extensions\): \"\[[^\]]*\]\"")


def _proto_names(cls: type[Message], text: str) -> str:
    """json_format's parse error on one line, its list of a message's fields in the proto
    names (``policy_output``; what the docs and our replies use), not the JSON names."""

    def fields(m: re.Match[str]) -> str:
        try:
            desc = cls.DESCRIPTOR.file.pool.FindMessageTypeByName(m.group(1))
        except KeyError:
            return m.group(0)
        names = ", ".join(f.name for f in desc.fields)
        return f'{m.group(1)} has no field {m.group(2)!r} (at {m.group(3)}); its fields: {names}'

    return " ".join(_NO_FIELD.sub(fields, text).split())
