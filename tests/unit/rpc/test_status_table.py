import inspect
import pickle

import grpc
import pytest

from reward_server import errors
from reward_server.rpc.status import (
    MAX_DETAILS_CHARS,
    RETRY_PUSHBACK_KEY,
    STATUS_TABLE,
    message_for,
    portable,
    status_for,
    trailers_for,
)


def _error_classes() -> list[type]:
    return [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.RewardServerError) and c is not errors.RewardServerError
    ]


def test_table_is_total_over_the_taxonomy() -> None:
    missing = [c.__name__ for c in _error_classes() if c not in STATUS_TABLE]
    assert missing == []


def test_codes() -> None:
    assert status_for(errors.InvalidRequest("x")) is grpc.StatusCode.INVALID_ARGUMENT
    assert status_for(errors.Unauthenticated("x")) is grpc.StatusCode.UNAUTHENTICATED
    assert status_for(errors.Overloaded("x")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_for(errors.BackendUnavailable("x")) is grpc.StatusCode.UNAVAILABLE
    assert status_for(errors.DeadlineExceeded("x")) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_for(TimeoutError()) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_for(KeyError("boom")) is grpc.StatusCode.INTERNAL
    assert status_for(errors.EngineError("x")) is grpc.StatusCode.INTERNAL
    assert status_for(MemoryError()) is grpc.StatusCode.UNAVAILABLE
    assert status_for(ConnectionResetError()) is grpc.StatusCode.UNAVAILABLE


def test_subclasses_inherit_their_parents_code() -> None:
    class JudgeCrashed(errors.BackendUnavailable):
        pass

    assert status_for(JudgeCrashed("x")) is grpc.StatusCode.UNAVAILABLE


def test_messages() -> None:
    assert message_for(errors.InvalidRequest("items[0].text: must not be empty")) == (
        "items[0].text: must not be empty"
    )
    assert "see the server log" in message_for(ValueError("oops"))
    assert "deadline" in message_for(TimeoutError())
    assert "see the server log" in message_for(errors.EngineError("judge failed: IndexError: x; see the server log"))


def test_messages_are_clipped_to_fit_in_trailers() -> None:
    text = message_for(errors.InvalidRequest("x" * 50_000))
    assert len(text) <= MAX_DETAILS_CHARS and text.endswith("(50000 characters in all)")


def test_overloaded_carries_the_retry_pushback() -> None:
    assert trailers_for(errors.Overloaded("full", retry_after_s=0.2504)) == ((RETRY_PUSHBACK_KEY, "250"),)
    assert trailers_for(errors.Overloaded("full")) == ()
    assert trailers_for(errors.InvalidRequest("bad")) == ()


@pytest.mark.parametrize("exc", [
    TimeoutError(), MemoryError("out of memory"), ConnectionError("reset"), KeyError("x"),
    errors.Overloaded("full", retry_after_s=0.25), errors.InvalidRequest("items[0]: bad"),
])
def test_an_error_crosses_a_process_as_one_of_ours_with_the_same_answer(exc: BaseException) -> None:
    """What a service replica raises to its ingress (pickled by Ray) keeps the code, the
    message and the trailers the table gives the original."""
    back = pickle.loads(pickle.dumps(portable(exc)))
    assert isinstance(back, errors.RewardServerError)
    assert status_for(back) is status_for(exc)
    assert message_for(back) == message_for(exc)
    assert trailers_for(back) == trailers_for(exc)
