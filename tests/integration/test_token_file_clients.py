"""verl's compute_score (what runs in verl's reward workers, per call) sends the token read from
``$REWARD_SERVER_TOKEN_FILE`` to a server that requires it, and without it is refused: the file
is read on that path too, not only by the trainer's start-up probe."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from reward_server import domain as d
from reward_server.client import RewardCallError
from reward_server.integrations import verl as rverl
from trainer.data.prepare import build_rows, sample_records, to_trl

from .conftest import Running, running_server

TOKEN = "t0ken-file"


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[Running]:
    async with running_server([f"server.auth_token={TOKEN}"]) as r:
        yield r


def extra_info() -> dict[str, Any]:
    rows = to_trl(build_rows(sample_records(history_limit=1)[:1], "personalized_generator",
                             history_limit=1, reward_kind=d.RewardKind.RUBRIC_SCORE))
    info: dict[str, Any] = json.loads(rows[0]["extra_info_json"])
    return info


async def test_verl_compute_score_sends_the_token_from_the_file(
        server: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REWARD_SERVER_TOKEN", raising=False)
    monkeypatch.delenv("REWARD_SERVER_TOKEN_FILE", raising=False)
    try:
        with pytest.raises(RewardCallError) as refused:  # no token: the server requires one
            await rverl.compute_score("src", "I drink coffee", None, extra_info(),
                                      reward_server=server.target, probe_timeout_s=5.0)
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
        path = tmp_path / "token"
        path.write_text(TOKEN + "\n")
        path.chmod(0o600)
        monkeypatch.setenv("REWARD_SERVER_TOKEN_FILE", str(path))
        result = await rverl.compute_score("src", "I drink coffee", None, extra_info(),
                                           reward_server=server.target, probe_timeout_s=5.0)
        assert 0.0 <= result["score"] <= 1.0
    finally:
        await rverl.close_clients()
