"""The hosting API in process: start_engines builds batched engines from settings, reports
their health (it follows the engines), refuses a config without engines, and stands in for an
engine the caller said it does not need."""

from __future__ import annotations

import pytest

from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.backends.settings import EnginesSettings, FakeJudgeSettings, JudgeNLISettings, fake_engines
from reward_server.errors import ConfigError
from reward_server.serving import ServingSettings, start_engines
from reward_server.serving.batching import BatchedJudge, BatchedNLI


async def test_fake_engines_in_process_are_batched_and_healthy() -> None:
    engines = start_engines(fake_engines(), ServingSettings())
    assert isinstance(engines.judge, BatchedJudge) and isinstance(engines.nli, BatchedNLI)
    assert engines.judge.model_id == "fake-judge" and engines.nli.model_id == "fake-nli"
    health = await engines.health()
    assert health["judge"].ok and health["nli"].ok
    await engines.close()


async def test_health_follows_the_engine_down_and_back() -> None:
    judge, nli = FakeJudge(), FakeNLI()
    engines = start_engines(fake_engines(), ServingSettings(),
                            judge_factory=lambda _s: judge, nli_factory=lambda _s: nli)
    judge.fail_with = RuntimeError("GPU fell off")
    health = await engines.health()
    assert not health["judge"].ok and "GPU fell off" in health["judge"].detail and health["nli"].ok
    judge.fail_with = None
    assert (await engines.health())["judge"].ok


async def test_judge_as_nli_shares_the_batched_judge() -> None:
    judge = FakeJudge()
    engines = start_engines(EnginesSettings(judge=FakeJudgeSettings(), nli=JudgeNLISettings()),
                            ServingSettings(), judge_factory=lambda _s: judge)
    assert engines.nli.model_id == "judge-as-nli:fake-judge"
    judge.fail_with = RuntimeError("down")
    assert not (await engines.health())["nli"].ok  # the NLI engine is the judge


def test_no_engine_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"--fake.*cpu_local\.yaml"):
        start_engines(EnginesSettings(), ServingSettings())


async def test_an_engine_not_required_is_a_stand_in_that_refuses_calls() -> None:
    engines = start_engines(EnginesSettings(judge=FakeJudgeSettings()), ServingSettings(), require=("judge",))
    assert not (await engines.health())["nli"].ok
    with pytest.raises(ConfigError, match=r"engines\.nli is not configured"):
        await engines.nli.entailment([])
