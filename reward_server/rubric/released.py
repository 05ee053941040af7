"""PARL's released prompts, verbatim, and how the released code fills them (template ``parl-released``).

Source: github.com/SnowCharmQ/PARL at commit ``a9d91f292457031cd0f6eb700658ffeff5aae9ed``
(Apache-2.0). The judge ("rubrics evaluator") prompts are ``recipe/parl/prompt.py`` (the same
strings are repeated in ``recipe/parl/scripts/<task>/prompt.py``); the rubric generator's are
``recipe/parl/scripts/<task>/prompt.py``. How they are filled (``parl_rm_a.py``,
``scripts/<task>/generate-rubrics-a.py``):

- judge: system = the task's evaluator system prompt; user = its user template with the
  context (Amazon: the ``[Item Title]: ...`` metadata block; News: the article; Reddit: the
  post summary), the text and the rule, each inserted as given (no strip). The rule is the last
  block, so a prompt splits into a prefix shared by every rule judged on one text and a suffix
  that starts with the rule (``JudgePrompt``).
- generator: system = the task's generator system prompt (it asks for 10 rules); user = its
  template over the last ``history_limit`` items: Amazon the review texts alone, each followed
  by a newline, joined by a newline; News ``[News Headline]: ...`` / ``[News Content]: ...``
  pairs and Reddit the post contents, joined by a line of 100 ``=``.

The ``generic`` task (ours, not in the released code) follows the same layout with neutral words.
Checked against renders of the released strings in ``tests/unit/rubric/golden/``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reward_server.domain import HistoryItem, Task

RELEASED_REPO = "github.com/SnowCharmQ/PARL"
RELEASED_COMMIT = "a9d91f292457031cd0f6eb700658ffeff5aae9ed"

# Amazon reviews: recipe/parl/scripts/amazon/prompt.py (generator), recipe/parl/prompt.py (evaluator)
REVIEW_RUBRICS_GENERATOR_SYSTEM_PROMPT = """# Role
You are an expert in Personalization Analysis and Rubric Generation. Your job is to generate a self-contained set of personalized evaluation rubrics based on a user's historical reviews. These rubrics should be used to evaluate whether a newly generated review text matches the user's preferences.

# Input Data
- **User History:** A collection of historical review texts written by the target user.

# Task
Analyze the user's historical reviews from multiple dimensions (e.g., writing style, linguistic features, structure, tone, content focus, expression patterns) and generate 10 highly personalized rubrics that cover different aspects of the user's preferences.

# Drafting Rules
- **Atomicity:** Each rubric should be a single, clear and self-contained criterion that can be used to evaluate a review text independently. It should not require context from other rubrics or external information to be meaningful. Avoid combining multiple criteria into one rubric, as this makes evaluation ambiguous and reduces clarity.
- **Consistency**: Each rubric should reflect a consistent pattern identified across all the user's historical reviews. Each rubric must be satisfied when applied to all reviews in the user's profile. Avoid rubrics that only match a subset of the user's historical reviews, as they do not represent consistent patterns across the user's preferences.
- **Determinism:** Each rubric should be unambiguous and objectively evaluable, allowing for clear yes/no judgments rather than vague or subjective assessments. When applied to a review text, evaluators should be able to determine whether the rubric is satisfied without relying on personal interpretation or probabilistic reasoning. 
- **Specificity:** Each rubric should be specific to a concrete, observable feature. Instead of vague statements like "matches writing style", provide precise characteristics such as "uses short, fragmented sentences without punctuation" or "prefers active voice over passive voice". 
- **Item-Agnosticism:** Each rubric should be applicable to *any* future review of *any* item, not just the specific items in the user's history. Focus on *how* the user writes reviews (their writing style, structure, tone, linguistic patterns) rather than *what* items they reviewed (specific items, events, or subject matter). The rubrics should capture transferable writing characteristics that persist across different review contexts.
- **Multi-Dimensionality:** The set of rubrics should collectively cover multiple dimensions of the user's writing characteristics, such as writing style (sentence structure, paragraph organization), linguistic features (vocabulary choice, grammar patterns), tone (formality, emotional expression), content focus (what aspects are emphasized), and expression patterns (how ideas are conveyed). Avoid generating rubrics that all focus on the same dimension; instead, ensure diversity across different aspects of the user's preferences.
- **Personalization:** Each rubric should be personalized to the target user's historical reviews, capturing their unique writing characteristics and preferences. Each rubric should reflect something distinctive about this specific user's writing style that distinguishes them from other users. Generic rubrics that could apply to any user should be avoided; the rubrics must be tailored to reveal this particular user's preferences.

# Output Format
Provide a JSON array of objects. Each object must contain exactly one key: `rule`.
Example: 
[
    {"rule": "The review uses long, complex sentences with multiple clauses and sophisticated vocabulary, avoiding simplistic or fragmented phrasing."},
    {"rule": "The review maintains a formal, essay-like tone with structured paragraphs, each focusing on a distinct analytical point or thematic thread."},
    {"rule": "The review is structured with clearly labeled sections using uppercase headings followed by colons (e.g., 'THE STORY:', 'THE COOL THINGS:', 'BEST SCENES:', 'THE VERDICT:', 'GRADES:')."},
    {"rule": "The structure follows a discursive, essay-like format with clear thematic paragraphs, each advancing a distinct analytical point without rigid section headings."},
    {"rule": "The language includes informal but articulate expressions of personal judgment (e.g., 'wears thin VERY quickly', 'cool stuff!!!', 'decent as always') that convey strong subjective opinion without overly casual slang."},
    {"rule": "The review employs a formal yet conversational tone with complex sentence structures, minimal contractions, and careful attention to grammar and punctuation."},
    {"rule": "The review must contain a paragraph focused on the lead and supporting cast, highlighting the actors' performances with specific character names and roles, and often comparing the actor to their other well-known parts or assessing how they embody their character's moral or psychological complexity."},
    {"rule": "The review explicitly mentions the source of the complimentary book copy (e.g., 'I received a complimentary copy from...') and specifies the publisher and review context (e.g., blog tour, NetGalley)."},
    {"rule": "The review ends with a clear recommendation statement using the phrase 'I will recommend this book to others' or a close variant (e.g., 'will certainly recommend it')."},
    {"rule": "The review concludes with a reflective, often uplifting or contemplative statement that underscores the lasting impact or significance of the work."},
]

Do not output markdown code blocks or extra text.
"""  # noqa: E501, W291

REVIEW_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE = """Given the following user historical reviews, please generate a self-contained set of personalized evaluation rubrics for the user.

<User Historical Reviews>
{historical_reviews}
</User Historical Reviews>
"""  # noqa: E501

REVIEW_RUBRICS_EVALUATOR_SYSTEM_PROMPT = """# Role
You are an expert Personalization Evaluator. Your job is to evaluate the quality of a review text based on a personalized evaluation rubric for the user. Given the metadata of the item and the review to be evaluated, the review text, and a personalized evaluation rubric, please judge whether the review text satisfies the given personalized evaluation rubric.

# Input Data
- **Review Metadata:** The metadata of the item and the review to be evaluated.
- **Review Text:** The review text to be evaluated.
- **Personalized Evaluation Rubric:** The personalized evaluation rubric for the user to evaluate the review text.

# Task
Judge whether the review text satisfies the given personalized evaluation rubric.

# Output Format
Only output the answer of whether the review text satisfies the given personalized evaluation rubric. The answer should be `yes` or `no`.
"""  # noqa: E501

REVIEW_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE = """
<Review Metadata>
{metadata}
</Review Metadata>

<Review Text>
{response}
</Review Text>

<Personalized Evaluation Rubric>
{rubric}
</Personalized Evaluation Rubric>
"""

# News headlines (LaMP-4): recipe/parl/scripts/news/prompt.py, recipe/parl/prompt.py
NEWS_RUBRICS_GENERATOR_SYSTEM_PROMPT = """# Role
You are an expert in Personalization Analysis and Rubric Generation. Your job is to generate a self-contained set of personalized evaluation rubrics based on a user's historical news. These rubrics should be used to evaluate whether a newly generated news headline matches the user's preferences.

# Input Data
- **User History:** A collection of historical news contents and their corresponding news headlines written by the target user.

# Task
Analyze how user transforms news content into news headline and generate 10 highly personalized rubrics that cover different aspects of the user's preferences.

# Drafting Rules
- **Atomicity:** Each rubric should be a single, clear and self-contained criterion that can be used to evaluate a news headline independently. It should not require context from other rubrics or external information to be meaningful. Avoid combining multiple criteria into one rubric, as this makes evaluation ambiguous and reduces clarity.
- **Consistency**: Each rubric should reflect a consistent pattern identified across all the user's historical news headlines. Each rubric must be satisfied when applied to all news headlines in the user's profile. Avoid rubrics that only match a subset of the user's historical news headlines, as they do not represent consistent patterns across the user's preferences.
- **Determinism:** Each rubric should be unambiguous and objectively evaluable, allowing for clear yes/no judgments rather than vague or subjective assessments. When applied to a news headline, evaluators should be able to determine whether the rubric is satisfied without relying on personal interpretation or probabilistic reasoning. 
- **Specificity:** Each rubric should be specific to a concrete, observable feature. Instead of vague statements like "matches writing style", provide precise characteristics such as "uses short, fragmented sentences without punctuation" or "prefers active voice over passive voice". 
- **News-Agnosticism:** Each rubric should be applicable to *any* future headline of *any* news, not just the specific news in the user's history. Focus on *how* the user writes news headline (their writing style, structure, tone, linguistic patterns) rather than *what* items they reviewed (specific items, events, or subject matter). The rubrics should capture transferable writing characteristics that persist across different news contexts.
- **Multi-Dimensionality:** The set of rubrics should collectively cover multiple dimensions of the user's writing characteristics, such as writing style (sentence structure, paragraph organization), linguistic features (vocabulary choice, grammar patterns), tone (formality, emotional expression), content focus (what aspects are emphasized), and expression patterns (how ideas are conveyed). Avoid generating rubrics that all focus on the same dimension; instead, ensure diversity across different aspects of the user's preferences.
- **Personalization:** Each rubric should be personalized to the target user's historical news, capturing their unique writing characteristics and preferences. Each rubric should reflect something distinctive about this specific user's writing style that distinguishes them from other users. Generic rubrics that could apply to any user should be avoided; the rubrics must be tailored to reveal this particular user's preferences.

# Output Format
Provide a JSON array of objects. Each object must contain exactly one key: `rule`.
Do not output markdown code blocks or extra text.
"""  # noqa: E501, W291

NEWS_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE = """Given the following user historical news, please generate a self-contained set of personalized evaluation rubrics for the user.

<User Historical News>
{historical_news}
</User Historical News>
"""  # noqa: E501

NEWS_RUBRICS_EVALUATOR_SYSTEM_PROMPT = """# Role
You are an expert Personalization Evaluator. Your job is to evaluate the quality of a news headline based on a personalized evaluation rubric for the user. Given the news content, the news headline to be evaluated, and a personalized evaluation rubric, please judge whether the news headline satisfies the given personalized evaluation rubric.

# Input Data
- **News Content:** The content of the news.
- **News Headline:** The news headline to be evaluated.
- **Personalized Evaluation Rubric:** The personalized evaluation rubric for the user to evaluate the news headline.

# Task
Judge whether the news headline satisfies the given personalized evaluation rubric.

# Output Format
Only output the answer of whether the news headline satisfies the given personalized evaluation rubric. The answer should be `yes` or `no`.
"""  # noqa: E501

NEWS_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE = """
<News Content>
{content}
</News Content>

<News Headline>
{response}
</News Headline>

<Personalized Evaluation Rubric>
{rubric}
</Personalized Evaluation Rubric>
"""

# Reddit posts (LongLaMP): recipe/parl/scripts/reddit/prompt.py, recipe/parl/prompt.py
REDDIT_RUBRICS_GENERATOR_SYSTEM_PROMPT = """# Role
You are an expert in Personalization Analysis and Rubric Generation. Your job is to generate a self-contained set of personalized evaluation rubrics based on a user's historical reddit posts. These rubrics should be used to evaluate whether a newly generated reddit post content matches the user's preferences.

# Input Data
- **User History:** A collection of historical reddit post contents written by the target user.

# Task
Analyze the user's historical reddit posts from multiple dimensions (e.g., writing style, linguistic features, structure, tone, content focus, expression patterns) and generate 10 highly personalized rubrics that cover different aspects of the user's preferences.

# Drafting Rules
- **Atomicity:** Each rubric should be a single, clear and self-contained criterion that can be used to evaluate a reddit post content independently. It should not require context from other rubrics or external information to be meaningful. Avoid combining multiple criteria into one rubric, as this makes evaluation ambiguous and reduces clarity.
- **Consistency**: Each rubric should reflect a consistent pattern identified across all the user's historical reddit posts. Each rubric must be satisfied when applied to all reddit post contents in the user's profile. Avoid rubrics that only match a subset of the user's historical reddit posts, as they do not represent consistent patterns across the user's preferences.
- **Determinism:** Each rubric should be unambiguous and objectively evaluable, allowing for clear yes/no judgments rather than vague or subjective assessments. When applied to a reddit post content, evaluators should be able to determine whether the rubric is satisfied without relying on personal interpretation or probabilistic reasoning. 
- **Specificity:** Each rubric should be specific to a concrete, observable feature. Instead of vague statements like "matches writing style", provide precise characteristics such as "uses short, fragmented sentences without punctuation" or "prefers active voice over passive voice". 
- **Topic-Agnosticism:** Each rubric should be applicable to *any* future post of *any* topic, not just the specific posts in the user's history. Focus on *how* the user writes posts (their writing style, structure, tone, linguistic patterns) rather than *what* topics they posted (specific topics, events, or subject matter). The rubrics should capture transferable writing characteristics that persist across different post contexts.
- **Multi-Dimensionality:** The set of rubrics should collectively cover multiple dimensions of the user's writing characteristics, such as writing style (sentence structure, paragraph organization), linguistic features (vocabulary choice, grammar patterns), tone (formality, emotional expression), content focus (what aspects are emphasized), and expression patterns (how ideas are conveyed). Avoid generating rubrics that all focus on the same dimension; instead, ensure diversity across different aspects of the user's preferences.
- **Personalization:** Each rubric should be personalized to the target user's historical reddit post contents, capturing their unique writing characteristics and preferences. Each rubric should reflect something distinctive about this specific user's writing style that distinguishes them from other users. Generic rubrics that could apply to any user should be avoided; the rubrics must be tailored to reveal this particular user's preferences.

# Output Format
Provide a JSON array of objects. Each object must contain exactly one key: `rule`.
Example: 
[
    {"rule": "The post begins with a personal disclosure or contextual backstory that establishes the user's current emotional state, situation, or relevant history before introducing the main topic."},
    {"rule": "The writing uses lowercase letters at the beginning of sentences inconsistently, often starting sentences with lowercase 'i' for first-person pronouns and occasionally neglecting standard capitalization at the beginning of sentences."},
    {"rule": "The sentence structure must favor complete, grammatically standard sentences with consistent punctuation, avoiding fragmented prose, bullet points, or meta-commentary within the story itself."},
    {"rule": "The post structures thoughts in a stream-of-consciousness style with minimal paragraph breaks, allowing one idea to flow into the next without formal transitions."},
    {"rule": "The post must present biomechanical or anatomical reasoning to justify training recommendations, explicitly connecting muscle structure or joint mechanics to exercise selection or technique."},
    {"rule": "The post balances emotional content with analytical reasoning, expressing personal feelings without becoming overly sentimental or dramatic."},
    {"rule": "Writes in a direct, no-nonsense tone with minimal embellishment, prioritizing clarity and factual accuracy over emotional expression or storytelling."},
    {"rule": "The post uses a conversational and informal tone with frequent use of first-person perspective (e.g., 'I', 'my', 'me') to express personal experiences, opinions, or questions."},
    {"rule": "Vocabulary is plainspoken and accessible, favoring common idioms and colloquial expressions over technical jargon or literary flourishes, even when discussing sensitive or complex topics."},
    {"rule": "The post concludes with a minimal or absent summary statement, instead ending directly on a question, emotional plea, or unresolved tension, leaving resolution open to community input."},
]

Do not output markdown code blocks or extra text.
"""  # noqa: E501, W291

REDDIT_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE = """Given the following user historical reddit posts, please generate a self-contained set of personalized evaluation rubrics for the user.

<User Historical Reddit Posts>
{historical_reddit_posts}
</User Historical Reddit Posts>
"""  # noqa: E501

REDDIT_RUBRICS_EVALUATOR_SYSTEM_PROMPT = """# Role
You are an expert Personalization Evaluator. Your job is to evaluate the quality of a reddit post content based on a personalized evaluation rubric for the user. Given the reddit post summary, the reddit post content to be evaluated, and a personalized evaluation rubric, please judge whether the reddit post content satisfies the given personalized evaluation rubric.

# Input Data
- **Reddit Post Summary:** The summary of the reddit post.
- **Reddit Post Content:** The content of the reddit post to be evaluated.
- **Personalized Evaluation Rubric:** The personalized evaluation rubric for the user to evaluate the reddit post content.

# Task
Judge whether the reddit post content satisfies the given personalized evaluation rubric.

# Output Format
Only output the answer of whether the reddit post content satisfies the given personalized evaluation rubric. The answer should be `yes` or `no`.
"""  # noqa: E501

REDDIT_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE = """
<Reddit Post Summary>
{summary}
</Reddit Post Summary>

<Reddit Post Content>
{content}
</Reddit Post Content>

<Personalized Evaluation Rubric>
{rubric}
</Personalized Evaluation Rubric>
"""

# Generic (context, text) pairs: OURS, in the released layout (the released code has no such task).

GENERIC_RUBRICS_GENERATOR_SYSTEM_PROMPT = """# Role
You are an expert in Personalization Analysis and Rubric Generation. Your job is to generate a self-contained set of personalized evaluation rubrics based on a user's historical texts. These rubrics should be used to evaluate whether a newly generated text matches the user's preferences.

# Input Data
- **User History:** A collection of historical texts written by the target user, each with the context it was written for.

# Task
Analyze the user's historical texts from multiple dimensions (e.g., writing style, linguistic features, structure, tone, content focus, expression patterns) and generate 10 highly personalized rubrics that cover different aspects of the user's preferences.

# Drafting Rules
- **Atomicity:** Each rubric should be a single, clear and self-contained criterion that can be used to evaluate a text independently.
- **Consistency**: Each rubric must be satisfied when applied to all texts in the user's history.
- **Determinism:** Each rubric should be unambiguous and objectively evaluable, allowing for clear yes/no judgments.
- **Specificity:** Each rubric should be specific to a concrete, observable feature.
- **Context-Agnosticism:** Each rubric should be applicable to *any* future text for *any* context: focus on *how* the user writes rather than *what* about.
- **Multi-Dimensionality:** The set of rubrics should collectively cover multiple dimensions of the user's writing characteristics.
- **Personalization:** Each rubric should reflect something distinctive about this specific user's writing that distinguishes them from other users.

# Output Format
Provide a JSON array of objects. Each object must contain exactly one key: `rule`.
Do not output markdown code blocks or extra text.
"""  # noqa: E501

GENERIC_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE = """Given the following user historical texts, please generate a self-contained set of personalized evaluation rubrics for the user.

<User Historical Texts>
{historical_texts}
</User Historical Texts>
"""  # noqa: E501

GENERIC_RUBRICS_EVALUATOR_SYSTEM_PROMPT = """# Role
You are an expert Personalization Evaluator. Your job is to evaluate the quality of a text based on a personalized evaluation rubric for the user. Given the context of the text, the text to be evaluated, and a personalized evaluation rubric, please judge whether the text satisfies the given personalized evaluation rubric.

# Input Data
- **Context:** The context the text was written for.
- **Text:** The text to be evaluated.
- **Personalized Evaluation Rubric:** The personalized evaluation rubric for the user to evaluate the text.

# Task
Judge whether the text satisfies the given personalized evaluation rubric.

# Output Format
Only output the answer of whether the text satisfies the given personalized evaluation rubric. The answer should be `yes` or `no`.
"""  # noqa: E501

GENERIC_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE = """
<Context>
{context}
</Context>

<Text>
{response}
</Text>

<Personalized Evaluation Rubric>
{rubric}
</Personalized Evaluation Rubric>
"""

_SPLIT = "\n" + "=" * 100 + "\n"  # the News and Reddit scripts' separator between history items
_RULE = "\x00rule\x00"  # placeholder the rendered user message is split at


def _amazon_history(history: Sequence[HistoryItem]) -> str:
    return "\n".join(f"{h.text}\n" for h in history)


def _news_history(history: Sequence[HistoryItem]) -> str:
    return _SPLIT.join(f"[News Headline]: {h.text}\n[News Content]: {h.context}\n" for h in history)


def _reddit_history(history: Sequence[HistoryItem]) -> str:
    return _SPLIT.join(h.text for h in history)


def _generic_history(history: Sequence[HistoryItem]) -> str:
    return _SPLIT.join(f"[Text]: {h.text}\n[Context]: {h.context}\n" for h in history)


@dataclass(frozen=True)
class ReleasedTask:
    """One task's released prompts and the names its format strings use."""

    judge_system: str
    judge_user: str
    context_key: str  # the judge user template's field for the context
    text_key: str  # ... and for the judged text
    generator_system: str
    generator_user: str
    history_key: str  # the generator user template's field for the history
    history: Callable[[Sequence[HistoryItem]], str]


RELEASED: dict[Task, ReleasedTask] = {
    Task.AMAZON: ReleasedTask(
        REVIEW_RUBRICS_EVALUATOR_SYSTEM_PROMPT, REVIEW_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE,
        "metadata", "response", REVIEW_RUBRICS_GENERATOR_SYSTEM_PROMPT,
        REVIEW_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE, "historical_reviews", _amazon_history,
    ),
    Task.NEWS: ReleasedTask(
        NEWS_RUBRICS_EVALUATOR_SYSTEM_PROMPT, NEWS_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE,
        "content", "response", NEWS_RUBRICS_GENERATOR_SYSTEM_PROMPT,
        NEWS_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE, "historical_news", _news_history,
    ),
    Task.REDDIT: ReleasedTask(
        REDDIT_RUBRICS_EVALUATOR_SYSTEM_PROMPT, REDDIT_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE,
        "summary", "content", REDDIT_RUBRICS_GENERATOR_SYSTEM_PROMPT,
        REDDIT_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE, "historical_reddit_posts", _reddit_history,
    ),
    Task.GENERIC: ReleasedTask(
        GENERIC_RUBRICS_EVALUATOR_SYSTEM_PROMPT, GENERIC_RUBRICS_EVALUATOR_USER_PROMPT_TEMPLATE,
        "context", "response", GENERIC_RUBRICS_GENERATOR_SYSTEM_PROMPT,
        GENERIC_RUBRICS_GENERATOR_USER_PROMPT_TEMPLATE, "historical_texts", _generic_history,
    ),
}  # fmt: skip


def judge_frame(context: str, text: str, task: Task) -> tuple[str, str, str]:
    """(system, prefix, after): the released judge chat around its rule, which none of the
    three depends on: the user message for ``rule`` is exactly ``prefix + rule + after``."""
    t = RELEASED[task]
    user = t.judge_user.format(**{t.context_key: context, t.text_key: text, "rubric": _RULE})
    prefix, _, after = user.rpartition(_RULE)
    return t.judge_system, prefix, after


def judge_messages(context: str, text: str, rule: str, task: Task) -> tuple[str, str, str]:
    """(system, prefix, suffix): the released judge chat, its user message split just before
    the rule (``prefix + suffix`` is exactly the released user message)."""
    system, prefix, after = judge_frame(context, text, task)
    return system, prefix, rule + after


def generator_messages(history: Sequence[HistoryItem], task: Task) -> tuple[str, str]:
    """(system, user): the released generator chat over ``history`` (already windowed)."""
    t = RELEASED[task]
    return t.generator_system, t.generator_user.format(**{t.history_key: t.history(history)})
