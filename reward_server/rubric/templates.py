"""Versioned prompt templates for the judge (rubric evaluator) and the rubric generator.

Judge prompts put the text BEFORE the rubric (docs/parl.md §2): ``JudgePrompt.prefix`` ends right
after the text block, so every rule judged on the same (context, text) shares the same rendered
prefix and its KV cache. Contexts per task follow docs/parl.md §4/§6: Amazon (item title,
description, rating, review title -> review), News (article -> headline), Reddit (summary ->
post content), generic (context -> text).

Changing any wording here changes rewards: bump ``TEMPLATE_VERSION`` and the Literal of
``RubricSettings.template_version`` (reported by ``Info``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reward_server.backends.base import GenerationRequest, JudgePrompt
from reward_server.domain import HistoryItem, Task
from reward_server.rubric.settings import RubricSettings

TEMPLATE_VERSION = "parl-v2"  # RubricSettings.template_version admits exactly this


@dataclass(frozen=True)
class TaskLabels:
    """How one task names its context and its text."""

    context: str  # heading of the context block
    text: str  # heading of the user's text block
    writing: str  # what the user writes, for the generator prompt


TASK_LABELS: dict[Task, TaskLabels] = {
    Task.GENERIC: TaskLabels("Context", "Text", "texts"),
    Task.AMAZON: TaskLabels(
        "Product (item title, description, rating, review title)", "Review", "product reviews"
    ),
    Task.NEWS: TaskLabels("Article", "Headline", "news headlines"),
    Task.REDDIT: TaskLabels("Post summary", "Post content", "Reddit posts"),
}

JUDGE_SYSTEM = (
    "You are an expert evaluator of personalized writing. You are given a {writing_one} "
    "written for a context, and one rubric rule describing how a specific user writes. "
    "Decide whether the {text_lower} satisfies the rule. Answer with a single word: yes or no."
)

# Everything but the rule is in the prefix, so that the rules judged against one text share
# all of it (its KV is computed once per text, see docs/parl.md "Prefix sharing"): the question
# comes before the rule, and the suffix is the rule alone (plus the chat template's closing
# tokens), ~15 tokens instead of ~36 with the question after the rule. The prefix ends on a
# newline and the suffix starts with the rule's first character (rules are stripped): the split
# falls on a pre-tokenizer boundary, so tokens(prefix) + tokens(suffix) equals
# tokens(prefix + suffix) for byte-level BPE tokenizers (the ids engines that tokenize the
# whole prompt, e.g. vLLM, see).
JUDGE_PREFIX = (
    "## {context_label}\n{context}\n\n## {text_label}\n{text}\n\n"
    "## Question\nDoes the {text_lower} above satisfy the rubric rule below? Answer yes or no.\n\n"
    "## Rubric rule\n"
)
JUDGE_SUFFIX = "{rule}"

GENERATOR_SYSTEM = (
    "You are an expert in writing style analysis and personalization. You study the writing "
    "history of one user and write the rubric that tells this user's writing apart from "
    "anyone else's."
)

GENERATOR_USER = """Below are {n} {writing} written by the same user, each with its {context_lower}.

{history}

Write exactly {n_rules} rubric rules that capture HOW this user writes (not WHAT about).
Each rule must be:
- atomic: one single criterion, in one sentence;
- consistent: satisfied by EVERY one of the {writing} above;
- decidable: a reader can answer yes or no for any new text;
- concrete and observable in the text itself (length, structure, punctuation, wording, tone);
- distinctive: typical of this user, not of writing in general.
Spread the rules over different dimensions: style, structure, tone, content focus, lexical habits.

Answer with a bare JSON array and nothing else, in this exact form:
[{{"rule": "<one-sentence criterion>"}}, {{"rule": "<one-sentence criterion>"}}, ...]"""

HISTORY_ITEM = "### Item {i}\n{context_label}: {context}\n{text_label}: {text}"

WRITING_ONE = {
    Task.GENERIC: "text",
    Task.AMAZON: "product review",
    Task.NEWS: "news headline",
    Task.REDDIT: "Reddit post",
}


def template_versions(settings: RubricSettings) -> dict[str, str]:
    """Template family per role, for ``Info`` (provenance)."""
    return {
        "rubric.judge": settings.template_version,
        "rubric.generator": settings.template_version,
    }


def judge_prompt(context: str, text: str, rule: str, task: Task) -> JudgePrompt:
    """The yes/no question 'does ``text`` (written for ``context``) satisfy ``rule``?'."""
    labels = TASK_LABELS[task]
    system = JUDGE_SYSTEM.format(writing_one=WRITING_ONE[task], text_lower=labels.text.lower())
    prefix = JUDGE_PREFIX.format(
        context_label=labels.context,
        context=context.strip() or "(none)",
        text_label=labels.text,
        text=text.strip(),
        text_lower=labels.text.lower(),
    )
    suffix = JUDGE_SUFFIX.format(rule=rule.strip())
    return JudgePrompt(system=system, prefix=prefix, suffix=suffix)


def judge_prompts(context: str, text: str, rules: Sequence[str], task: Task) -> list[JudgePrompt]:
    return [judge_prompt(context, text, r, task) for r in rules]


def render_history(history: Sequence[HistoryItem], task: Task) -> str:
    """The user's history as ``### Item i`` blocks (the generator's and the holistic judge's)."""
    labels = TASK_LABELS[task]
    return "\n\n".join(
        HISTORY_ITEM.format(
            i=i + 1,
            context_label=labels.context,
            context=h.context.strip() or "(none)",
            text_label=labels.text,
            text=h.text.strip(),
        )
        for i, h in enumerate(history)
    )


def generator_request(
    history: Sequence[HistoryItem],
    task: Task,
    settings: RubricSettings,
    *,
    seed: int | None,
    n_rules: int = 10,
) -> GenerationRequest:
    """The rubric generator's prompt over the user's raw history (docs/parl.md §1)."""
    labels = TASK_LABELS[task]
    items = render_history(history, task)
    user = GENERATOR_USER.format(
        n=len(history),
        writing=labels.writing,
        context_lower=labels.context.split(" (")[0].lower(),
        history=items,
        n_rules=n_rules,
    )
    return GenerationRequest(
        system=GENERATOR_SYSTEM,
        user=user,
        max_new_tokens=settings.generation_max_new_tokens,
        temperature=settings.generation_temperature,
        top_p=settings.generation_top_p,
        seed=seed,
    )
