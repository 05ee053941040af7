"""Judge-as-NLI: asks the judge LLM whether the premise entails the hypothesis.

WEAKER than a trained NLI cross-encoder (NLICV Table 3: LLM judges reach 27-33% mean accuracy
against 68% for DeBERTa-large, at hundreds of times the cost); for setups with no NLI checkpoint.
S_ent is the judge's p_yes to "Does the premise entail the hypothesis?", with the premise in the
text slot of the prompt (so its prefix is shared across hypotheses) and the hypothesis in the rule
slot. Its ``model_id`` says so: ``judge-as-nli:<judge id>``. Nothing is truncated here (the judge
engine owns its context window); token counts are whitespace words, an approximation used only
by the sentence-window policy.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from reward_server.backends.base import Health, JudgeEngine, JudgePrompt, NLIPair, NLIScore

logger = logging.getLogger(__name__)

SYSTEM = (
    "You are a natural language inference judge. Decide whether the premise entails the "
    "hypothesis: in every situation where the premise is true, the hypothesis is also true. "
    "Answer only yes or no."
)
# The prefix ends on the premise's last character and the suffix starts with the newlines, so
# the split falls on a pre-tokenizer boundary (as in the rubric judge prompt).
PREFIX = "## Premise\n{premise}"
SUFFIX = "\n\n## Hypothesis\n{hypothesis}\n\nDoes the premise entail the hypothesis? Answer yes or no."
TEMPLATE_VERSION = "judge-nli-v2"


def nli_prompt(pair: NLIPair) -> JudgePrompt:
    """The yes/no judge prompt for one (premise, hypothesis) pair."""
    return JudgePrompt(
        system=SYSTEM,
        prefix=PREFIX.format(premise=pair.premise.strip()),
        suffix=SUFFIX.format(hypothesis=pair.hypothesis.strip()),
    )


class JudgeAsNLI:
    """An :class:`NLIEngine` backed by a judge LLM's p_yes (weaker; see module doc)."""

    def __init__(self, judge: JudgeEngine, *, max_length: int = 4096) -> None:
        self._judge = judge
        self._max_length = max_length
        logger.warning("NLI engine is judge-as-NLI on %s: weaker than an NLI cross-encoder", judge.model_id)

    @property
    def model_id(self) -> str:
        return f"judge-as-nli:{self._judge.model_id}"

    @property
    def max_length(self) -> int:
        return self._max_length

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) for t in texts]

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        if not pairs:
            return []
        p_yes = await self._judge.p_yes([nli_prompt(p) for p in pairs])
        return [NLIScore(float(p)) for p in p_yes]

    async def health(self) -> Health:
        return await self._judge.health()

    async def close(self) -> None:
        """The judge is shared and owned by the caller; closing this engine leaves it open."""
        return None
