"""A failing ``compute_score`` inside a Ray actor (where verl's ``RewardLoopWorker`` runs it)
reaches the driver as our own exception type, with its fields: Ray pickles a task's exception
and, when that fails, hands the driver an ``UnserializableException`` holding only the text."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from reward_server.api.rows import ExtraInfoError, extra_info
from reward_server.client import RewardCallError
from reward_server.domain import NliConstraintsSpec
from reward_server.integrations.probe import ServerUnreachable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROW = extra_info(NliConstraintsSpec(response="", answer="a", preference="p"), user_id="u1", index=0)


def scorer_class() -> type:
    """A stand-in for verl's RewardLoopWorker: one actor awaiting our compute_score. Made in a
    function so that Ray ships the class by value (the tests package is not importable there)."""

    class Scorer:
        async def score(self, extra_info: dict[str, Any], **kwargs: Any) -> dict[str, float]:
            from reward_server.integrations import verl as rv

            try:
                return await rv.compute_score("src", "a response", None, extra_info, **kwargs)
            finally:
                await rv.close_clients()

    return Scorer


@pytest.fixture(scope="module")
def scorer(ray_session: Any) -> Any:
    actor = ray_session.remote(num_cpus=0)(scorer_class()).remote()
    yield actor
    ray_session.kill(actor)


def test_a_failed_reward_call_reaches_the_driver_as_reward_call_error(ray_session, scorer) -> None:
    # nothing listens on port 1: the first call's start-up probe (one Info call) fails within
    # its own deadline, as a ServerUnreachable (a RewardCallError) with its one-line fix
    ref = scorer.score.remote(ROW, reward_server="127.0.0.1:1", attempts=1, deadline_s=1.0,
                              probe_timeout_s=1.0)
    with pytest.raises(RewardCallError) as err:
        ray_session.get(ref, timeout=120)
    e = err.value
    assert "UnserializableException" not in repr(e)
    assert (e.method, e.code, e.attempts) == ("Info", grpc.StatusCode.UNAVAILABLE, 1)
    assert "127.0.0.1:1" in e.details
    # Ray's wrapper (RayTaskError(ServerUnreachable)) holds the actor's exception itself
    cause = e.cause  # type: ignore[attr-defined]
    assert type(cause) is ServerUnreachable
    assert str(cause).startswith("reward server 127.0.0.1:1 is not reachable (UNAVAILABLE: "
                                 "Connection refused)")
    assert "\n" not in str(cause)


def test_a_bad_row_reaches_the_driver_as_extra_info_error(ray_session, scorer) -> None:
    ref = scorer.score.remote({"kind": "nli_constraints"}, reward_server="127.0.0.1:1")
    with pytest.raises(ExtraInfoError, match=r"old format .* re-run `python -m trainer\.data\.prepare`"):
        ray_session.get(ref, timeout=120)


def test_the_same_call_in_process_fails_the_same_way() -> None:
    """The baseline the Ray test compares with: the local exception and its fields."""
    with pytest.raises(RewardCallError) as err:
        asyncio.run(scorer_class()().score(ROW, reward_server="127.0.0.1:1", attempts=1, deadline_s=1.0))
    assert (err.value.code, err.value.attempts) == (grpc.StatusCode.UNAVAILABLE, 1)
