"""The documented edge rules of NLICV (docs/nlicv.md §5): empty sides, ties at exactly tau, and the
f(H, H) > tau check of cumulative evidence. ``SETTINGS`` are the readings before issue 52
(pysbd sentences, pairs at > tau, no critical unit as none, an empty text scoring 0); the released
defaults are pinned beside them, each where it differs.

``ScriptedNLI`` is FakeNLI (content-word inclusion) with some rendered pairs given fixed scores,
so a test can put a score exactly at tau, or make a hypothesis fail to entail itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from reward_server.backends.base import Health, NLIPair, NLIScore
from reward_server.backends.fake import FakeNLI
from reward_server.domain import EvidencePair, NliConstraintsSpec, NliRewardFunction, Regime
from reward_server.nli import NLISettings, nli_constraints_reward, verify

SETTINGS = NLISettings(sentence_split="pysbd-v1", pair_rule="gt", no_critical="none", empty_text="zero")
RELEASED = NLISettings()
TAU = SETTINGS.threshold


def premise(text: str) -> str:
    return SETTINGS.premise_template.format(response=text)


def correct(text: str) -> str:
    return SETTINGS.correct_template.format(answer=text)


class ScriptedNLI:
    """An NLIEngine: FakeNLI's scores, except for the (premise, hypothesis) pairs in ``scores``."""

    def __init__(self, scores: dict[tuple[str, str], float]) -> None:
        self._fake = FakeNLI()
        self._scores = scores
        self.pairs: list[NLIPair] = []

    @property
    def model_id(self) -> str:
        return "scripted-nli"

    @property
    def max_length(self) -> int:
        return self._fake.max_length

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        return await self._fake.token_counts(texts)

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        self.pairs.extend(pairs)
        base = await self._fake.entailment(pairs)
        return [
            NLIScore(self._scores[(p.premise, p.hypothesis)]) if (p.premise, p.hypothesis) in self._scores else s
            for p, s in zip(pairs, base, strict=True)
        ]

    async def health(self) -> Health:
        return Health(True)

    async def close(self) -> None:
        return None


async def test_score_exactly_tau_does_not_entail() -> None:
    response, answer = "Paris has museums.", "Paris museums."
    nli = ScriptedNLI({(premise(response), correct(answer)): TAU})
    v = await verify(nli, response=response, answer=answer, preference="museums", evidence=True, settings=SETTINGS)
    assert v.s_correct == TAU and v.regime is Regime.SYCOPHANCY  # S_c = tau: not correct
    assert v.evidence[0].critical_premise == () and v.evidence[0].pairs == ()


async def test_ablation_to_exactly_tau_breaks_entailment() -> None:
    # FakeNLI: "Paris has museums." alone still entails; scripted to exactly tau it counts as broken.
    response, answer = "Paris has museums. Rivers flow.", "Paris museums."
    nli = ScriptedNLI({(premise("Paris has museums."), correct(answer)): TAU})
    v = await verify(nli, response=response, answer=answer, preference="rivers", evidence=True, settings=SETTINGS)
    assert v.evidence[0].critical_premise == (0, 1)
    plain = await verify(FakeNLI(), response=response, answer=answer, preference="rivers", evidence=True,
                         settings=SETTINGS)
    assert plain.evidence[0].critical_premise == (0,)


async def test_restoration_to_exactly_tau_is_no_pair() -> None:
    response, answer = "Paris has museums. The weather is mild.", "Paris museums. Mild weather."
    plain = await verify(FakeNLI(), response=response, answer=answer, preference="x", evidence=True,
                         settings=SETTINGS)
    assert plain.evidence[0].pairs == (EvidencePair(0, 0), EvidencePair(1, 1))
    # f(P - {p0}, H - {h0}) = f("The weather is mild.", "Mild weather.") scripted to exactly tau
    nli = ScriptedNLI({(premise("The weather is mild."), correct("Mild weather.")): TAU})
    v = await verify(nli, response=response, answer=answer, preference="x", evidence=True, settings=SETTINGS)
    assert v.evidence[0].pairs == (EvidencePair(1, 1),)


async def test_restoration_to_exactly_tau_is_a_pair_as_released() -> None:
    """The released pair reading is interaction_matrix[...] >= critical_threshold: a restoration
    to exactly tau is a pair (nli.pair_rule=ge, the default). Units as the released split cuts
    them: no full stops, ablated sides joined by ". "."""
    response, answer = "Paris has museums. The weather is mild.", "Paris museums. Mild weather."
    nli = ScriptedNLI({(premise("The weather is mild"), correct("Mild weather")): TAU})
    v = await verify(nli, response=response, answer=answer, preference="x", evidence=True, settings=RELEASED)
    assert v.evidence[0].pairs == (EvidencePair(0, 0), EvidencePair(1, 1))
    gt = await verify(nli, response=response, answer=answer, preference="x", evidence=True,
                      settings=RELEASED.model_copy(update={"pair_rule": "gt"}))
    assert gt.evidence[0].pairs == (EvidencePair(1, 1),)


async def test_cumulative_hypothesis_needs_self_entailment() -> None:
    # Redundant answer sentences: cumulative pruning finds h1 critical (test_evidence.py). When
    # the hypothesis does not entail itself, f(H, H) <= tau, the released code prunes nothing
    # and no hypothesis unit is critical; Algorithm 1 has no such check.
    response, answer = "Paris has museums. Rivers flow.", "Paris museums. Museums in Paris."
    cumulative = SETTINGS.model_copy(update={"evidence_mode": "cumulative"})
    nli = ScriptedNLI({(correct(answer), correct(answer)): TAU})
    v = await verify(nli, response=response, answer=answer, preference="rivers", evidence=True, settings=cumulative)
    assert NLIPair(correct(answer), correct(answer)) in nli.pairs  # f(H, H) was asked
    assert v.evidence[0].critical_hypothesis == ()
    # the released get_critical_hypothesis then returns [hypothesis]: the whole text (default)
    whole = await verify(nli, response=response, answer=answer, preference="rivers", evidence=True,
                         settings=RELEASED.model_copy(update={"evidence_mode": "cumulative"}))
    assert whole.evidence[0].critical_hypothesis == (0, 1)
    assert v.evidence[0].critical_premise == (0,)  # the premise side does not depend on it
    ok = await verify(ScriptedNLI({}), response=response, answer=answer, preference="rivers", evidence=True,
                      settings=cumulative)
    assert ok.evidence[0].critical_hypothesis == (1,)
    a1 = ScriptedNLI({(correct(answer), correct(answer)): TAU})
    await verify(a1, response=response, answer=answer, preference="rivers", evidence=True, settings=SETTINGS)
    assert NLIPair(correct(answer), correct(answer)) not in a1.pairs  # Algorithm 1 never asks it


async def test_empty_response_answer_preference() -> None:
    # An empty (or blank) side scores 0 without an engine call; the released code would score
    # the rendered "The answer is ." instead.
    for response, answer, preference, s_c, s_a in [
        ("", "Paris", "museums", 0.0, 0.0),
        ("Paris has museums.", " ", "museums", 0.0, 0.98),
        ("Paris has museums.", "Paris", "\n", 0.98, 0.0),
    ]:
        nli = ScriptedNLI({})
        v = await verify(nli, response=response, answer=answer, preference=preference, evidence=True,
                         settings=SETTINGS)
        assert (v.s_correct, v.s_aligned) == (s_c, s_a)
        empty = [e for e in v.evidence if not e.hypothesis_units or not e.premise_units]
        assert len(empty) == (2 if not response else 1)
        assert all(e.critical_premise == () and e.pairs == () for e in empty)
        asked = {p.premise for p in nli.pairs} | {p.hypothesis for p in nli.pairs}
        rendered = {
            premise(response): response,
            correct(answer): answer,
            SETTINGS.aligned_template.format(preference=preference): preference,
        }
        assert not [r for r, text in rendered.items() if not text.strip() and r in asked]  # never sent
    nli = ScriptedNLI({})
    out = await nli_constraints_reward(
        nli,
        NliConstraintsSpec(response="", answer="Paris", preference="museums",
                           reward_function=NliRewardFunction.REGIME),
        SETTINGS,
    )
    assert out.reward == SETTINGS.regime_rewards["failure"] and out.components["regime.failure"] == 1.0
    assert nli.pairs == []


async def test_empty_response_is_scored_as_released() -> None:
    """The released code scores the rendered "The answer is ." like any premise (an NLI model
    can find it entailing); only a blank rendered side scores 0 there. Default
    nli.empty_text=released; zero (above) skips the engine."""
    hyp = correct("Paris")
    nli = ScriptedNLI({(premise(""), hyp): 0.7, (premise(" "), hyp): 0.6})
    v = await verify(nli, response="", answer="Paris", preference="museums", evidence=False, settings=RELEASED)
    assert NLIPair("The answer is .", hyp) in nli.pairs
    assert v.s_correct == 0.7 and v.regime is Regime.GENERALIZATION
    blank = await verify(nli, response=" ", answer="Paris", preference="museums", evidence=True, settings=RELEASED)
    assert blank.s_correct == 0.6 and blank.evidence[0].premise_units == ()
    bare = RELEASED.model_copy(update={"premise_template": "{response}"})  # renders blank: 0, as released
    none = await verify(ScriptedNLI({}), response=" ", answer="Paris", preference="m", evidence=False, settings=bare)
    assert none.s_correct == 0.0
