"""What every LLM judge engine shares: the chat rendering, the yes/no answer tokens, the fold.

``p_yes = sigmoid(l_yes - l_no) = P(yes) / (P(yes) + P(no))``. Which tokens count is the
read-out (``engines.judge.p_yes_readout``, :data:`READOUTS`):

- ``released`` (default): the one lowercase token ``yes`` against the one lowercase token ``no``.
  PARL's released judge call asks vLLM for a guided choice between "yes" and "no"
  (``structured_outputs: {choice: [yes, no]}``); vLLM applies that restriction to the logits
  before it reports log-probs, so the released score is ``P(yes) / (P(yes) + P(no))`` over these
  two tokens: restricting the vocabulary renormalises both by the same constant, which cancels.
- ``pooled-v1`` (this project before issue 52): ``l_yes`` is the logsumexp of the next-token
  log-probs of the single-token spellings ``yes``, ``Yes``, `` yes``, `` Yes``, ``l_no`` the same
  for ``no``, with no restriction.

The engines differ only in where the log-probs come from; each reads the log-prob of every
counted token id, so the fold is exact (docs/parl.md §2 has the per-engine table). When a server
cannot report some of them, :func:`p_yes_bounds` gives the interval the true value lies in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from reward_server.errors import ModelLoadError
from reward_server.numerics import logsumexp, p_yes_from_logits

ANSWERS = ("yes", "no")
PYesReadout = Literal["released", "pooled-v1"]
READOUTS: tuple[PYesReadout, ...] = get_args(PYesReadout)
DEFAULT_READOUT: PYesReadout = "released"


def variants(word: str, readout: PYesReadout = DEFAULT_READOUT) -> tuple[str, ...]:
    """The spellings of an answer word that count for its side under ``readout``: the word
    itself (released), or it with a capital and each with a leading space (pooled-v1)."""
    if readout == "released":
        return (word,)
    if readout == "pooled-v1":
        return (word, word.capitalize(), " " + word, " " + word.capitalize())
    raise ValueError(f"unknown p_yes read-out {readout!r}; expected one of {READOUTS}")


def side_of(spelling: str, readout: PYesReadout = DEFAULT_READOUT) -> str | None:
    """``"yes"`` / ``"no"`` for a spelling that counts for that side under ``readout`` (released:
    exactly ``yes`` / ``no``; pooled-v1: any case, surrounding spaces); None otherwise."""
    if readout == "released":
        return spelling if spelling in ANSWERS else None
    word = spelling.strip().lower()
    return word if word in ANSWERS else None


def answer_spellings(tokenizer: Any, word: str, readout: PYesReadout = DEFAULT_READOUT) -> dict[str, int]:
    """Spelling -> token id, for the spellings of ``word`` under ``readout`` that are one token
    (the bare form must be)."""
    out: dict[str, int] = {}
    for variant in variants(word, readout):
        enc = tokenizer.encode(variant, add_special_tokens=False)
        if len(enc) == 1:
            out[variant] = int(enc[0])
        elif variant == word:
            raise ModelLoadError(
                f"the judge tokenizer splits {word!r} into {len(enc)} tokens {enc}; p_yes needs "
                "'yes' and 'no' to be single tokens: use another judge model"
            )
    return out


def answer_token_ids(tokenizer: Any, word: str, readout: PYesReadout = DEFAULT_READOUT) -> list[int]:
    """Single-token ids of the spellings of ``word`` under ``readout`` (the bare form must be one
    token)."""
    return list(dict.fromkeys(answer_spellings(tokenizer, word, readout).values()))


def yes_no_ids(tokenizer: Any, readout: PYesReadout = DEFAULT_READOUT) -> tuple[list[int], list[int]]:
    """(yes ids, no ids) under ``readout``; ModelLoadError if they overlap."""
    yes, no = answer_token_ids(tokenizer, "yes", readout), answer_token_ids(tokenizer, "no", readout)
    if set(yes) & set(no):
        raise ModelLoadError("the judge tokenizer maps 'yes' and 'no' to a shared token")
    return yes, no


def answer_vocab(tokenizer: Any, readout: PYesReadout = DEFAULT_READOUT) -> dict[str, int]:
    """Every single-token spelling of yes and no under ``readout`` -> its id; ModelLoadError if
    they overlap."""
    yes_no_ids(tokenizer, readout)
    return {**answer_spellings(tokenizer, "yes", readout), **answer_spellings(tokenizer, "no", readout)}


def chat_messages(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def chat_template_kwargs(*, enable_thinking: bool | None) -> dict[str, Any]:
    """The chat template's switches, the same for every engine: rendered locally by the
    transformers and vLLM engines, sent as ``chat_template_kwargs`` by the OpenAI engine (the
    server renders). Templates without a thinking switch ignore it; None sends no switch (the
    template's own default)."""
    return {} if enable_thinking is None else {"enable_thinking": enable_thinking}


def render_chat(tokenizer: Any, system: str, user: str, *, enable_thinking: bool | None = False) -> str:
    """The model's chat template over (system, user), ready for the assistant's first token."""
    text: str = tokenizer.apply_chat_template(
        chat_messages(system, user), tokenize=False, add_generation_prompt=True,
        **chat_template_kwargs(enable_thinking=enable_thinking),
    )
    return text


def fold_by_ids(logprobs: Mapping[int, float], ids: Sequence[int]) -> float | None:
    """logsumexp of the log-probs of ``ids`` present in ``logprobs``; None if none is."""
    found = [logprobs[i] for i in ids if i in logprobs]
    return logsumexp(found) if found else None


def p_yes(l_yes: float, l_no: float) -> float:
    """The judge's probability of yes against no."""
    return p_yes_from_logits(l_yes, l_no)


def p_yes_exact(logprobs: Mapping[int, float], yes_ids: Sequence[int], no_ids: Sequence[int]) -> float | None:
    """p_yes from the log-probs of every variant id; None when one of them is missing."""
    l_yes, l_no = fold_by_ids(logprobs, yes_ids), fold_by_ids(logprobs, no_ids)
    if l_yes is None or l_no is None or any(i not in logprobs for i in (*yes_ids, *no_ids)):
        return None
    return p_yes(l_yes, l_no)


def p_yes_bounds(
    yes: Sequence[float], no: Sequence[float], *, missing_yes: int, missing_no: int, cap: float
) -> tuple[float, float]:
    """The interval p_yes lies in when only some variants' log-probs are known.

    ``yes`` / ``no``: the known log-probs; ``missing_*``: how many variants are unknown; ``cap``:
    a log-prob no unknown variant can exceed (the smallest one the server listed, since the
    unknown ones were outside its top list). The low end puts every unknown ``no`` at ``cap``
    and every unknown ``yes`` at zero probability, the high end the reverse.
    """
    s_yes = sum(math.exp(x) for x in yes)
    s_no = sum(math.exp(x) for x in no)
    extra_yes, extra_no = missing_yes * math.exp(cap), missing_no * math.exp(cap)
    lo_den, hi_den = s_yes + s_no + extra_no, s_yes + extra_yes + s_no
    lo = s_yes / lo_den if lo_den > 0 else 0.0
    hi = (s_yes + extra_yes) / hi_den if hi_den > 0 else 1.0
    return lo, hi
