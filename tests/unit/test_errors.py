"""Engine failures are split into infrastructure (retried) and bugs (not)."""

from __future__ import annotations

import pytest

from reward_server import errors
from reward_server.errors import BackendUnavailable, EngineError, engine_failure, quote


@pytest.mark.parametrize(("exc", "kind"), [
    (IndexError("list index out of range"), EngineError),
    (KeyError("p_yes"), EngineError),
    (ValueError("bad shape"), EngineError),
    (RuntimeError("expected scalar type Float"), EngineError),
    (MemoryError(), BackendUnavailable),
    (ConnectionResetError("peer gone"), BackendUnavailable),
    (BrokenPipeError(), BackendUnavailable),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), BackendUnavailable),
])
def test_classification(exc: Exception, kind: type[Exception]) -> None:
    out = engine_failure(exc, "judge m on 3 prompts")
    assert type(out) is kind and out.__cause__ is exc
    assert str(out).startswith(f"judge m on 3 prompts failed: {type(exc).__name__}")


def test_our_own_errors_pass_through() -> None:
    mine = errors.Overloaded("queue full", retry_after_s=1.0)
    assert engine_failure(mine, "x") is mine


def test_library_out_of_memory_errors_are_infrastructure() -> None:
    torch = pytest.importorskip("torch")
    ray_exceptions = pytest.importorskip("ray.exceptions")
    assert isinstance(engine_failure(torch.OutOfMemoryError("CUDA OOM"), "x"), BackendUnavailable)
    ray_oom = ray_exceptions.OutOfMemoryError("the worker was killed")
    assert isinstance(engine_failure(ray_oom, "x"), BackendUnavailable)


def test_quote_is_bounded() -> None:
    assert quote("abc") == "'abc'"
    q = quote("x" * 10_000)
    assert len(q) < 100 and "(10000 characters)" in q
