"""score_rubric aggregates, prompt templates and induction tie-breaking on FakeJudge."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from reward_server.backends.fake import FakeJudge, text_and_rule
from reward_server.domain import HistoryItem, RubricAggregate, RubricScoreSpec, Task
from reward_server.rubric import RubricSettings, induce_rubrics, score_rubric, template_versions
from reward_server.rubric.settings import TEMPLATE_VERSIONS, TemplateVersion
from reward_server.rubric.templates import generator_request, judge_prompt, template_digest

RA = 'The text uses the word "alpha".'
RB = 'The text uses the word "beta".'
RC = 'The text uses both "alpha" and "zeta".'  # 0.5 on "alpha beta": not satisfied


@pytest.mark.parametrize(
    ("aggregate", "expected"),
    [
        (None, (0.98 + 0.98 + 0.5) / 3),  # server default: mean p_yes
        (RubricAggregate.MEAN_P_YES, (0.98 + 0.98 + 0.5) / 3),
        (RubricAggregate.FRACTION_SATISFIED, 2 / 3),
        (RubricAggregate.ALL_SATISFIED, 0.0),
    ],
)
async def test_score_rubric_aggregates(aggregate: RubricAggregate | None, expected: float) -> None:
    judge = FakeJudge()
    spec = RubricScoreSpec("ctx", "alpha beta", (RA, RB, RC), Task.NEWS, aggregate)
    out = await score_rubric(judge, spec, RubricSettings())
    assert out.reward == pytest.approx(expected)
    c = out.components
    assert c["n_rules"] == 3 and c["all_satisfied"] == 0.0
    assert c["fraction_satisfied"] == pytest.approx(2 / 3)
    assert [c["p_yes.0"], c["p_yes.1"], c["p_yes.2"]] == pytest.approx([0.98, 0.98, 0.5])
    assert list(judge.batch_sizes) == [3]


async def test_score_rubric_all_satisfied_one() -> None:
    spec = RubricScoreSpec("", "alpha beta", (RA, RB), aggregate=RubricAggregate.ALL_SATISFIED)
    out = await score_rubric(FakeJudge(), spec, RubricSettings())
    assert out.reward == 1.0 and out.policy_invalid is None


async def test_threshold_setting_applies() -> None:
    spec = RubricScoreSpec("", "alpha", (RC,), aggregate=RubricAggregate.FRACTION_SATISFIED)
    out = await score_rubric(FakeJudge(), spec, RubricSettings(threshold=0.4))
    assert out.reward == 1.0


@pytest.mark.parametrize("template", TEMPLATE_VERSIONS)
def test_judge_prompt_text_before_rule_and_prefix_shared(template: TemplateVersion) -> None:
    a = judge_prompt("An article about rain.", "Rain again", RA, Task.NEWS, template=template)
    b = judge_prompt("An article about rain.", "Rain again", RB, Task.NEWS, template=template)
    assert a.system == b.system and a.prefix == b.prefix and a.suffix != b.suffix
    assert a.suffix.startswith(RA) or (template == "parl-v1" and RA in a.suffix)
    assert text_and_rule(a) == ("Rain again", RA)  # what the fake judge reads back
    assert "yes or no" in a.system.replace("`", "")
    for task in Task:
        p = judge_prompt("c", "t", RA, task, template=template)
        assert p.prefix.index("c") < p.prefix.rindex("t") and text_and_rule(p) == ("t", RA)


def test_judge_prompt_layouts() -> None:
    ctx, text = "An article about rain.", "Rain again"
    rel = judge_prompt(ctx, text, RA, Task.NEWS)  # default: the released layout, rule block last
    assert rel.prefix.endswith("<Personalized Evaluation Rubric>\n")
    assert rel.suffix == RA + "\n</Personalized Evaluation Rubric>\n"
    assert rel.prefix.index(ctx) < rel.prefix.index(text) and "`yes` or `no`" in rel.system
    v2 = judge_prompt(ctx, text, RA, Task.NEWS, template="parl-v2")  # question, then the rule alone
    assert v2.suffix == RA and v2.prefix.endswith("## Rubric rule\n")
    assert v2.prefix.index(text) < v2.prefix.index("yes or no")
    v1 = judge_prompt(ctx, text, RA, Task.NEWS, template="parl-v1")  # rule, then the question
    assert v1.prefix.endswith(text) and v1.suffix.index(RA) < v1.suffix.index("yes or no")


def test_generator_prompt_and_versions() -> None:
    s = RubricSettings()
    req = generator_request([HistoryItem("title 1", "great product")], Task.AMAZON, s, seed=7)
    assert "great product" in req.user and '"rule"' in req.system and "10 highly personalized" in req.system
    assert "title 1" not in req.user  # the released Amazon generator sees the review texts only
    assert req.seed == 7 and req.temperature == 0.6 and req.top_p == 0.95
    assert template_versions(s) == {
        "rubric.judge": "parl-released", "rubric.generator": "parl-released", "rubric.parser": "released",
        "rubric.induction_validation": "released", "rubric.threshold_rule": "gt",
        "rubric.template_digest": template_digest("parl-released"), "rubric.text_cleaning": "released",
        "rubric.released_target_overwrite": "false",
    }  # fmt: skip
    assert len({template_digest(t) for t in TEMPLATE_VERSIONS}) == 3
    v1 = RubricSettings(template_version="parl-v1")
    req = generator_request([HistoryItem("title 1", "great product")], Task.AMAZON, v1, seed=7)
    assert "great product" in req.user and "title 1" in req.user and '"rule"' in req.user
    assert template_versions(v1)["rubric.judge"] == "parl-v1" and template_versions(v1)["rubric.parser"] == "lenient"
    with pytest.raises(ValidationError, match="parl-released"):  # refused at load, not per request
        RubricSettings(template_version="parl-v999")  # type: ignore[arg-type]


def test_generator_samples_as_the_released_scripts() -> None:
    """generate-rubrics sends no sampling fields: the vLLM server applies Qwen3's generation
    config (temperature 0.6, top_p 0.95, top_k 20), renders the chat template's own default
    (Qwen3 thinks) and gives the rest of the context. Before issue 52: no top-k, thinking off
    (the judge's switch), 1,024 tokens."""
    req = generator_request([HistoryItem("c", "t")], Task.NEWS, RubricSettings(), seed=0)
    assert (req.top_k, req.enable_thinking, req.max_new_tokens) == (20, None, None)
    assert req.thinking(False) is None  # no switch sent, whatever the judge's
    before = RubricSettings(generation_top_k=None, generation_enable_thinking=False, generation_max_new_tokens=1024)
    old = generator_request([HistoryItem("c", "t")], Task.NEWS, before, seed=0)
    assert (old.top_k, old.thinking(True), old.max_new_tokens) == (None, False, 1024)


HISTORY = (HistoryItem("c1", "alpha beta gamma"), HistoryItem("c2", "alpha beta"))


@pytest.mark.parametrize(("cleaning", "kept"), [("released", (RB,)), ("none", (RA, RB))])
async def test_induction_validates_cleaned_history_texts(cleaning: str, kept: tuple[str, ...]) -> None:
    """generate-rubrics validates each history text after postprocess_output (cut after the
    first </think> and the [Review]:-style markers); none (before issue 52): as written."""
    history = (HistoryItem("c1", "alpha gamma [Review]: beta"), HistoryItem("c2", "<think>alpha</think> beta alpha"))
    s = RubricSettings(text_cleaning=cleaning)  # type: ignore[arg-type]
    res = await induce_rubrics(FakeJudge(scripted=[out(RA, RB)]), history=history, task=Task.NEWS, settings=s,
                               num_samples=1)
    assert res.rules == kept


def out(*rules: str) -> str:
    return json.dumps([{"rule": r} for r in rules])


async def test_induction_keeps_most_survivors_earliest_on_ties() -> None:
    scripted = [
        out(RA, 'Uses "gamma".'),  # 1 survivor (gamma fails item 2); short rule kept (inference)
        out(RA, RB),  # 2 survivors
        out(RB, RA, 'Has "delta".'),  # 2 survivors (tie: the earlier attempt wins)
        "garbage",  # invalid
    ]
    judge = FakeJudge(scripted=scripted)
    res = await induce_rubrics(judge, history=HISTORY, task=Task.REDDIT, settings=RubricSettings(), num_samples=4)
    assert res.best_attempt == 1 and res.rules == (RA, RB) and res.covered
    assert [len(a.valid_rules) for a in res.attempts] == [1, 2, 2, 0]
    assert res.attempts[0].parsed_rules == (RA, 'Uses "gamma".')
    assert res.attempts[3].invalid_reason is not None
    assert list(judge.batch_sizes) == [2 * (2 + 2 + 3)]  # every attempt validated in ONE call

    # seeds seed+i pick scripted[(seed + i) % 4]: seed=2 -> attempts 2, 3, 0, 1 -> best is 0
    res = await induce_rubrics(
        FakeJudge(scripted=scripted),
        history=HISTORY,
        task=Task.REDDIT,
        settings=RubricSettings(),
        num_samples=4,
        seed=2,
    )
    assert res.best_attempt == 0 and res.rules == (RB, RA)


async def test_induction_no_cap_and_uncovered() -> None:
    eleven = out(*[f'Mentions "alpha" number {i}.' for i in range(11)])
    res = await induce_rubrics(
        FakeJudge(scripted=[eleven]), history=HISTORY, task=Task.GENERIC, settings=RubricSettings(), num_samples=1
    )
    assert len(res.rules) == 11  # no cap at inference
    res = await induce_rubrics(
        FakeJudge(scripted=[out('Has "zeta".'), "[]"]),
        history=HISTORY,
        task=Task.GENERIC,
        settings=RubricSettings(induction_samples=2),
    )
    assert len(res.attempts) == 2  # default k from settings
    assert res.best_attempt == -1 and res.rules == () and not res.covered


async def test_induction_default_generator_end_to_end() -> None:
    # Unscripted FakeJudge writes 'The text uses the word "w".' over frequent prompt words.
    history = (HistoryItem("", "wonderful blender works wonderful"), HistoryItem("", "wonderful toaster works"))
    res = await induce_rubrics(FakeJudge(), history=history, task=Task.AMAZON, settings=RubricSettings(), num_samples=2)
    assert res.covered and all("wonderful" in r or "works" in r for r in res.rules)


@pytest.mark.parametrize(("rule", "expected"), [("gt", 0.0), ("ge", 1.0)])
async def test_threshold_rule_decides_a_tie(rule: str, expected: float) -> None:
    undecided = "It is ok."  # no key term: the fake judge answers exactly 0.5
    spec = RubricScoreSpec("", "alpha", (undecided,), aggregate=RubricAggregate.FRACTION_SATISFIED)
    out = await score_rubric(FakeJudge(), spec, RubricSettings(threshold_rule=rule))  # type: ignore[arg-type]
    assert out.components["p_yes.0"] == 0.5 and out.reward == expected


# 12 items; the first two lack "zeta", the last 10 (history_limit) all have it
LONG_HISTORY = (
    *(HistoryItem(f"c{i}", "alpha only") for i in range(2)),
    *(HistoryItem(f"c{i}", "alpha zeta") for i in range(2, 12)),
)
RZ = 'The text uses the word "zeta".'


@pytest.mark.parametrize(
    ("task", "window", "kept"),
    [
        (Task.AMAZON, None, (RA,)),  # released (the default template's): Amazon validates on every item
        (Task.AMAZON, "history_limit", (RA, RZ)),
        (Task.NEWS, None, (RA, RZ)),  # released News/Reddit: the last history_limit
        (Task.REDDIT, "released", (RA, RZ)),
    ],
)
async def test_induction_validation_window(task: Task, window: str | None, kept: tuple[str, ...]) -> None:
    judge = FakeJudge(scripted=[out(RA, RZ)])
    s = RubricSettings(induction_validation=window)  # type: ignore[arg-type]
    res = await induce_rubrics(judge, history=LONG_HISTORY, task=task, settings=s, num_samples=1)
    assert res.rules == kept
    assert list(judge.batch_sizes) == [2 * (12 if task == Task.AMAZON and window is None else 10)]


def test_induction_window_follows_the_template() -> None:
    assert RubricSettings().induction_validation_in_use == "released"
    assert RubricSettings(template_version="parl-v2").induction_validation_in_use == "history_limit"
