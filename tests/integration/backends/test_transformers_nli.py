"""The real transformers NLI path on a random-weight model built at test time (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from reward_server.backends.base import NLIPair  # noqa: E402
from reward_server.backends.fake import FakeJudge  # noqa: E402
from reward_server.backends.judge_nli import JudgeAsNLI  # noqa: E402
from reward_server.backends.settings import TransformersNLISettings  # noqa: E402
from reward_server.backends.tiny_models import build_tiny_nli_model  # noqa: E402
from reward_server.backends.transformers_nli import TransformersNLI, make_batches  # noqa: E402
from reward_server.domain import Regime  # noqa: E402
from reward_server.errors import ModelLoadError  # noqa: E402
from reward_server.nli import NLISettings, verify  # noqa: E402

LABELS = ("neutral", "contradiction", "entailment")  # entailment last: index 2

PAIRS = [
    NLIPair("The answer is Paris.", "The content of the answer is about France."),
    NLIPair("A man plays a guitar on stage. " * 6, "Someone is making music."),
    NLIPair("Cats sleep.", "The content of the answer is about dogs and their owners."),
    NLIPair("The weather in the mountains was cold and windy all week long.", "It was warm."),
    NLIPair("x", "y"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_nli_model(tmp_path_factory.mktemp("nli") / "tiny", label_order=LABELS)


def _engine(model_dir: Path, **kw: object) -> TransformersNLI:
    settings = TransformersNLISettings(model=str(model_dir), device="cpu", **kw)
    return TransformersNLI.from_settings(settings)


def _manual(model_dir: Path, pair: NLIPair, max_length: int = 512) -> list[float]:
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    enc = tok(pair.premise, pair.hypothesis, truncation="only_first", max_length=max_length,
              return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        logits = model(**enc).logits[0]
    return [float(x) for x in torch.softmax(logits, dim=-1)]


async def test_entailment_column_found_by_name(model_dir: Path) -> None:
    engine = _engine(model_dir)
    scores = await engine.entailment(PAIRS[:3])
    for pair, score in zip(PAIRS[:3], scores, strict=True):
        probs = _manual(model_dir, pair)
        assert score.entailment == pytest.approx(probs[2], abs=1e-5)  # the "entailment" label
        assert not score.truncated
    # the random model separates the columns, so reading another column would be caught
    assert any(abs(p[2] - p[0]) > 0.05 for p in (_manual(model_dir, q) for q in PAIRS[:3]))


async def test_batched_equals_one_at_a_time(model_dir: Path) -> None:
    engine = _engine(model_dir, token_budget=64)  # several length buckets
    assert len(make_batches([len(p.premise) // 4 + 5 for p in PAIRS], 64)) > 1
    batched = await engine.entailment(PAIRS)
    single = [(await engine.entailment([p]))[0] for p in PAIRS]
    for b, s in zip(batched, single, strict=True):
        assert b.entailment == pytest.approx(s.entailment, abs=1e-5)


async def test_truncation_reported_and_premise_cut(model_dir: Path) -> None:
    engine = _engine(model_dir, max_length=16)
    long_pair, short_pair = PAIRS[1], PAIRS[4]
    scores = await engine.entailment([long_pair, short_pair])
    assert scores[0].truncated and not scores[1].truncated
    assert scores[0].entailment == pytest.approx(_manual(model_dir, long_pair, 16)[2], abs=1e-5)
    assert await engine.token_counts(["Someone is making music.", ""]) == [5, 0]


async def test_unnamed_labels_fail_loudly(tmp_path: Path) -> None:
    folder = build_tiny_nli_model(tmp_path / "unnamed", named=False)
    with pytest.raises(ModelLoadError, match="entailment"):
        _engine(folder)


async def test_missing_model_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="cannot load NLI model"):
        _engine(tmp_path / "nothing-here")


async def test_int8_quantized_engine_close_to_float(model_dir: Path) -> None:
    plain = await _engine(model_dir).entailment(PAIRS)
    quant = await _engine(model_dir, quantize_int8=True).entailment(PAIRS)
    assert max(abs(a.entailment - b.entailment) for a, b in zip(plain, quant, strict=True)) < 0.1


async def test_verify_with_windows_on_real_tokenizer(model_dir: Path) -> None:
    engine = _engine(model_dir, max_length=48)
    response = " ".join(f"Sentence number {i} talks about topic {i}." for i in range(12))
    settings = NLISettings(long_premise="windows")
    v = await verify(engine, response=response, answer="topic 3", preference="topic 11",
                     evidence=False, settings=settings)  # fmt: skip
    assert not v.truncated  # every window fits
    t = await verify(engine, response=response, answer="topic 3", preference="topic 11",
                     evidence=False, settings=NLISettings())  # fmt: skip
    assert t.truncated


async def test_judge_as_nli_on_fake_judge() -> None:
    judge = FakeJudge()
    nli = JudgeAsNLI(judge)
    assert nli.model_id == "judge-as-nli:fake-judge"
    scores = await nli.entailment(
        [
            NLIPair("The answer is about jazz music.", "It is music."),  # terms [music]
            NLIPair("The answer is about jazz music.", "Classical symphony."),  # none covered
            NLIPair("The answer is about jazz music.", "music symphony"),  # 1 of 2 terms
        ]
    )
    assert [s.entailment for s in scores] == pytest.approx([0.98, 0.02, 0.02 + 0.96 / 2])
    assert list(judge.batch_sizes) == [3]
    v = await verify(nli, response="Jazz music from New Orleans.", answer="music",
                     preference="orleans", evidence=False, settings=NLISettings())  # fmt: skip
    assert v.regime is Regime.PERSONALIZATION
