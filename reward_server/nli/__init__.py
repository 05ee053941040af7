"""NLICV science: constraint verification, regimes, rewards, ablation evidence (METHODS §2)."""

from reward_server.nli.settings import NLISettings
from reward_server.nli.text import split_sentences
from reward_server.nli.verifier import (
    VerifyInput,
    interested,
    nli_constraints_reward,
    nli_constraints_rewards,
    regime_of,
    related,
    reward_of,
    template_versions,
    verify,
    verify_batch,
)

__all__ = [
    "NLISettings",
    "VerifyInput",
    "interested",
    "nli_constraints_reward",
    "nli_constraints_rewards",
    "regime_of",
    "related",
    "reward_of",
    "split_sentences",
    "template_versions",
    "verify",
    "verify_batch",
]
