"""NLICV science: constraint verification, regimes, rewards, ablation evidence (docs/nlicv.md)."""

from reward_server.nli.settings import NLISettings
from reward_server.nli.text import split_sentences
from reward_server.nli.verifier import (
    VerifyInput,
    nli_constraints_reward,
    regime_of,
    reward_of,
    template_versions,
    verify,
    verify_batch,
)

__all__ = [
    "NLISettings",
    "VerifyInput",
    "nli_constraints_reward",
    "regime_of",
    "reward_of",
    "split_sentences",
    "template_versions",
    "verify",
    "verify_batch",
]
