"""The default judge and generator prompts equal what PARL's released code sends (golden/README.md),
and templates parl-v1/parl-v2 still render what they rendered when they were the default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reward_server.domain import Task
from reward_server.rubric import RubricSettings
from reward_server.rubric.released import RELEASED_COMMIT
from reward_server.rubric.settings import TemplateVersion
from reward_server.rubric.templates import generator_request, judge_prompt
from trainer.data.loaders import ContextLabels, load_amazon, load_lamp4, load_longlamp
from trainer.data.records import UserRecord

GOLDEN = Path(__file__).parent / "golden"
ITEMS: dict[str, Any] = json.loads((GOLDEN / "items.json").read_text(encoding="utf-8"))
RULE: str = ITEMS["rule"]
TASKS = ("amazon", "news", "reddit")


def golden(name: str) -> str:
    return (GOLDEN / name).read_text(encoding="utf-8")


def user(task: str, tmp_path: Path, labels: ContextLabels = "released") -> UserRecord:
    """The golden item read by our own loader (its context is what the judge is given)."""
    path = tmp_path / f"{task}.jsonl"
    path.write_text(json.dumps(ITEMS[task]) + "\n", encoding="utf-8")
    if task == "amazon":
        return load_amazon(path, context_labels=labels)[0]
    return (load_lamp4 if task == "news" else load_longlamp)(path)[0]


@pytest.mark.parametrize("task", TASKS)
def test_default_judge_prompt_is_the_released_one(task: str, tmp_path: Path) -> None:
    h = user(task, tmp_path).history[0]
    p = judge_prompt(h.context, h.text, RULE, Task(task))
    assert p.system == golden(f"{task}_judge_system.txt")
    assert p.prefix + p.suffix == golden(f"{task}_judge_user.txt")
    # the rule block is last: everything before the rule is shared by the rules of one text
    assert p.suffix.startswith(RULE) and RULE not in p.prefix


@pytest.mark.parametrize("task", TASKS)
def test_default_generator_prompt_is_the_released_one(task: str, tmp_path: Path) -> None:
    u = user(task, tmp_path)
    req = generator_request(u.history, Task(task), RubricSettings(), seed=None)
    assert req.system == golden(f"{task}_generator_system.txt")
    assert req.user == golden(f"{task}_generator_user.txt")


def test_goldens_name_the_released_commit() -> None:
    assert RELEASED_COMMIT in golden("README.md")


OURS: dict[str, Any] = json.loads((GOLDEN / "ours_v1_v2.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("template", ["parl-v1", "parl-v2"])
@pytest.mark.parametrize("task", TASKS)
def test_earlier_templates_render_as_they_did(template: TemplateVersion, task: str, tmp_path: Path) -> None:
    u = user(task, tmp_path, labels="short")
    h = u.history[0]
    p = judge_prompt(h.context, h.text, RULE, Task(task), template=template)
    want = OURS[f"{template}/{task}"]
    assert [p.system, p.prefix, p.suffix] == want["judge"]
    req = generator_request(u.history, Task(task), RubricSettings(template_version=template), seed=None)
    assert [req.system, req.user] == want["generator"]


@pytest.mark.parametrize("template", ["parl-released", "parl-v1", "parl-v2"])
def test_judge_prompts_are_judge_prompt_per_rule(template: TemplateVersion) -> None:
    """The batch form renders exactly what the one-rule form renders, rule by rule (the
    released one shares one prefix string and the rubric's suffixes among them)."""
    from reward_server.rubric.templates import judge_prompts

    rules = ("Uses short sentences.", "  Mentions a place. ", "Uses the word \x00rule\x00 once.")
    for task in Task:
        for text in ("A text.\nTwo lines.", "Says \x00rule\x00 itself."):
            got = judge_prompts("The context", text, rules, task, template=template)
            assert got == [judge_prompt("The context", text, r, task, template=template) for r in rules]
            again = judge_prompts("Other context", text, rules, task, template=template)
            if template == "parl-released":
                assert all(p.prefix is got[0].prefix for p in got)
                assert [p.suffix for p in again] == [p.suffix for p in got]
