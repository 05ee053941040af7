"""Build engines from settings. Heavy engines are imported only when asked for."""

from __future__ import annotations

import logging

from reward_server.backends.base import JudgeEngine, NLIEngine
from reward_server.backends.fake import FakeJudge, FakeNLI
from reward_server.config import JudgeBackendSettings, NLIBackendSettings, RewardServerConfig
from reward_server.errors import ConfigError

logger = logging.getLogger(__name__)


def _set_threads(n: int | None) -> None:
    if n is not None:
        import torch

        torch.set_num_threads(n)
        logger.info("torch intra-op threads set to %d", n)


def build_judge(settings: JudgeBackendSettings) -> JudgeEngine:
    """The judge engine named by ``settings.kind`` (loads its model; may take a while)."""
    logger.info("building judge engine kind=%s model=%s", settings.kind, settings.model)
    if settings.kind == "fake":
        return FakeJudge()
    if settings.kind == "transformers":
        from reward_server.backends.transformers_judge import TransformersJudge

        _set_threads(settings.num_threads)
        return TransformersJudge.from_settings(settings)
    if settings.kind == "vllm":
        from reward_server.backends.vllm_judge import VLLMJudge

        return VLLMJudge.from_settings(settings)
    if settings.kind == "openai":
        from reward_server.backends.openai_judge import OpenAIJudge

        return OpenAIJudge.from_settings(settings)
    raise ConfigError(f"judge.kind={settings.kind!r} is unknown; use fake|transformers|vllm|openai")


def build_nli(settings: NLIBackendSettings, *, judge: JudgeEngine | None = None) -> NLIEngine:
    """The NLI engine named by ``settings.kind``; ``judge`` is needed for kind ``judge``."""
    logger.info("building NLI engine kind=%s model=%s", settings.kind, settings.model)
    if settings.kind == "fake":
        return FakeNLI(max_length=settings.max_length)
    if settings.kind == "transformers":
        from reward_server.backends.transformers_nli import TransformersNLI

        _set_threads(settings.num_threads)
        return TransformersNLI.from_settings(settings)
    if settings.kind == "judge":
        if judge is None:
            raise ConfigError("nli_engine.kind=judge needs a judge engine (set judge.kind)")
        from reward_server.backends.judge_nli import JudgeAsNLI

        return JudgeAsNLI(judge, max_length=settings.max_length)
    raise ConfigError(f"nli_engine.kind={settings.kind!r} is unknown; use fake|transformers|judge")


def coalesced(
    judge: JudgeEngine, nli: NLIEngine, config: RewardServerConfig
) -> tuple[JudgeEngine, NLIEngine]:
    """Wrap in-process engines so concurrent calls merge into batches (coalesce_wait_ms > 0)."""
    from reward_server.backends.batching import CoalescingJudge, CoalescingNLI

    j, n = config.judge, config.nli_engine
    if j.coalesce_wait_ms > 0:
        judge = CoalescingJudge(judge, max_batch=j.coalesce_max_items, max_wait_s=j.coalesce_wait_ms / 1000)
    if n.coalesce_wait_ms > 0:
        nli = CoalescingNLI(nli, max_batch=n.coalesce_max_items, max_wait_s=n.coalesce_wait_ms / 1000)
    return judge, nli
