"""Parsing a request's repeated field element by element gives what protobuf gives."""

from __future__ import annotations

import random

import pytest

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.errors import InvalidRequest
from reward_server.rpc import wire


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
