"""Our consistency checks of a composed verl config, beyond verl's own ``validate_config``.

verl 0.9.1 checks batch divisibility only without dynamic batch sizes, never compares its token
budgets with the sequence length (a budget below one padded sequence fails the first update, in
``utils/seqlen_balancing.py``'s ``rearrange_micro_batches``), and starts a run whose validation
files repeat its training rows. Each function returns one message per problem, naming the keys,
their values and the fix; :func:`trainer.verl_runner.check` refuses the config when any is found.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
PREPARE = "python -m trainer.data.prepare ... --val-size N"


def _get(node: Any, dotted: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    value = OmegaConf.select(node, dotted, default=default)
    return default if value is None else value


def _ulysses(config: Any, role: str) -> int:
    """The sequence-parallel size of a role (the deprecated role key or its fsdp_config's)."""
    return max(int(_get(config, f"{role}.ulysses_sequence_parallel_size", 1)),
               int(_get(config, f"{role}.fsdp_config.ulysses_sequence_parallel_size", 1)))


def sequence_length(config: Any) -> int:
    return int(config.data.max_prompt_length) + int(config.data.max_response_length)


def token_budget_problems(config: Any) -> list[str]:
    """Every token budget must hold one whole sequence (prompt + response)."""
    need = sequence_length(config)
    lengths = (f"data.max_prompt_length + data.max_response_length = {config.data.max_prompt_length}"
               f" + {config.data.max_response_length} = {need}")
    out = []
    budgets = [  # (switch, budget key, role whose sequence parallelism splits a sequence)
        (f"{ACTOR}.use_dynamic_bsz", f"{ACTOR}.ppo_max_token_len_per_gpu", ACTOR),
        (f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu", ACTOR),
        (f"{REF}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_max_token_len_per_gpu", REF),
    ]
    for switch, key, role in budgets:
        if not _get(config, switch, False):
            continue
        budget, sp = int(_get(config, key, 0)), _ulysses(config, role)
        if budget * sp < need:
            per_gpu = -(-need // sp)
            out.append(f"{key}={budget} (x ulysses {sp}) < {lengths}: verl packs whole sequences into "
                       f"micro-batches of this many tokens and asserts one fits, failing the first "
                       f"step. Set {key}={2 * per_gpu} (two sequences) or at least {per_gpu}.")
    model_len = _get(config, f"{ROLLOUT}.max_model_len")
    if model_len is not None and int(model_len) < need:
        out.append(f"{ROLLOUT}.max_model_len={model_len} < {lengths}: vLLM would refuse or cut "
                   f"the longest rollouts. Set {ROLLOUT}.max_model_len={need}.")
    batched = _get(config, f"{ROLLOUT}.max_num_batched_tokens")
    if batched is not None and int(batched) < need:
        chunked = bool(_get(config, f"{ROLLOUT}.enable_chunked_prefill", True))
        why = ("a prompt is prefilled only in chunks" if chunked else
               "verl raises it to max_model_len behind your back (chunked prefill is off)")
        out.append(f"{ROLLOUT}.max_num_batched_tokens={batched} < {lengths}: {why}. Set "
                   f"{ROLLOUT}.max_num_batched_tokens={need}, as verl's long-context examples do.")
    return out


def _multiple_hint(per_unit: int, divisor: int) -> int:
    """The smallest count c > 0 with c * per_unit divisible by ``divisor``."""
    return divisor // math.gcd(per_unit, divisor)


def batch_problems(config: Any) -> list[str]:
    """Batch sizes that divide evenly over the configured GPUs and into each other."""
    gpus = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    where = (f"trainer.n_gpus_per_node x trainer.nnodes = {config.trainer.n_gpus_per_node} x "
             f"{config.trainer.nnodes} = {gpus} GPUs")
    n = int(_get(config, f"{ROLLOUT}.n", 1))
    train = int(config.data.train_batch_size)
    mini = int(_get(config, f"{ACTOR}.ppo_mini_batch_size", train))
    out = []
    if train < mini or train % mini:
        out.append(f"data.train_batch_size={train} is not a multiple of {ACTOR}.ppo_mini_batch_size="
                   f"{mini}: a step must split into whole updates. Make train_batch_size a "
                   f"multiple of ppo_mini_batch_size (e.g. {ACTOR}.ppo_mini_batch_size={train}).")
    sp = _ulysses(config, ACTOR)
    if gpus % sp:
        out.append(f"{where} do not divide by {ACTOR} ulysses_sequence_parallel_size={sp}. Use a "
                   "sequence-parallel size that divides the GPU count.")
        return out
    dp = gpus // sp
    for name, prompts in (("data.train_batch_size", train), (f"{ACTOR}.ppo_mini_batch_size", mini)):
        if prompts * n % dp:
            fit = _multiple_hint(n, dp)
            out.append(f"{name} x {ROLLOUT}.n = {prompts} x {n} = {prompts * n} samples do not split "
                       f"evenly over {dp} data-parallel ranks ({where}, ulysses {sp}): verl pads "
                       f"the batch with no-op samples or leaves ranks short. Make {name} a "
                       f"multiple of {fit}, or change the GPU count.")
    if not _get(config, f"{ACTOR}.use_dynamic_bsz", False) and mini * n % dp == 0:
        micro = int(_get(config, f"{ACTOR}.ppo_micro_batch_size_per_gpu", 1))
        per_gpu = mini * n // dp
        if per_gpu % micro:
            out.append(f"{ACTOR}.ppo_micro_batch_size_per_gpu={micro} does not divide the "
                       f"{per_gpu} samples each GPU gets per mini-batch ({mini} x {n} / {dp}). "
                       f"Use a divisor of {per_gpu}, or {ACTOR}.use_dynamic_bsz=true.")
    tp = int(_get(config, f"{ROLLOUT}.tensor_model_parallel_size", 1))
    replica = (tp * int(_get(config, f"{ROLLOUT}.data_parallel_size", 1))
               * int(_get(config, f"{ROLLOUT}.pipeline_model_parallel_size", 1)))
    if gpus % replica:
        out.append(f"{where} are not a multiple of one vLLM replica's {replica} GPUs ({ROLLOUT}."
                   f"tensor_model_parallel_size x data_parallel_size x pipeline_model_parallel_size"
                   f"): verl starts {gpus // replica} replica(s) and leaves the rest idle. Set "
                   f"{ROLLOUT}.tensor_model_parallel_size to a divisor of {gpus}.")
    return out


def logger_problems(config: Any) -> list[str]:
    from verl.utils.tracking import Tracking

    loggers = config.trainer.logger
    names = [loggers] if isinstance(loggers, str) else [str(x) for x in loggers]
    bad = [x for x in names if x not in Tracking.supported_backend]
    if not bad:
        return []
    return [f"trainer.logger={names}: {bad} not verl loggers (verl stops at its first step); "
            f"choose from {Tracking.supported_backend}, or pass trainer/run.py --report-to"]


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def _row_digests(paths: Iterable[Path], column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    for path in paths:
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(columns=[column], batch_size=1024):
            for value in batch.column(0).to_pylist():
                text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
                yield hashlib.sha256(text.encode()).hexdigest()


def validation_problems(config: Any) -> list[str]:
    """Validation on needs a val split that is not a copy of training rows (compared by the
    prompt column, when both files are readable here; otherwise a warning says so)."""
    testing = int(_get(config, "trainer.test_freq", -1)) > 0 or bool(
        _get(config, "trainer.val_before_train", False))
    if not testing:
        return []
    train, val = _files(config.data.get("train_files")), _files(config.data.get("val_files"))
    if not val:
        return [f"data.val_files is not set but validation is on (trainer.test_freq="
                f"{config.trainer.test_freq}, trainer.val_before_train="
                f"{config.trainer.val_before_train}). Prepare a held-out split ({PREPARE}) and "
                "pass its val.parquet, or turn validation off: trainer.test_freq=-1 "
                "trainer.val_before_train=false."]
    same = sorted(set(train) & set(val))
    if same:
        return [f"data.val_files and data.train_files both name {same}: validation would score "
                f"training rows. Hold out users ({PREPARE}) and pass its val.parquet."]
    paths = [Path(p).expanduser() for p in (*train, *val)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        logger.warning("data files not found here, so not compared for copied rows: %s", missing)
        return []
    column = str(_get(config, "data.prompt_key", "prompt"))
    seen = set(_row_digests(paths[: len(train)], column))
    digests = list(_row_digests(paths[len(train):], column))
    copies = sum(d in seen for d in digests)
    if not copies:
        return []
    return [f"data.val_files: {copies} of {len(digests)} rows repeat a row of data.train_files "
            f"(same {column!r}): validation would measure training prompts, not held-out users. "
            f"Prepare a held-out split ({PREPARE}; the default holds out 1 user per source) and "
            "pass its val.parquet."]


def row_problems(config: Any) -> list[str]:
    """Each data file readable here must hold rows of the current row contract (one prepared
    before it would fail every reward call): the first row of each is read."""
    from trainer.data.prepare import check_prepared

    out = []
    for f in (*_files(config.data.get("train_files")), *_files(config.data.get("val_files"))):
        path = Path(f).expanduser()
        if path.is_file():
            try:
                check_prepared(path)
            except ValueError as e:  # ExtraInfoError is one
                out.append(str(e))
    return out


def consistency_problems(config: Any) -> list[str]:
    """All of the above."""
    return [*token_budget_problems(config), *batch_problems(config), *logger_problems(config),
            *validation_problems(config)]
