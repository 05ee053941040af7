"""Every exception the integrations (and our error taxonomy) can raise survives pickle, as Ray
moves a remote task's exception to its caller: same type, same fields, same message. Those the
integrations raise are produced by calling them, not built by hand."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import grpc
import pytest

from reward_server import errors
from reward_server.api.rows import ExtraInfoError, extra_info
from reward_server.client import RewardCallError
from reward_server.domain import NliConstraintsSpec
from reward_server.integrations import trl as rtrl
from reward_server.integrations import verl as rverl
from trainer.data.records import DataFormatError


def round_trip(exc: BaseException) -> BaseException:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc) and back.args == exc.args
    assert vars(back) == vars(exc)
    return back


def raised(coro: Any) -> BaseException:
    async def call() -> BaseException:
        try:
            await coro
        except Exception as e:  # what the integration raised, whatever it is
            return e
        finally:
            await rverl.close_clients()
        raise AssertionError("the call did not raise")

    return asyncio.run(call())


def all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *all_subclasses(sub)]
    return out


def test_reward_call_error_keeps_code_details_and_attempts() -> None:
    e = RewardCallError("Score", grpc.StatusCode.UNAVAILABLE, "x", attempts=3)
    e.add_note("while scoring user u1")
    back = round_trip(e)
    assert isinstance(back, RewardCallError)
    assert (back.method, back.code, back.details, back.attempts) == ("Score", grpc.StatusCode.UNAVAILABLE,
                                                                     "x", 3)
    assert back.__notes__ == ["while scoring user u1"]


def test_a_real_failed_call_from_compute_score_round_trips() -> None:
    # nothing listens on port 1: the start-up probe waits for the server until its deadline
    row = extra_info(NliConstraintsSpec(response="", answer="a", preference="p"), user_id="u1",
                     index=0)
    e = raised(rverl.compute_score("s", "text", None, row,
                                   reward_server="127.0.0.1:1", attempts=1, deadline_s=1.0,
                                   probe_timeout_s=1.0))
    assert isinstance(e, RewardCallError) and e.code is grpc.StatusCode.UNAVAILABLE
    back = round_trip(e)
    assert isinstance(back, RewardCallError) and type(back) is type(e)
    assert (back.code, back.details, back.attempts) == (e.code, e.details, 1)
    assert str(back) == str(e) and "127.0.0.1:1 is not reachable" in str(e)


@pytest.mark.parametrize(("kwargs", "kind"), [
    ({"extra_info": {"kind": "nope"}}, ExtraInfoError),  # the old format
    ({"extra_info": {"score_item": '{"id": "u1"}'}}, ExtraInfoError),  # no reward kind
    ({"extra_info": None}, ValueError),
    ({"extra_info": {}, "deadline": 3}, TypeError),  # unknown reward kwarg
])
def test_what_compute_score_refuses_round_trips(kwargs: dict[str, Any], kind: type) -> None:
    e = raised(rverl.compute_score("s", "text", None, reward_server="127.0.0.1:1", **kwargs))
    assert type(e) is kind
    round_trip(e)


def test_what_the_trl_reward_refuses_round_trips() -> None:
    reward = rtrl.RewardServerReward("127.0.0.1:1")
    e = raised(reward(["p"], ["c"]))  # no extra_info column
    assert type(e) is ValueError
    round_trip(e)


@pytest.mark.parametrize("cls", all_subclasses(errors.RewardServerError), ids=lambda c: c.__name__)
def test_every_error_of_the_taxonomy_round_trips(cls: type) -> None:
    if issubclass(cls, RewardCallError):  # and the start-up probe's ServerUnreachable
        exc: BaseException = cls("Info", grpc.StatusCode.INTERNAL, "bug", attempts=1)
    elif cls is errors.Overloaded:
        exc = cls("queue full", retry_after_s=1.5)
    else:
        exc = cls("what was wrong; how to fix it")
    back = round_trip(exc)
    if cls is errors.Overloaded:
        assert back.retry_after_s == 1.5  # type: ignore[attr-defined]


def test_data_format_error_keeps_its_fields() -> None:
    back = round_trip(DataFormatError("a.jsonl", 3, "profile", "not a list"))
    assert isinstance(back, DataFormatError)
    assert (back.path, back.line, back.field, back.problem) == ("a.jsonl", 3, "profile", "not a list")
