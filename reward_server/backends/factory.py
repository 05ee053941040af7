"""Build one engine from its settings. Heavy engines are imported only when asked for.

The hosting layer (:mod:`reward_server.serving`) calls these in the server process or inside a
Ray Serve replica; nothing else builds engines. A model loaded by name is checked first
(:func:`reward_server.backends.hub.check_model_source`): one that cannot be had fails in
seconds with the fix, not after the hub's minute of retries.
"""

from __future__ import annotations

import logging

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.backends.settings import (
    FakeJudgeSettings,
    FakeNLISettings,
    JudgeNLISettings,
    JudgeSettings,
    NLIEngineSettings,
    OpenAIJudgeSettings,
    TransformersJudgeSettings,
    TransformersNLISettings,
    VLLMJudgeSettings,
)
from reward_server.errors import ConfigError

logger = logging.getLogger(__name__)


def check_judge_source(settings: JudgeSettings) -> str | None:
    """What :func:`build_judge` checks before it loads anything: the model can be had here.
    Returns the folder to load it from instead of its name (its cached copy, the hub being
    unreachable), else None."""
    from reward_server.backends.hub import check_model_source
    from reward_server.backends.smollm2 import LOCAL_MODEL_ALIAS

    if isinstance(settings, TransformersJudgeSettings | VLLMJudgeSettings) and settings.model != LOCAL_MODEL_ALIAS:
        return check_model_source(settings.model, setting="engines.judge.model")
    return None


def check_nli_source(settings: NLIEngineSettings) -> str | None:
    """What :func:`build_nli` checks before it loads anything (as :func:`check_judge_source`)."""
    from reward_server.backends.hub import check_model_source

    if isinstance(settings, TransformersNLISettings):
        return check_model_source(settings.model, setting="engines.nli.model")
    return None


def build_judge(settings: JudgeSettings) -> JudgeEngine:
    """The judge engine named by ``settings.kind`` (loads its model; may take a while)."""
    logger.info("building judge engine kind=%s", settings.kind)
    if isinstance(settings, FakeJudgeSettings):
        return FakeJudge(latency_s=settings.latency_s, model_id=settings.model_id)
    if isinstance(settings, TransformersJudgeSettings):
        load_from = check_judge_source(settings)
        from reward_server.backends.transformers_judge import TransformersJudge

        return TransformersJudge.from_settings(settings, load_from=load_from)
    if isinstance(settings, VLLMJudgeSettings):
        load_from = check_judge_source(settings)
        from reward_server.backends.vllm_judge import VLLMJudge

        return VLLMJudge.from_settings(settings, load_from=load_from)
    if isinstance(settings, OpenAIJudgeSettings):
        from reward_server.backends.openai_judge import OpenAIJudge

        return OpenAIJudge.from_settings(settings)
    raise ConfigError(f"engines.judge.kind={settings.kind!r} is unknown")  # pragma: no cover


def build_nli(settings: NLIEngineSettings, *, judge: JudgeEngine | None = None) -> NLIEngine:
    """The NLI engine named by ``settings.kind``; kind ``judge`` wraps ``judge``."""
    logger.info("building NLI engine kind=%s", settings.kind)
    if isinstance(settings, FakeNLISettings):
        return FakeNLI(
            max_length=settings.max_length, latency_s=settings.latency_s, model_id=settings.model_id
        )
    if isinstance(settings, TransformersNLISettings):
        load_from = check_nli_source(settings)
        from reward_server.backends.transformers_nli import TransformersNLI

        return TransformersNLI.from_settings(settings, load_from=load_from)
    if isinstance(settings, JudgeNLISettings):
        if judge is None:
            raise ConfigError("engines.nli.kind=judge needs a judge engine (set engines.judge)")
        from reward_server.backends.judge_nli import JudgeAsNLI

        return JudgeAsNLI(judge, max_length=settings.max_length)
    raise ConfigError(f"engines.nli.kind={settings.kind!r} is unknown")  # pragma: no cover
