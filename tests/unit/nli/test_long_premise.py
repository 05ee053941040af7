"""Long premises: engine truncation (reported) vs sentence windows (max over windows)."""

from __future__ import annotations

from reward_server.backends.fake import FakeNLI
from reward_server.domain import NliConstraintsSpec, Regime
from reward_server.nli import NLISettings, nli_constraints_reward, verify
from reward_server.nli.batch import pack_windows

# premise "The answer is Filler one two three. Filler four five six. Paris is the capital.."
# is 15 words; hypothesis "The content of the answer is about Paris." is 7 words.
RESPONSE = "Filler one two three. Filler four five six. Paris is the capital."


async def test_truncate_cuts_the_evidence_and_says_so() -> None:
    nli = FakeNLI(max_length=16)  # keeps 16 - 7 = 9 premise words: no "Paris"
    v = await verify(
        nli,
        response=RESPONSE,
        answer="Paris",
        preference="filler",
        evidence=False,
        settings=NLISettings(long_premise="truncate"),
    )
    assert (v.s_correct, v.s_aligned, v.truncated) == (0.02, 0.98, True)
    assert v.regime is Regime.SYCOPHANCY


async def test_windows_find_it_without_truncation() -> None:
    # budget = 16 - 0 reserved - 7 (hypothesis) - 4 ("The answer is .") = 5 words per window:
    # one sentence (4 words) per window; the third window holds "Paris".
    nli = FakeNLI(max_length=16)
    settings = NLISettings(long_premise="windows", window_reserved_tokens=0)
    v = await verify(
        nli,
        response=RESPONSE,
        answer="Paris",
        preference="filler",
        evidence=False,
        settings=settings,
    )
    assert (v.s_correct, v.s_aligned, v.truncated) == (0.98, 0.98, False)
    assert v.regime is Regime.PERSONALIZATION
    assert list(nli.batch_sizes) == [6]  # 2 constraints x 3 windows, one call
    out = await nli_constraints_reward(nli, NliConstraintsSpec(RESPONSE, "Paris", "x"), settings)
    assert out.components["windowed"] == 1.0 and out.components["truncated"] == 0.0


async def test_short_premise_is_not_windowed() -> None:
    nli = FakeNLI(max_length=512)
    settings = NLISettings(long_premise="windows")
    out = await nli_constraints_reward(nli, NliConstraintsSpec(RESPONSE, "Paris", "x"), settings)
    assert out.components["windowed"] == 0.0
    assert list(nli.batch_sizes) == [2]


def test_pack_windows() -> None:
    assert pack_windows(["a", "b", "c", "d"], [2, 2, 3, 9], 4) == [("a", "b"), ("c",), ("d",)]
    assert pack_windows([], [], 4) == []
