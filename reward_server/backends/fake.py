"""Deterministic engines that really implement the protocols: for tests, demos and benchmarks.

FakeJudge
    Reads the judged text and the rule from the rendered prompt (:class:`JudgePrompt`): in the
    released layout (the prefix ends with an opening ``<Tag>`` line) the body of the prefix's
    last closed ``<Tag>...</Tag>`` block and the suffix up to its closing tag; in the Markdown
    layouts the body of the prefix's last ``## `` block and the suffix's first block up to its
    first blank line. Then ``p_yes = 0.02 + 0.96 * covered / len(terms)`` where ``terms`` are the rule's key
    terms: the phrases it quotes (``"..."`` or ``'...'``) if it quotes any, otherwise its words
    of five or more letters that are not stop words; ``covered`` counts the terms found in the
    text (case-insensitive, whole words). A rule with no key term gets 0.5 (undecided, hence not
    satisfied). The context block is ignored.

    ``generate`` returns ``scripted[seed % len(scripted)]`` when scripted outputs were given;
    otherwise a JSON array of ten rules ``The text uses the word "w".`` whose words ``w`` are the
    user prompt's most frequent key words (ties alphabetical), rotated by ``3 * seed``.

FakeNLI
    Set inclusion: both sides are split into sentences, each reduced to its content words (words
    of two or more characters minus the stop words below, which include the NLICV template
    words). ``entailment = 0.98`` iff every content word of the hypothesis occurs in the premise,
    else ``0.02``; ``0.0`` when either side has no content word. Token counts are word counts;
    a pair longer than ``max_length`` words is reported truncated and judged on its first
    ``max_length`` words.

Both fakes can be made to fail (``fail_with = SomeError(...)``): every call then raises it and
``health()`` reports the engine down, until ``fail_with`` is reset to None. They compute in the
event loop, a few dozen inputs at a time (:func:`reward_server.cooperative.turn` between), as a
real engine's work off the loop would leave it free.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter, deque
from collections.abc import Sequence

from reward_server import cooperative
from reward_server.backends.base import GenerationRequest, Health, JudgePrompt, NLIPair, NLIScore

STOP_WORDS = frozenset(
    """a an and are as at be but by for from has have he her his i if in into is it its of on or
    our she so that the their them then there these they this to was we were what when which who
    will with you your about answer content user interested related text uses word""".split()
)

_QUOTED = re.compile(r"\"([^\"]+)\"|'([^']+)'")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_HEADING = re.compile(r"^## .*$", re.MULTILINE)
_TAGGED = re.compile(r"<([A-Za-z][^<>\n]*)>\n(.*?)\n</\1>", re.DOTALL)
_OPEN_TAG_AT_END = re.compile(r"<[A-Za-z][^<>/\n]*>\n\Z")
_BATCH_LOG = 100_000
_CHUNK = 32  # inputs computed between two turns of the event loop


def blocks(rendered: str) -> list[str]:
    """Bodies of the ``## `` blocks of a rendered prompt part, in order (stripped)."""
    heads = list(_HEADING.finditer(rendered))
    return [
        rendered[h.end() : heads[k + 1].start() if k + 1 < len(heads) else len(rendered)].strip()
        for k, h in enumerate(heads)
    ]


def text_and_rule(prompt: JudgePrompt) -> tuple[str, str]:
    """What FakeJudge judges: (text, rule) read back from a rendered prompt (the text: the last
    block of the prefix before its ``## Question``, if any)."""
    if _OPEN_TAG_AT_END.search(prompt.prefix):
        tagged = _TAGGED.findall(prompt.prefix)
        text = tagged[-1][1].strip() if tagged else ""
        return text, prompt.suffix.split("\n</", 1)[0].strip()
    prefix = prompt.prefix.split("\n\n## Question\n", 1)[0]
    pre, suf = blocks(prefix), blocks(prompt.suffix)
    text = pre[-1] if pre else prefix.strip()
    rule = (suf[0] if suf else prompt.suffix.strip()).split("\n\n", 1)[0]
    return text, rule


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def key_terms(rule: str) -> list[str]:
    """The terms FakeJudge looks for in a text (see module doc)."""
    quoted = [a or b for a, b in _QUOTED.findall(rule)]
    if quoted:
        return [q.strip().lower() for q in quoted if q.strip()]
    return [w for w in _words(rule) if len(w) >= 5 and w not in STOP_WORDS]


def _contains(text_words: Sequence[str], term: str) -> bool:
    term_words = _words(term)
    if not term_words:
        return False
    n = len(term_words)
    return any(list(text_words[i : i + n]) == term_words for i in range(len(text_words) - n + 1))


def fake_p_yes(text: str, rule: str) -> float:
    terms = key_terms(rule)
    if not terms:
        return 0.5
    text_words = _words(text)
    covered = sum(1 for t in terms if _contains(text_words, t))
    return 0.02 + 0.96 * covered / len(terms)


class FakeJudge:
    """Deterministic judge and generator (see module doc)."""

    def __init__(
        self,
        *,
        scripted: Sequence[str] | None = None,
        latency_s: float = 0.0,
        model_id: str = "fake-judge",
    ) -> None:
        self._scripted = tuple(scripted) if scripted else ()
        self._latency_s = latency_s
        self._model_id = model_id
        self.fail_with: BaseException | None = None
        # items per p_yes call (the latest ones), for tests and benchmarks
        self.batch_sizes: deque[int] = deque(maxlen=_BATCH_LOG)

    @property
    def model_id(self) -> str:
        return self._model_id

    def _check(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        self._check()
        self.batch_sizes.append(len(prompts))
        if self._latency_s:
            await asyncio.sleep(self._latency_s)
        out: list[float] = []
        for i, p in enumerate(prompts):
            if i % _CHUNK == 0:
                await cooperative.turn()
            out.append(fake_p_yes(*text_and_rule(p)))
        return out

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        self._check()
        if self._latency_s:
            await asyncio.sleep(self._latency_s)
        return [self._generate_one(r) for r in requests]

    async def health(self) -> Health:
        if self.fail_with is not None:
            return Health(False, f"{self._model_id}: {type(self.fail_with).__name__}: {self.fail_with}")
        return Health(True)

    def _generate_one(self, request: GenerationRequest) -> str:
        seed = request.seed or 0
        if self._scripted:
            return self._scripted[seed % len(self._scripted)]
        counts = Counter(w for w in _words(request.user) if len(w) >= 5 and w not in STOP_WORDS)
        ranked = sorted(counts, key=lambda w: (-counts[w], w))
        if not ranked:
            return "[]"
        shift = (3 * seed) % len(ranked)
        chosen = (ranked[shift:] + ranked[:shift])[:10]
        return json.dumps([{"rule": f'The text uses the word "{w}".'} for w in chosen])

    async def close(self) -> None:
        return None


def content_words(text: str) -> set[str]:
    return {w for w in _words(text) if len(w) >= 2 and w not in STOP_WORDS}


class FakeNLI:
    """Deterministic set-inclusion NLI (see module doc)."""

    def __init__(
        self, *, max_length: int = 512, latency_s: float = 0.0, model_id: str = "fake-nli"
    ) -> None:
        self._max_length = max_length
        self._latency_s = latency_s
        self._model_id = model_id
        self.fail_with: BaseException | None = None
        self.batch_sizes: deque[int] = deque(maxlen=_BATCH_LOG)

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def max_length(self) -> int:
        return self._max_length

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) for t in texts]

    def _score(self, pair: NLIPair) -> NLIScore:
        p_tokens = pair.premise.split()
        h_tokens = pair.hypothesis.split()
        truncated = len(p_tokens) + len(h_tokens) > self._max_length
        premise = pair.premise
        if truncated:  # keep the hypothesis whole, cut the premise (like "only_first")
            premise = " ".join(p_tokens[: max(0, self._max_length - len(h_tokens))])
        hyp = content_words(pair.hypothesis)
        prem = content_words(premise)
        if not hyp or not prem:
            return NLIScore(0.0, truncated)
        return NLIScore(0.98 if hyp <= prem else 0.02, truncated)

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        if self.fail_with is not None:
            raise self.fail_with
        self.batch_sizes.append(len(pairs))
        if self._latency_s:
            await asyncio.sleep(self._latency_s)
        out: list[NLIScore] = []
        for i, p in enumerate(pairs):
            if i % _CHUNK == 0:
                await cooperative.turn()
            out.append(self._score(p))
        return out

    async def health(self) -> Health:
        if self.fail_with is not None:
            return Health(False, f"{self._model_id}: {type(self.fail_with).__name__}: {self.fail_with}")
        return Health(True)

    async def close(self) -> None:
        return None
