"""What the hosting API hands out: :class:`Engines` (the two engines, their health, their
shutdown), the engine factory types, and the stand-in for an engine a config does not name.
:func:`reward_server.serving.start_engines` builds them from the :class:`RawEngines` a host
(in-process or Ray) returns."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from reward_server.backends.base import (
    GenerationRequest,
    Health,
    JudgeEngine,
    JudgePrompt,
    NLIEngine,
    NLIPair,
    NLIScore,
)
from reward_server.backends.settings import EnginesSettings, JudgeSettings, NLIEngineSettings
from reward_server.errors import ConfigError

logger = logging.getLogger(__name__)

JudgeFactory = Callable[[JudgeSettings], JudgeEngine]
NLIFactory = Callable[[NLIEngineSettings], NLIEngine]
EngineName = Literal["judge", "nli"]


@dataclass(frozen=True)
class RawEngines:
    """What a host returns: each engine as it runs, before the one batching stage
    :func:`~reward_server.serving.start_engines` puts in front of it.

    ``judge`` / ``nli``: None where the config names none (``nli`` also for judge-as-NLI, which
    is built on the batched judge). ``judge_in_flight`` / ``nli_in_flight``: the host's default
    for ``batching.max_in_flight`` (None: no limit)."""

    judge: JudgeEngine | None
    nli: NLIEngine | None
    judge_in_flight: int | None = None
    nli_in_flight: int | None = None


class Engines:
    """The two engines as the service sees them, their health, and their shutdown."""

    mode = "inprocess"

    def __init__(self, *, judge: JudgeEngine, nli: NLIEngine) -> None:
        self.judge = judge
        self.nli = nli
        self._closed = False

    async def health(self) -> dict[EngineName, Health]:
        """Each engine's health (a failing check counts as down, with the error as detail)."""
        names: tuple[EngineName, ...] = ("judge", "nli")
        checks = await asyncio.gather(self.judge.health(), self.nli.health(), return_exceptions=True)
        out: dict[EngineName, Health] = {}
        for name, h in zip(names, checks, strict=True):
            out[name] = h if isinstance(h, Health) else Health(False, f"{type(h).__name__}: {h}")
        return out

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.judge.close()
        await self.nli.close()


ENGINE_CHOICES = (
    "choose one: `--fake` (deterministic fakes, not a model), `-c deploy/cpu_local.yaml` "
    "(SmolLM2 on CPU), a GPU config such as `-c deploy/reward_server_config.yaml`, or set "
    "engines.judge.kind / engines.nli.kind yourself"
)


class Unconfigured:
    """Stands in for an engine the configuration does not name (allowed only where the caller
    said it does not need it, e.g. ``eval nli`` needs no judge): every call raises ConfigError."""

    def __init__(self, name: EngineName) -> None:
        self._name = name

    @property
    def model_id(self) -> str:
        return f"(no {self._name} engine)"

    @property
    def max_length(self) -> int:
        return 0

    def _refuse(self) -> ConfigError:
        return ConfigError(f"engines.{self._name} is not configured; {ENGINE_CHOICES}")

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        raise self._refuse()

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        raise self._refuse()

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        raise self._refuse()

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        raise self._refuse()

    async def health(self) -> Health:
        return Health(False, f"engines.{self._name} is not configured")

    async def close(self) -> None:
        return None


def missing_engines(engines: EnginesSettings, require: Sequence[EngineName]) -> str | None:
    """The error message when a required engine is not configured, else None."""
    missing = [n for n in require if getattr(engines, n) is None]
    if not missing:
        return None
    return f"no engine configured for {', '.join('engines.' + m for m in missing)}; {ENGINE_CHOICES}"
