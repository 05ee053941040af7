"""What every LLM judge engine shares: the chat rendering, the yes/no answer tokens, the fold.

``p_yes = sigmoid(l_yes - l_no)`` where ``l_yes`` is the logsumexp of the next-token log-probs
of the single-token variants of ``yes`` (``yes``, ``Yes``, `` yes``, `` Yes``) and ``l_no`` the
same for ``no``. The engines differ only in where the log-probs come from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reward_server.errors import ModelLoadError
from reward_server.numerics import logsumexp, p_yes_from_logits

ANSWERS = ("yes", "no")


def variants(word: str) -> tuple[str, ...]:
    """The spellings of an answer word that are folded together."""
    return (word, word.capitalize(), " " + word, " " + word.capitalize())


def answer_token_ids(tokenizer: Any, word: str) -> list[int]:
    """Single-token ids of the variants of ``word`` (the bare form must be one token)."""
    ids: list[int] = []
    for variant in variants(word):
        enc = tokenizer.encode(variant, add_special_tokens=False)
        if len(enc) == 1:
            if int(enc[0]) not in ids:
                ids.append(int(enc[0]))
        elif variant == word:
            raise ModelLoadError(
                f"the judge tokenizer splits {word!r} into {len(enc)} tokens {enc}; p_yes needs "
                "'yes' and 'no' to be single tokens: use another judge model"
            )
    return ids


def yes_no_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(yes ids, no ids); ModelLoadError if they overlap."""
    yes, no = answer_token_ids(tokenizer, "yes"), answer_token_ids(tokenizer, "no")
    if set(yes) & set(no):
        raise ModelLoadError("the judge tokenizer maps 'yes' and 'no' to a shared token")
    return yes, no


def chat_messages(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def render_chat(tokenizer: Any, system: str, user: str) -> str:
    """The model's chat template over (system, user), ready for the assistant's first token."""
    text: str = tokenizer.apply_chat_template(
        chat_messages(system, user), tokenize=False, add_generation_prompt=True,
        enable_thinking=False,
    )
    return text


def fold_by_ids(logprobs: Mapping[int, float], ids: Sequence[int]) -> float | None:
    """logsumexp of the log-probs of ``ids`` present in ``logprobs``; None if none is."""
    found = [logprobs[i] for i in ids if i in logprobs]
    return logsumexp(found) if found else None


def fold_by_text(entries: Iterable[tuple[str, float]]) -> tuple[float | None, float | None]:
    """(l_yes, l_no) folded over tokens whose stripped lowercase text is yes / no."""
    yes: list[float] = []
    no: list[float] = []
    for token, lp in entries:
        word = token.strip().lower()
        if word == "yes":
            yes.append(lp)
        elif word == "no":
            no.append(lp)
    return (logsumexp(yes) if yes else None, logsumexp(no) if no else None)


def p_yes(l_yes: float, l_no: float) -> float:
    """The judge's probability of yes against no."""
    return p_yes_from_logits(l_yes, l_no)
