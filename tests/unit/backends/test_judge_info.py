"""What Info reports of the judge's settings that change its answers (issue 52): the p_yes
read-out and the chat template's thinking switch, for every LLM engine kind."""

from __future__ import annotations

import pytest

from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.backends.settings import (
    FakeJudgeSettings,
    OpenAIJudgeSettings,
    TransformersJudgeSettings,
    VLLMJudgeSettings,
    judge_info,
)
from reward_server.config import load_config
from reward_server.service import RewardService


@pytest.mark.parametrize(
    "settings",
    [
        TransformersJudgeSettings(model="m"),
        VLLMJudgeSettings(model="m", enable_thinking=True),
        OpenAIJudgeSettings(base_url="u", model="m", p_yes_readout="pooled-v1"),
    ],
)
def test_judge_info_reports_readout_and_thinking(settings: object) -> None:
    info = judge_info(settings)  # type: ignore[arg-type]
    assert info == {
        "engines.judge.p_yes_readout": settings.p_yes_readout,  # type: ignore[attr-defined]
        "engines.judge.enable_thinking": str(settings.enable_thinking).lower(),  # type: ignore[attr-defined]
    }
    assert judge_info(FakeJudgeSettings()) == {} and judge_info(None) == {}


def test_default_readout_is_released_and_info_carries_it() -> None:
    config = load_config(overrides=["engines.judge={kind: transformers, model: m}"], env={})
    assert config.engines.judge is not None and config.engines.judge.p_yes_readout == "released"  # type: ignore[union-attr]
    info = RewardService(judge=FakeJudge(), nli=FakeNLI(), engine_info=judge_info(config.engines.judge)).info()
    assert info.settings["engines.judge.p_yes_readout"] == "released"
    assert info.settings["engines.judge.enable_thinking"] == "false"
    with pytest.raises(Exception, match="p_yes_readout"):
        load_config(overrides=["engines.judge={kind: vllm, model: m, p_yes_readout: pooled}"], env={})
