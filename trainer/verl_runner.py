"""The verl engine: compose verl's Hydra config with our overlays and call verl's own entry.

Nothing of verl's training loop is copied: :func:`compose` builds the config from
``trainer/config/<preset>.yaml`` (whose defaults list starts with verl's ``ppo_trainer``),
:func:`check` runs our checks and verl's own ``validate_config``, and :func:`run` hands the
result to ``verl.trainer.main_ppo.run_ppo`` with verl's TaskRunner. Our pieces reach verl
through its own extension points: the reward function and the replay buffer by package path
(``reward_server.integrations.verl`` / ``.verl_sampler``), the ``grpo_masked`` estimator
through ``VERL_USE_EXTERNAL_MODULES`` in the Ray runtime env (every verl process imports it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from reward_server.config import ConfigError
from trainer import verl_checks

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "config"
PRESETS = ("rubric_generator", "personalized_generator")
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
REWARD_MODULE = "reward_server.integrations.verl"
SAMPLER_MODULE = "reward_server.integrations.verl_sampler"
SAMPLERS = {"sync": "RewardReplayBuffer", "colocate_async": "RewardReplayBufferAsync",
            "separate_async": "RewardReplayBufferAsync"}
_HYDRA_KEYS = ("hydra", "defaults")
# read by verl (``reward.py``: ``reward_fn_config.get("reward_kwargs", {})``) but not declared in
# its config; :func:`problems` checks these names against compute_score's signature instead
FREE_FORM = ("reward.custom_reward_function.reward_kwargs",)


def compose(preset: str, overrides: Sequence[str] = (), *, config_dir: Path = CONFIG_DIR) -> Any:
    """verl's ``ppo_trainer`` + ``<config_dir>/<preset>.yaml`` + Hydra ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {PRESETS}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name=preset, overrides=list(overrides))


def overlay_files(preset: str, config_dir: Path = CONFIG_DIR) -> list[Path]:
    """Our YAML files a preset composes: the preset and the non-verl items of its defaults."""
    import yaml

    path = config_dir / f"{preset}.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    names = [d for d in raw.get("defaults", []) if isinstance(d, str) and d not in ("_self_",)]
    return [path, *(config_dir / f"{n}.yaml" for n in names if (config_dir / f"{n}.yaml").is_file())]


def _paths(node: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _paths(value, path + ".")
        else:
            yield path


@functools.cache
def _verl_ppo_trainer() -> Any:
    """verl's own ``ppo_trainer`` config as plain containers (read only): installed files, so
    composed once per process (a Hydra compose parses ~30 YAML files: ~1 s on this CPU, and each
    ``problems`` call needs it)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return OmegaConf.to_container(hydra_compose(config_name="ppo_trainer"), resolve=False)


def unknown_overlay_keys(preset: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """Keys our overlay files set that verl's ``ppo_trainer`` config does not have.

    Hydra refuses unknown keys on the command line but merges those from config files, so a
    misspelt ``rollout.temprature`` in an overlay would pass ``validate_config``. Keys below a
    mapping verl leaves empty (``sampler_kwargs: {}``) and below :data:`FREE_FORM` are free-form.
    """
    import yaml
    from omegaconf import DictConfig

    base = _verl_ppo_trainer()
    bad = []
    for path in overlay_files(preset, config_dir):
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for key in _paths({k: v for k, v in raw.items() if k not in _HYDRA_KEYS}):
            if any(key.startswith(f + ".") for f in FREE_FORM):
                continue
            node: Any = base
            for part in key.split("."):
                if isinstance(node, dict | DictConfig) and not node:
                    break  # free-form mapping
                if not isinstance(node, dict) or part not in node:
                    bad.append(f"{path.name}: {key}")
                    break
                node = node[part]
    return bad


def problems(config: Any, preset: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """What our checks find wrong with a composed config (empty: fine): overlay keys, the
    estimator, reward kwargs and sampler here; token budgets, batch arithmetic, loggers and the
    validation split in :mod:`trainer.verl_checks`."""
    from verl.trainer.ppo import core_algos

    import reward_server.integrations.verl as reward  # registers grpo_masked

    out = [f"{k}: not a key of verl's ppo_trainer config (misspelt?)"
           for k in unknown_overlay_keys(preset, config_dir)]
    est = str(config.algorithm.adv_estimator)
    if est not in core_algos.ADV_ESTIMATOR_REGISTRY:
        out.append(f"algorithm.adv_estimator={est!r} is not a registered estimator; choose one of "
                   f"{sorted(core_algos.ADV_ESTIMATOR_REGISTRY)}")
    fn = config.reward.custom_reward_function
    ours = str(fn.path or "") == f"pkg://{REWARD_MODULE}"
    kwargs = dict(fn.get("reward_kwargs") or {})
    if ours:
        unknown = sorted(set(kwargs) - reward.reward_kwarg_names())
        if unknown:
            out.append(f"reward.custom_reward_function.reward_kwargs: unknown {unknown}; known: "
                       f"{sorted(reward.reward_kwarg_names())}")
        out += verl_checks.row_problems(config)
    if kwargs.get("mask_infra_failures") and est != reward.MASKED_ESTIMATOR:
        out.append(f"reward_kwargs.mask_infra_failures=true needs algorithm.adv_estimator="
                   f"{reward.MASKED_ESTIMATOR} (got {est!r}: a masked NaN score would turn its group NaN)")
    sampler = config.trainer.v1.sampler.custom_sampler
    if str(sampler.path or "") == f"pkg://{SAMPLER_MODULE}":
        mode = str(config.trainer.v1.trainer_mode)
        want = SAMPLERS.get(mode)
        if want is not None and sampler.name != want:
            out.append(f"trainer.v1.sampler.custom_sampler.name={sampler.name!r} does not fit "
                       f"trainer.v1.trainer_mode={mode!r}; use {want!r}")
        groups = config.algorithm.get("filter_groups")
        if groups is not None and groups.get("enable", False):
            out.append("algorithm.filter_groups (DAPO) is not supported with our replay buffer "
                       f"({SAMPLER_MODULE}); unset trainer.v1.sampler.custom_sampler.path")
    return out + verl_checks.consistency_problems(config)


def validate(config: Any) -> None:
    """verl's own checks (batch sizes, GPU counts, ...), as ``main_ppo`` runs them."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )


def check(config: Any, preset: str, config_dir: Path = CONFIG_DIR) -> None:
    """Our checks, then verl's; raise :class:`ConfigError` listing every problem found."""
    found = problems(config, preset, config_dir)
    if len(found) == 1:  # one problem, one line
        raise ConfigError(f"verl config of preset {preset!r}: {found[0]}")
    if found:
        raise ConfigError("verl config of preset {!r}:\n  - {}".format(preset, "\n  - ".join(found)))
    try:
        validate(config)
    except (ValueError, AssertionError) as e:  # verl's own checks raise these
        raise ConfigError(f"verl config of preset {preset!r} (verl's validate_config): "
                          f"{' '.join(str(e).split())}") from None


def _job_env_vars() -> dict[str, str]:
    """env_vars of the Ray job's own runtime env (``ray job submit --runtime-env-json``)."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    job = json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR, "{}"))
    return dict((job.get("runtime_env") or {}).get("env_vars") or {})


def set_ray_env(config: Any, env: Mapping[str, str]) -> None:
    """Give every verl process (TaskRunner, workers) these env vars, through verl's
    ``ray_kwargs.ray_init.runtime_env``. A variable the job's own runtime env already sets is
    left to it (Ray refuses to merge the same key twice)."""
    from omegaconf import open_dict

    job = _job_env_vars()
    with open_dict(config):
        init = config.ray_kwargs.ray_init
        if init.get("runtime_env") is None:
            init.runtime_env = {}
        if init.runtime_env.get("env_vars") is None:
            init.runtime_env.env_vars = {}  # (DictConfig.setdefault returns a detached copy)
        for key, value in env.items():
            if key not in job:
                init.runtime_env.env_vars[key] = value


def external_modules() -> str:
    current = [m for m in os.environ.get(EXTERNAL_MODULES_ENV, "").split(",") if m]
    return ",".join(current if REWARD_MODULE in current else [*current, REWARD_MODULE])


def configure_run(config: Any, run_dir: Path) -> None:
    """Checkpoints, run log (verl's file logger), TensorBoard events and the validations'
    completions (``heldout/<step>.jsonl``, unless ``trainer.validation_data_dir`` is set; read
    by ``python -m trainer.heldout``) under ``run_dir``."""
    from omegaconf import open_dict

    with open_dict(config):
        config.trainer.default_local_dir = str(run_dir / "checkpoints")
        if not config.trainer.get("validation_data_dir"):
            config.trainer.validation_data_dir = str(run_dir / "heldout")
        loggers = list(config.trainer.logger)
        if "file" not in loggers:
            loggers.append("file")
        config.trainer.logger = loggers
    set_ray_env(config, {
        EXTERNAL_MODULES_ENV: external_modules(),
        "VERL_FILE_LOGGER_PATH": str(run_dir / "run_log.jsonl"),
        "TENSORBOARD_DIR": str(run_dir / "tensorboard"),
    })


def retry_budget(config: Any) -> Any:
    """The client budget the reward kwargs set (used for the Info call too)."""
    from reward_server.client import RetryBudget

    kw = dict(config.reward.custom_reward_function.get("reward_kwargs") or {})
    fields = {f.name for f in dataclasses.fields(RetryBudget)}
    return RetryBudget(**{k: v for k, v in kw.items() if k in fields and v is not None})


def check_inputs(config: Any) -> None:
    """The data files a run reads exist (remote ``scheme://`` paths are left to verl), and a
    local policy model folder holds a model: :class:`ConfigError` (one line) otherwise."""
    for key in ("train_files", "val_files"):
        value = config.data.get(key)
        files = [] if value is None else [value] if isinstance(value, str) else [str(f) for f in value]
        for f in files:
            if "://" not in f and not Path(f).expanduser().is_file():
                raise ConfigError(f"data.{key}: {f} does not exist; prepare it with `python -m "
                                  f"trainer.data.prepare --out DIR` and pass data.{key}=DIR/...parquet")
    model = str(config.actor_rollout_ref.model.path)
    if model.startswith(("/", ".", "~")) and not (Path(model).expanduser() / "config.json").is_file():
        raise ConfigError(f"actor_rollout_ref.model.path: {model} holds no Hugging Face model "
                          "(no config.json); pass a model folder or id")


def _address_and_token(config: Any) -> tuple[str, str | None]:
    kw = dict(config.reward.custom_reward_function.get("reward_kwargs") or {})
    address = kw.get("reward_server") or os.environ.get("REWARD_SERVER_ADDRESS")
    if not address:
        raise ConfigError("no reward server address: pass --reward-server HOST:PORT (or set "
                          "$REWARD_SERVER_ADDRESS)")
    from reward_server.client import TOKEN_ENV, bearer_token

    # $token_env, else the file $<token_env>_FILE (a TokenFileError is a ConfigError)
    return str(address), bearer_token(str(kw.get("token_env") or TOKEN_ENV))


def probe(config: Any, *, timeout_s: float | None = None) -> dict[str, Any]:
    """The reward server's ``Info`` as provenance, asked once with the start-up probe's own
    deadline (``timeout_s``, else ``reward_kwargs.probe_timeout_s``, else 10 s): an unreachable
    server fails here, in seconds, with one line (:class:`ServerUnreachable`)."""
    from reward_server.integrations.probe import PROBE_TIMEOUT_S, address_problem, probe_blocking

    address, token = _address_and_token(config)
    problem = address_problem(address)
    if problem:
        raise ConfigError(problem)
    kw = dict(config.reward.custom_reward_function.get("reward_kwargs") or {})
    timeout = timeout_s if timeout_s is not None else float(kw.get("probe_timeout_s") or PROBE_TIMEOUT_S)
    info = probe_blocking(address, token=token, timeout_s=timeout)
    return {"reward_server": address, **dataclasses.asdict(info)}


def log_provenance(config: Any, run_dir: Path, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``provenance.json`` (the reward server's ``Info``: :func:`probe` unless given),
    before verl starts: an unreachable server fails the run here, not after model loading."""
    provenance = provenance if provenance is not None else probe(config)
    (run_dir / "provenance.json").write_text(json.dumps(provenance, indent=2, default=str))
    logger.info("reward provenance: api %s server %s judge %s nli %s templates %s",
                provenance.get("api_version"), provenance.get("server_version"),
                provenance.get("judge_model"), provenance.get("nli_model"),
                provenance.get("template_versions"))
    return provenance


def run(preset: str, overrides: Sequence[str], *, run_dir: Path,
        provenance: dict[str, Any] | None = None) -> None:
    """Compose, check and train with verl (GPU cluster or node; see the README recipe)."""
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    config = compose(preset, overrides)
    auto_set_device(config)
    check(config, preset)
    configure_run(config, run_dir)
    log_provenance(config, run_dir, provenance)
    runner: Any
    if config.trainer.use_v1:
        from verl.trainer import main_ppo

        runner = main_ppo.TaskRunnerV1
    else:  # verl's legacy trainer (trainer.use_v1=false)
        from verl.trainer import main_ppo_v0

        runner = main_ppo_v0.TaskRunner
    logger.info("verl preset %s, reward fn %s, reward kwargs %s, checkpoints %s", preset,
                config.reward.custom_reward_function.path,
                dict(config.reward.custom_reward_function.reward_kwargs),
                config.trainer.default_local_dir)
    run_ppo(config, task_runner_class=runner)
