"""Versioned prompt templates for the judge (rubric evaluator) and the rubric generator.

Three families, selected by ``RubricSettings.template_version`` (reported by ``Info``):

- ``parl-released`` (default): PARL's released wording and block order, per task
  (:mod:`reward_server.rubric.released`): role, task and "answer yes or no" in the system
  message; the user message is the context block, the text block and the rule block LAST.
- ``parl-v1``: our earlier wording, rule then question (kept to reproduce its runs).
- ``parl-v2``: our earlier wording, question then rule (kept to reproduce its runs).

In every family the rule comes after the text, so ``JudgePrompt.prefix`` (everything before the
rule, or before the rule block for v1) is shared by every rule judged on the same (context,
text) and its KV is computed once (docs/parl.md §2). Contexts per task follow docs/parl.md §6:
Amazon (item title, description, rating, review title -> review), News (article -> headline),
Reddit (summary -> post content), generic (context -> text).

Changing any wording here changes rewards: add a version to ``TemplateVersion`` instead of
editing one (the goldens in tests/unit/rubric/golden/ and the exactness table of docs/parl.md
are tied to the default).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from reward_server.backends.base import GenerationRequest, JudgePrompt
from reward_server.domain import HistoryItem, Task
from reward_server.rubric import released
from reward_server.rubric.settings import TEMPLATE_VERSIONS, RubricSettings, TemplateVersion

DEFAULT_TEMPLATE: TemplateVersion = "parl-released"


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
JUDGE_PREFIX_V2 = (
    "## {context_label}\n{context}\n\n## {text_label}\n{text}\n\n"
    "## Question\nDoes the {text_lower} above satisfy the rubric rule below? Answer yes or no.\n\n"
    "## Rubric rule\n"
)
JUDGE_SUFFIX_V2 = "{rule}"

# parl-v1: the prefix ends on the text's last character and the suffix starts with the newlines
# (also a pre-tokenizer boundary); the question after the rule is not shared.
JUDGE_PREFIX_V1 = "## {context_label}\n{context}\n\n## {text_label}\n{text}"
JUDGE_SUFFIX_V1 = (
    "\n\n## Rubric rule\n{rule}\n\nDoes the {text_lower} above satisfy the rubric rule? Answer yes or no."
)

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

HISTORY_ITEM = "### {heading} {i}\n{context_label}: {context}\n{text_label}: {text}"

WRITING_ONE = {
    Task.GENERIC: "text",
    Task.AMAZON: "product review",
    Task.NEWS: "news headline",
    Task.REDDIT: "Reddit post",
}


_PROBE = (
    (HistoryItem("Probe context {x}\n", " Probe text, two lines.\nSecond line. "), HistoryItem("", "Other text.")),
    " The text uses the word \"probe\". ",
)


@functools.cache
def template_digest(template: TemplateVersion) -> str:
    """12 hex digits of sha256 over what ``template`` renders for a fixed probe (every task's
    judge and generator prompts): it changes whenever a wording, block order or fill rule does.
    docs/parl.md records the digest its exactness table was measured with."""
    history, rule = _PROBE
    settings = RubricSettings(template_version=template)
    parts: list[str] = []
    for task in Task:
        j = judge_prompt(history[0].context, history[0].text, rule, task, template=template)
        g = generator_request(history, task, settings, seed=None)
        parts += [j.system, j.prefix, j.suffix, g.system, g.user]
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:12]


def template_versions(settings: RubricSettings) -> dict[str, str]:
    """Template family per role and the switches that change what the judge sees or how its
    answers count, for ``Info`` (provenance)."""
    return {
        "rubric.judge": settings.template_version,
        "rubric.generator": settings.template_version,
        "rubric.template_digest": template_digest(settings.template_version),
        "rubric.parser": settings.parser_in_use,
        "rubric.induction_validation": settings.induction_validation_in_use,
        "rubric.threshold_rule": settings.threshold_rule,
        "rubric.text_cleaning": settings.text_cleaning,
        "rubric.released_target_overwrite": str(settings.released_target_overwrite).lower(),
    }


def judge_prompt(
    context: str, text: str, rule: str, task: Task, *, template: TemplateVersion = DEFAULT_TEMPLATE
) -> JudgePrompt:
    """The yes/no question 'does ``text`` (written for ``context``) satisfy ``rule``?'.

    ``parl-released`` inserts context, text and rule as given (the released code does not
    strip); ``parl-v1``/``parl-v2`` strip them and write ``(none)`` for an empty context."""
    if template == "parl-released":
        system, prefix, suffix = released.judge_messages(context, text, rule, task)
        return JudgePrompt(system=system, prefix=prefix, suffix=suffix)
    if template not in ("parl-v1", "parl-v2"):
        raise ValueError(f"unknown template version {template!r}; expected one of {TEMPLATE_VERSIONS}")
    labels = TASK_LABELS[task]
    system = JUDGE_SYSTEM.format(writing_one=WRITING_ONE[task], text_lower=labels.text.lower())
    fields = {
        "context_label": labels.context,
        "context": context.strip() or "(none)",
        "text_label": labels.text,
        "text": text.strip(),
        "text_lower": labels.text.lower(),
        "rule": rule.strip(),
    }
    pre, suf = (JUDGE_PREFIX_V1, JUDGE_SUFFIX_V1) if template == "parl-v1" else (JUDGE_PREFIX_V2, JUDGE_SUFFIX_V2)
    return JudgePrompt(system=system, prefix=pre.format(**fields), suffix=suf.format(**fields))


def judge_prompts(
    context: str, text: str, rules: Sequence[str], task: Task, *, template: TemplateVersion = DEFAULT_TEMPLATE
) -> list[JudgePrompt]:
    """``judge_prompt`` for each of ``rules`` (the same strings). The released template renders
    its frame once per text and its suffixes once per rubric (:func:`_suffixes`): a 1,024-item
    x 64-rule request held one prefix and one suffix string per judgment (tracemalloc, with
    18,752 of its 65,536 prompts built: 4.5 MiB of prefixes, 2.4 MiB of suffixes), which left
    the server's small-object arenas that much larger after the call."""
    if template == "parl-released":
        system, prefix, after = released.judge_frame(context, text, task)
        return [JudgePrompt(system=system, prefix=prefix, suffix=s) for s in _suffixes(tuple(rules), after)]
    return [judge_prompt(context, text, r, task, template=template) for r in rules]


@functools.lru_cache(maxsize=4)
def _suffixes(rules: tuple[str, ...], after: str) -> tuple[str, ...]:
    """``rule + after`` for each rule: the items of one request mostly share one user's rubric,
    so their judgments share these strings. Bounded: 4 rubrics, each within
    ``service.limits.max_item_bytes``."""
    return tuple(r + after for r in rules)


def render_history(history: Sequence[HistoryItem], task: Task, *, heading: str = "Item") -> str:
    """The user's history as ``### Item i`` blocks (the generator's and the holistic judge's;
    the trainer's personalized-generator prompt calls them ``### Example i``)."""
    labels = TASK_LABELS[task]
    return "\n\n".join(
        HISTORY_ITEM.format(
            heading=heading,
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
    """The rubric generator's prompt over the user's raw history (docs/parl.md §1).

    ``history`` is used as given (callers window it). ``n_rules`` applies to parl-v1/v2; the
    released prompt asks for 10 in its wording."""
    if settings.template_version == "parl-released":
        system, user = released.generator_messages(history, task)
    else:
        labels = TASK_LABELS[task]
        system = GENERATOR_SYSTEM
        user = GENERATOR_USER.format(
            n=len(history),
            writing=labels.writing,
            context_lower=labels.context.split(" (")[0].lower(),
            history=render_history(history, task),
            n_rules=n_rules,
        )
    return GenerationRequest(
        system=system,
        user=user,
        max_new_tokens=settings.generation_max_new_tokens,
        temperature=settings.generation_temperature,
        top_p=settings.generation_top_p,
        top_k=settings.generation_top_k,
        enable_thinking=settings.generation_enable_thinking,
        seed=seed,
    )
