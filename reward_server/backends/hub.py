"""Where an engine's model comes from, checked before anything heavy is imported or loaded.

A model is a local folder or a Hugging Face hub id. When the hub cannot be reached and the model
is not in the local cache, transformers (through huggingface_hub) retries each file 5 times with
a backoff of 1+2+4+8+8 s before it says so: about a minute for a judge (its tokenizer, then its
config), for every replica start. :func:`check_model_source` asks the hub once, with
huggingface_hub's own single metadata request (``get_hf_file_metadata``: one HEAD of the model's
``config.json``, no retries, within ``HF_HUB_ETAG_TIMEOUT``, 10 s by default), and fails at once
with the model, what was wrong and the fix. It honours huggingface_hub's settings as they are:
``HF_HUB_OFFLINE`` (then only the cache is looked at), ``HF_ENDPOINT`` (a mirror), ``HF_HOME`` /
``HF_HUB_CACHE`` (where the cache is), ``HF_TOKEN`` (private or gated models).

A model already in the cache is probed too, unless ``HF_HUB_OFFLINE`` is set: by name, the
loader asks the hub for each file it may need, the optional ones it never had included
(``adapter_config.json``, ...), and retries each 5 times: a cached tiny NLI model took 94 s to
load with the hub unreachable. When the hub cannot be reached, :func:`check_model_source`
returns the folder of the cached copy instead, which loads without a request. Any answer from
the hub other than "no such model" (a file missing, a 5xx) is left to the loader, whose own
retries are for a hub that answers; :func:`one_log_line_per_record` prints those retry lines
once, not twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

from reward_server.errors import ModelLoadError

logger = logging.getLogger(__name__)

_FIX = ("Fix: set {setting} to a local model folder, or `hf download {model}` where the hub is "
        "reachable and run with that cache and HF_HUB_OFFLINE=1")


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1


def one_log_line_per_record() -> None:
    """huggingface_hub's records (its retry lines) printed once: it gives its logger a handler
    of its own and lets records propagate, so an application that configures logging (the
    server, the trainer, a Ray worker) printed each line twice. Its docs say to remove that
    handler then (``enable_propagation``); with no handler configured Python's last-resort
    handler still prints warnings, once."""
    hub_logger = logging.getLogger("huggingface_hub")
    for handler in list(hub_logger.handlers):
        if type(handler) is logging.StreamHandler:
            hub_logger.removeHandler(handler)


def _snapshot(model: str) -> str | None:
    """The cached copy's folder (the main revision), found without a request; None if none."""
    from huggingface_hub import snapshot_download

    try:
        folder = str(snapshot_download(model, local_files_only=True))
    except Exception:
        return None
    return folder if (Path(folder) / "config.json").is_file() else None


def _cached(model: str, cache: str) -> bool:
    """Whether the cache holds a snapshot of hub model ``model`` (what the loader reads offline)."""
    from huggingface_hub.file_download import repo_folder_name

    snapshots = Path(cache) / repo_folder_name(repo_id=model, repo_type="model") / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def check_model_source(model: str, *, setting: str) -> str | None:
    """Raise :class:`ModelLoadError` (one line: the model, the cause, the fix) when ``model`` is
    neither a local folder nor a hub model that this process can load; return quickly when it
    is one (or when only the loader can tell). ``setting`` names the config field (for the fix).
    Returns the folder to load instead of the name (the cached copy, when the hub cannot be
    reached), else None: load ``model`` as named.
    """
    one_log_line_per_record()
    if Path(model).expanduser().is_dir():
        return None
    if _looks_like_path(model):
        raise ModelLoadError(f"{setting}={model!r}: no such folder on this machine; give the "
                             "folder that holds the model's config.json, weights and tokenizer, "
                             "or a Hugging Face hub id (org/name)")
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # public, documented

    try:
        validate_repo_id(model)
    except HFValidationError as e:
        raise ModelLoadError(f"{setting}={model!r} is neither a folder on this machine nor a "
                             f"Hugging Face hub id ({e})") from None
    cache = constants.HF_HUB_CACHE
    if _cached(model, cache):
        return None if constants.is_offline_mode() else _cached_unless_reachable(model, setting)
    fix = _FIX.format(setting=setting, model=model)
    if constants.is_offline_mode():
        raise ModelLoadError(f"cannot load {model!r} ({setting}): HF_HUB_OFFLINE is set and it "
                             f"is not in the cache {cache}. {fix}")
    import httpx

    endpoint = constants.ENDPOINT
    timeout = constants.HF_HUB_ETAG_TIMEOUT
    try:
        get_hf_file_metadata(hf_hub_url(model, "config.json"), timeout=timeout)
    except (httpx.TransportError, OfflineModeIsEnabled) as e:  # DNS, refused, reset, timed out
        cause = " ".join(str(e).split()) or type(e).__name__
        raise ModelLoadError(
            f"cannot load {model!r} ({setting}): hub {endpoint} unreachable ({cause[:120]}) and "
            f"not in the cache {cache}. {fix}") from None
    except GatedRepoError:
        raise ModelLoadError(
            f"cannot load {model!r} ({setting}): it is a gated model on {endpoint}; accept its "
            "terms on the hub and give this process a token that may read it (HF_TOKEN), or "
            f"give {setting} as a local folder") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"cannot load {model!r} ({setting}): {endpoint} has no model of that name (a typo? "
            "a private model needs HF_TOKEN); give a hub id that exists or a local folder") from None
    except HfHubHTTPError as e:  # the hub answered (5xx, a file missing): the loader says what
        logger.debug("hub metadata for %s: %s (left to the loader)", model, e)
    except Exception as e:  # a probe that fails otherwise must not stop a model that loads
        logger.warning("could not check %s on the hub (%s: %s); loading it anyway", model,
                       type(e).__name__, e)
    return None


def _cached_unless_reachable(model: str, setting: str) -> str | None:
    """A cached model: its folder when the hub cannot be reached (one request), else None."""
    import httpx
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        get_hf_file_metadata(hf_hub_url(model, "config.json"), timeout=constants.HF_HUB_ETAG_TIMEOUT)
        return None
    except (httpx.TransportError, OfflineModeIsEnabled) as e:
        cause = " ".join(str(e).split()) or type(e).__name__
    except Exception:  # the hub answered: the loader asks it for the rest
        return None
    folder = _snapshot(model)
    if folder is not None:
        logger.warning("%s=%s: hub %s unreachable (%s); loading the cached copy %s (set "
                       "HF_HUB_OFFLINE=1 to skip this request)", setting, model,
                       constants.ENDPOINT, cause[:120], folder)
    return folder
