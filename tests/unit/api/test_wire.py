"""Parsing a request's repeated field element by element gives what protobuf gives."""

from __future__ import annotations

import random

import pytest

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import wire
from reward_server.errors import InvalidRequest


def _request(rng: random.Random) -> pb.InduceRubricsRequest:
    return pb.InduceRubricsRequest(
        history=[pb.HistoryItem(context="c" * rng.randrange(0, 300), text=f"t{i}" * rng.randrange(1, 99))
                 for i in range(rng.randrange(0, 20))],
        task=rng.randrange(0, 5), num_samples=rng.randrange(0, 65), seed=rng.randrange(-2**40, 2**40),
    )


@pytest.mark.parametrize("seed", range(20))
def test_split_then_parse_equals_parse(seed: int) -> None:
    msg = _request(random.Random(seed))
    elements, rest = wire.split_repeated(msg.SerializeToString(), 1, "x")
    rebuilt = wire.parse(pb.InduceRubricsRequest, rest)
    rebuilt.history.extend(wire.parse(pb.HistoryItem, e) for e in elements)
    assert rebuilt == msg


def test_unknown_fields_are_kept_in_rest() -> None:
    raw = pb.ScoreRequest(items=[pb.ScoreItem(id="a")]).SerializeToString() + b"\x10\x07"  # field 2
    elements, rest = wire.split_repeated(raw, 1, "x")
    assert [bytes(e) for e in elements] == [pb.ScoreItem(id="a").SerializeToString()]
    assert rest == b"\x10\x07"


@pytest.mark.parametrize(("raw", "needle"), [
    (b"\x0a\x05ab", "runs past the end"),
    (b"\x0a", "truncated"),
    (b"\x0b\x00", "wire type 3"),
    (b"\x00\x01", "field number 0"),
    (b"\x08" + b"\xff" * 11, "varint too long"),
])
def test_malformed_tops_are_invalid_requests(raw: bytes, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=needle):
        wire.split_repeated(raw, 1, "reward.v1.ScoreRequest")


def test_parse_names_the_message() -> None:
    with pytest.raises(InvalidRequest, match=r"not a valid reward\.v1\.VerifyRequest"):
        wire.parse(pb.VerifyRequest, b"\x0a\x10abc")


def test_the_split_stops_at_the_first_element_past_the_cap() -> None:
    """3 empty items then a malformed tail: refused for the count at the 4th item, so the walk
    never reached the tail (the body's size does not decide the work; the cap does)."""
    raw = b"\x0a\x00" * 4 + b"\x0a\x05ab"  # 4 empty items, then one running past the end
    seen: list[int] = []

    def too_many(n: int) -> None:
        seen.append(n)
        raise InvalidRequest(f"items: {n} items exceed the cap")

    with pytest.raises(InvalidRequest, match="4 items exceed"):
        wire.split_repeated(raw, 1, "x", max_elements=3, too_many=too_many)
    assert seen == [4]
    assert len(wire.split_repeated(raw[:-4], 1, "x", max_elements=4)[0]) == 4  # at the cap: fine


def test_other_fields_are_bounded_too() -> None:
    raw = b"\x10\x07" * (wire.MAX_OTHER_FIELDS + 1) + b"\x0a\x05ab"
    with pytest.raises(InvalidRequest, match=f"more than {wire.MAX_OTHER_FIELDS} fields"):
        wire.split_repeated(raw, 1, "x")
