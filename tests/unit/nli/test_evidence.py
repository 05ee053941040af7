"""Ablation evidence (Algorithms 1 and 2) on FakeNLI, where entailment is content-word inclusion.

Most cases run the readings of this project before issue 52 (``v1``: pysbd sentences, pairs at
> tau, no critical unit reported as none); the released readings, the defaults, are pinned at
the end, each with a case where it differs."""

from __future__ import annotations

from reward_server.backends.fake import FakeNLI
from reward_server.domain import EvidencePair
from reward_server.nli import NLISettings, verify


def v1(**kw: object) -> NLISettings:
    """The evidence readings before issue 52 (named switches)."""
    return NLISettings(sentence_split="pysbd-v1", pair_rule="gt", no_critical="none", empty_text="zero", **kw)  # type: ignore[arg-type]


async def test_several_pairs_known_exactly() -> None:
    # premise units: p0 {paris, museums}, p1 {rivers, flow}, p2 {weather, mild}
    # answer units:  h0 {paris, museums}, h1 {mild, weather}
    nli = FakeNLI()
    v = await verify(
        nli,
        response="Paris has museums. Rivers flow. The weather is mild.",
        answer="Paris museums. Mild weather.",
        preference="rivers",
        evidence=True,
        settings=v1(),
    )
    correct, aligned = v.evidence
    assert correct.constraint == "correct" and correct.score == 0.98
    assert correct.premise_units == ("Paris has museums.", "Rivers flow.", "The weather is mild.")
    assert correct.hypothesis_units == ("Paris museums.", "Mild weather.")
    assert correct.critical_premise == (0, 2)  # p1 is redundant
    assert correct.critical_hypothesis == (0, 1)  # neither answer sentence implies the other
    # removing p0 loses {paris, museums}; dropping h0 restores entailment (and not h1)
    assert correct.pairs == (EvidencePair(0, 0), EvidencePair(2, 1))
    # aligned: one-sentence hypothesis is critical by definition; only p1 carries "rivers"
    assert aligned.critical_premise == (1,)
    assert aligned.critical_hypothesis == (0,)
    assert aligned.pairs == (EvidencePair(1, 0),)  # empty hypothesis: tautology, restored
    assert nli.batch_sizes and len(nli.batch_sizes) == 1  # the whole request in one pass


async def test_one_sentence_premise_is_critical() -> None:
    v = await verify(
        FakeNLI(),
        response="Paris is nice.",
        answer="Paris",
        preference="Rome",
        evidence=True,
        settings=v1(),
    )
    correct, aligned = v.evidence
    assert (correct.critical_premise, correct.critical_hypothesis) == ((0,), (0,))
    assert correct.pairs == (EvidencePair(0, 0),)
    # a constraint that is not satisfied has no critical premise unit and no pair
    assert (aligned.score, aligned.critical_premise, aligned.pairs) == (0.02, (), ())
    assert aligned.critical_hypothesis == (0,)


async def test_redundant_premise_algorithm1_vs_cumulative() -> None:
    # Both sentences say "paris": Algorithm 1 removes one at a time from the full premise, so
    # neither is critical. The released code's cumulative pruning keeps p0 removed once it is
    # found redundant, so removing p1 next leaves nothing: p1 becomes critical.
    args = {"response": "Paris is here. Paris is big.", "answer": "Paris", "preference": "big"}
    nli = FakeNLI()
    a1 = await verify(nli, **args, evidence=True, settings=v1())
    assert a1.evidence[0].critical_premise == ()
    assert a1.evidence[0].pairs == ()
    nli_c = FakeNLI()
    cu = await verify(nli_c, **args, evidence=True, settings=v1(evidence_mode="cumulative"))
    assert cu.evidence[0].critical_premise == (1,)
    # Algorithm 2's guard: removing p1 alone still entails, so p1 pairs with nothing
    assert cu.evidence[0].pairs == ()
    assert cu.evidence[1].critical_premise == (1,)  # "big" only in p1: same in both modes
    assert a1.evidence[1].critical_premise == (1,)
    assert len(nli_c.batch_sizes) <= 1 + 2


async def test_cumulative_extra_pass_when_ablation_is_new() -> None:
    # answer == preference: the two constraints share every query (pass one: 4 distinct pairs).
    # i=0: P-{0} entails (p1 says paris): prune p0 (already scored in pass one, no call);
    # i=1: P-{0,1} = "Rome is far." is new: one pass, fails -> p1 critical;
    # i=2: P-{0,2} = "Paris is big." is new: one pass, entails -> pruned.
    nli = FakeNLI()
    v = await verify(
        nli,
        response="Paris is here. Paris is big. Rome is far.",
        answer="Paris",
        preference="Paris",
        evidence=True,
        settings=v1(evidence_mode="cumulative"),
    )
    assert v.evidence[0].critical_premise == (1,)
    assert list(nli.batch_sizes) == [4, 1, 1]


async def test_redundant_hypothesis_algorithm1_vs_cumulative() -> None:
    # Both answer sentences carry {paris, museums}: under Algorithm 1 the rest of the hypothesis
    # still entails it whichever sentence is removed, so neither is critical. The released
    # code's pruning (the hypothesis entails itself, f(H, H) > tau) keeps h0 removed once it is
    # found redundant, so removing h1 next leaves nothing: h1 becomes critical.
    args = {
        "response": "Paris has museums. Rivers flow.",
        "answer": "Paris museums. Museums in Paris.",
        "preference": "rivers",
    }
    a1 = await verify(FakeNLI(), **args, evidence=True, settings=v1())
    nli_c = FakeNLI()
    cu = await verify(nli_c, **args, evidence=True, settings=v1(evidence_mode="cumulative"))
    assert a1.evidence[0].critical_hypothesis == ()
    assert cu.evidence[0].critical_hypothesis == (1,)
    # the premise side agrees here: p0 carries the answer, p1 does not
    assert a1.evidence[0].critical_premise == cu.evidence[0].critical_premise == (0,)
    # one-sentence preference: critical in both modes, with no f(H, H) check
    assert a1.evidence[1].critical_hypothesis == cu.evidence[1].critical_hypothesis == (0,)
    # pass 1: Algorithm 1's queries and f(H, H); pass 2: premise step 0 was already scored,
    # the hypothesis step 0 too (H - {h0}); position 1: P - {p1} known, H - {h0, h1} is empty.
    assert len(nli_c.batch_sizes) == 1


# ------------------------------------------------------------------- released readings (defaults)
async def test_released_split_on_full_stops() -> None:
    """The released code splits on "." (re.split, pieces stripped): "Dr. Smith" is two units and
    a sentence ending in "!" or "?" is not cut; ablated sides are joined by ". "."""
    args = {"response": "Dr. Smith visits Paris! It has museums. Rivers flow.", "answer": "Paris museums",
            "preference": "rivers"}
    nli = FakeNLI()
    released = await verify(nli, **args, evidence=True, settings=NLISettings())
    assert released.evidence[0].premise_units == ("Dr", "Smith visits Paris! It has museums", "Rivers flow")
    before = await verify(FakeNLI(), **args, evidence=True, settings=v1())
    assert before.evidence[0].premise_units == ("Dr. Smith visits Paris!", "It has museums.", "Rivers flow.")
    # P without unit 1, as the released get_critical_premise joins the rest: "Dr. Rivers flow"
    assert released.evidence[0].critical_premise == (1,)


async def test_released_reports_the_whole_text_when_nothing_is_critical() -> None:
    """Redundant sentences: no single removal breaks entailment. The released code then returns
    the text itself as the critical "sentence": every unit is reported; v1 reported none. A
    constraint that fails: the released code still returns its text (a one-sentence premise is
    critical even then)."""
    args = {"response": "Paris is here. Paris is big.", "answer": "Paris", "preference": "Rome"}
    released = await verify(FakeNLI(), **args, evidence=True, settings=NLISettings())
    before = await verify(FakeNLI(), **args, evidence=True, settings=v1())
    assert released.evidence[0].critical_premise == (0, 1) and before.evidence[0].critical_premise == ()
    assert released.evidence[1].score == 0.02  # Aligned fails: the whole premise all the same
    assert released.evidence[1].critical_premise == (0, 1) and before.evidence[1].critical_premise == ()
    one = await verify(FakeNLI(), response="Paris is nice.", answer="Paris", preference="Rome", evidence=True,
                       settings=NLISettings())
    assert one.evidence[1].critical_premise == (0,)
