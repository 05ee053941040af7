"""Train a rubric generator or a personalized generator with GRPO against the reward server.

On a Ray cluster (the way to run it; the cluster must run the project's environment)::

    ray job submit --working-dir . -- python trainer/run.py --engine trl \\
        --data $PWD/data/pg --reward-server HOST:50051 --output-dir $PWD/runs --max-steps 10

    ray job submit --working-dir . -- python trainer/run.py --engine verl \\
        --preset rubric_generator --reward-server HOST:50051 --output-dir /shared/runs \\
        data.train_files=/shared/data/parl_a/train.parquet data.val_files=/shared/data/parl_a/val.parquet

verl: everything after the options is a Hydra override of verl's config (key=value).
TRL also runs directly (``python trainer/run.py --engine trl ...``; CPU is fine, SmolLM2-135M
by default), or under ``accelerate launch --config_file trainer/config/accelerate/zero2.yaml``.

Outputs land in ``<output-dir>/<run-name>/`` (absolute, printed at start and end): the model
(TRL: ``model/``, and ``checkpoint-N/`` every ``--save-steps``; verl: ``checkpoints/``),
``run_log.jsonl``, ``reward.png`` and ``provenance.json`` (the reward server's Info).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python trainer/run.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer import deps  # stdlib only: checked before anything that needs the packages

logger = logging.getLogger("trainer.run")
RAY_PACKAGE_DIR = "runtime_resources"  # Ray unpacks a job's working_dir below <session>/runtime_resources
DEFAULT_OUTPUT_DIR = Path("runs")
PROBE_TIMEOUT_S = 10.0  # = reward_server.integrations.probe.PROBE_TIMEOUT_S (not imported: stdlib first)


class UserError(SystemExit):
    """A mistake the user can fix: :func:`main` prints ``error: <message>`` (one line) and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (exit 2), not the whole usage."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="trainer/run.py", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("verl", "trl"), required=True)
    p.add_argument("--preset", choices=("rubric_generator", "personalized_generator"),
                   default="rubric_generator", help="verl: trainer/config/<preset>.yaml")
    p.add_argument("--check-config", action="store_true",
                   help="verl: compose and check the config (ours and verl's checks), print it, do not train")
    p.add_argument("--data", type=Path, help="trl: folder (or trl_train.parquet) from prepare")
    p.add_argument("--reward-server", default=os.environ.get("REWARD_SERVER_ADDRESS"),
                   help="host:port of the reward server, or several comma-separated (one ingress per "
                   "node: calls are spread round robin) (default $REWARD_SERVER_ADDRESS)")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="runs go to <output-dir>/<run-name> (default ./runs); inside a Ray job give "
                        "an absolute path (relative ones would land in Ray's package cache)")
    p.add_argument("--run-name", help="default: <engine>-<task>-<YYYYmmdd-HHMMSS>")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in an existing <output-dir>/<run-name> from its last checkpoint")
    p.add_argument("--report-to", default="none",
                   help="where metrics go besides run_log.jsonl: none, or a comma list of "
                        "tensorboard, wandb, trackio (as TRL; for verl: trainer.logger)")
    g = p.add_argument_group("TRL")
    g.add_argument("--model", help="HF id or local folder (default: local SmolLM2-135M-Instruct)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when present (accelerate launch decides under DeepSpeed)")
    g.add_argument("--max-steps", type=int, default=10)
    g.add_argument("--save-steps", type=int, default=0,
                   help="also save a checkpoint every N steps (0: only the final model)")
    g.add_argument("--learning-rate", type=float, default=1e-5)
    g.add_argument("--warmup-steps", type=int, default=0,
                   help="ramp the learning rate up from 0 over the first N steps (default 0: none, as TRL)")
    g.add_argument("--prompts-per-step", type=int, default=2)
    g.add_argument("--num-generations", type=int, default=4)
    g.add_argument("--max-completion-length", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.6)
    g.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (0: off)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-reward-prefetch", dest="reward_prefetch", action="store_false",
                   help="call the reward server after TRL's reference forward, not during it")
    g.add_argument("--eval-steps", type=int, default=0,
                   help="held-out reward (trl_val.parquet beside --data: users never trained on) "
                        "before training, every N steps and at the end (0: none)")
    g.add_argument("--eval-generations", type=int, default=8,
                   help="completions sampled per held-out prompt (default %(default)s)")
    g.add_argument("--no-eval-on-start", dest="eval_on_start", action="store_false",
                   help="with --eval-steps: skip the evaluation before training (the initial policy's, "
                        "when another run of the same seed has it)")
    g.add_argument("--no-shared-prompt", dest="share_prompt", action="store_false",
                   help="run each completion's prompt through generation's prefill and the log-prob "
                        "forwards again (TRL's own path; the default runs a group's prompt once: same "
                        "prompts, sampling and log-probs, less work)")
    g.add_argument("--profile", action="store_true",
                   help="print where each step's time goes (generate, ref_forward, reward, backward, ...; "
                        "always in run_log.jsonl as time/<section>)")
    g.add_argument("--reward-transform", choices=("none", "shuffle", "negate"), default="none",
                   help="CONTROL arms only (bench/learning.py): shuffle the step's rewards across its "
                        "completions, or flip their sign (default none)")
    r = p.add_argument_group("reward calls (both engines; verl: reward_kwargs)")
    r.add_argument("--attempts", type=int, help="tries of a call answered UNAVAILABLE or "
                   "RESOURCE_EXHAUSTED (default 5)")
    r.add_argument("--backoff-cap-s", type=float, help="longest backoff between tries (default 5)")
    r.add_argument("--deadline-s", type=float, help="one call in all, waiting for a restarting "
                   "server included (default 120)")
    r.add_argument("--probe-timeout-s", type=float, default=PROBE_TIMEOUT_S,
                   help="the start-up check of the reward server (one Info call) fails after this "
                   "many seconds (default %(default)s)")
    r.add_argument("--mask-infra-failures", action="store_true",
                   help="mask a sample whose reward call failed instead of failing it")
    return p


def run_path(args: argparse.Namespace, task: str) -> Path:
    """``<output-dir>/<run-name>``, absolute, not made yet; refuses a relative path inside a Ray
    job, an output dir that cannot be written, and an existing run (unless ``--resume``)."""
    out = (args.output_dir or DEFAULT_OUTPUT_DIR).expanduser()
    if not out.is_absolute():
        if RAY_PACKAGE_DIR in Path.cwd().parts:
            raise UserError(
                f"--output-dir {out} is relative, and this Ray job runs in Ray's package cache "
                f"({Path.cwd()}): its outputs would be deleted with it. Pass an absolute path, "
                "e.g. `--output-dir $PWD/runs` (your shell expands $PWD before submitting)."
            )
        out = Path.cwd() / out
    out = out.resolve()
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"--output-dir {out}: {existing} is a file, not a folder; pass a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--output-dir {out}: {existing} is not writable by this user; pass a "
                        "folder you can write")
    name = args.run_name or f"{args.engine}-{task}-{time.strftime('%Y%m%d-%H%M%S')}"
    if "/" in name or name in ("", ".", ".."):
        raise UserError(f"--run-name {name!r} must be a plain folder name (no '/')")
    path: Path = out / name
    if path.exists() and not args.resume:
        raise UserError(f"{path} exists: runs never overwrite each other. Pick another --run-name, "
                        "or pass --resume to continue it.")
    if args.resume and not path.is_dir():
        raise UserError(f"--resume: {path} is not a run folder; give the --run-name of an "
                        "existing run, or drop --resume")
    return path


def run_dir(args: argparse.Namespace, task: str) -> Path:
    """:func:`run_path`, made (only once every input has been checked)."""
    path = run_path(args, task)
    path.mkdir(parents=True, exist_ok=True)
    return path


def report_to(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip() and v.strip() != "none"]
    bad = sorted(set(names) - {"tensorboard", "wandb", "trackio"})
    if bad:
        raise UserError(f"--report-to: unknown {bad}; use none or tensorboard, wandb, trackio")
    return names


def budget_overrides(args: argparse.Namespace) -> dict[str, Any]:
    fields = {"attempts": args.attempts, "backoff_cap_s": args.backoff_cap_s, "deadline_s": args.deadline_s}
    return {k: v for k, v in fields.items() if v is not None}


def verl_overrides(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    prefix = "reward.custom_reward_function.reward_kwargs."
    out = list(overrides)

    def given(key: str) -> bool:
        return any(o.lstrip("+").startswith(key + "=") for o in out)

    if args.reward_server and not given(prefix + "reward_server"):
        # quoted: Hydra would read "a:p,b:q" (several ingresses) as a sweep
        out.append(f"{prefix}reward_server='{args.reward_server}'")
    for key, value in budget_overrides(args).items():
        if not given(prefix + key):
            out.append(f"{prefix}{key}={value}")
    if args.probe_timeout_s != PROBE_TIMEOUT_S and not given(prefix + "probe_timeout_s"):
        out.append(f"{prefix}probe_timeout_s={args.probe_timeout_s}")
    if args.mask_infra_failures:
        out += [f"{prefix}mask_infra_failures=true", "algorithm.adv_estimator=grpo_masked"]
    if args.report_to != "none" and not given("trainer.logger"):
        out.append(f"trainer.logger=[console,{','.join(report_to(args.report_to))}]")
    return out


def one_line(message: str) -> str:
    """A message for one stderr line (Hydra's and OmegaConf's span several); a list of several
    problems (``\n  - ...``) keeps its lines."""
    if "\n  - " in message:
        return message
    skip = ("full_key:", "object_type", "reference_type", "Set the environment variable HYDRA_FULL_ERROR")
    return " ".join(ln.strip() for ln in message.splitlines() if ln.strip() and not ln.strip().startswith(skip))


def main_verl(args: argparse.Namespace, overrides: list[str]) -> int:
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import OmegaConfBaseException

    from reward_server.config import ConfigError
    from reward_server.integrations.probe import ServerUnreachable
    from trainer import verl_runner

    overrides = verl_overrides(args, overrides)
    # the server first when --reward-server names it: composing verl's config imports verl (slow)
    early = probe_server(args) if args.reward_server and not args.check_config else None
    try:
        config = verl_runner.compose(args.preset, overrides)
        if args.check_config:
            from omegaconf import OmegaConf, open_dict

            verl_runner.check(config, args.preset)
            if args.output_dir is not None:  # where this run's checkpoints would go
                with open_dict(config):
                    config.trainer.default_local_dir = str(run_path(args, args.preset) / "checkpoints")
            sys.stdout.write(OmegaConf.to_yaml(config))
            print(f"verl config of preset {args.preset!r} is valid", file=sys.stderr)
            return 0
        path = run_path(args, args.preset)  # checked, made only once the inputs are
        verl_runner.check_inputs(config)
        verl_runner.check(config, args.preset)
        provenance = early or verl_runner.probe(config, timeout_s=args.probe_timeout_s)
    except (ConfigError, ServerUnreachable, ConfigCompositionException, OmegaConfBaseException) as e:
        raise UserError(one_line(str(e))) from None
    path.mkdir(parents=True, exist_ok=True)
    print(f"run directory: {path}", flush=True)
    try:  # verl's own errors while training keep their traceback
        verl_runner.run(args.preset, overrides, run_dir=path, provenance=provenance)
    except ConfigError as e:
        raise UserError(one_line(str(e))) from None
    plot_verl(args.preset, overrides, path)
    print(f"checkpoints: {path / 'checkpoints'}\nrun log:     {path / 'run_log.jsonl'}\n"
          f"plot:        {path / 'reward.png'}\nprovenance:  {path / 'provenance.json'}", flush=True)
    return 0


def plot_verl(preset: str, overrides: list[str], path: Path) -> None:
    """The reward plot of a verl run, titled with its reward kinds and models."""
    from trainer import verl_runner
    from trainer.run_log import data_kinds, plot_rewards, plot_title

    config = verl_runner.compose(preset, overrides)
    train = config.data.train_files
    files = [train] if isinstance(train, str) else [str(f) for f in train]  # str or ListConfig
    kinds = sorted({k for f in files if Path(f).is_file() for k in data_kinds(Path(f))})
    title = plot_title(f"verl ({preset})", kinds=kinds,
                       policy=str(config.actor_rollout_ref.model.path), run_dir=path)
    plot_rewards(path / "run_log.jsonl", path / "reward.png", title=title)


def trl_data(data: Path | None) -> Path:
    """The TRL parquet ``--data`` names (a folder holding ``trl_train.parquet``, or the file),
    checked: it exists and has the columns the reward needs."""
    if data is None:
        raise UserError("--engine trl needs --data: the folder `python -m trainer.data.prepare` "
                        "wrote (or its trl_train.parquet)")
    path = data.expanduser().resolve()
    file = path / "trl_train.parquet" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"--data {data}: no {'trl_train.parquet in that folder' if path.is_dir() else 'such file'}; "
                        "prepare it with `python -m trainer.data.prepare --out DIR` and pass --data DIR")
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(file).names
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not parquet
        raise UserError(f"--data {file}: not a parquet file ({' '.join(str(e).split())}); prepare "
                        "it with `python -m trainer.data.prepare`") from None
    lacking = [c for c in ("prompt", "extra_info_json") if c not in names]
    if lacking:
        raise UserError(f"--data {file}: no column {', '.join(lacking)} (it has {', '.join(names)}); "
                        "prepare it with `python -m trainer.data.prepare`")
    return path


def model_problem(model: str | None) -> str | None:
    """A one-line complaint about ``--model`` when it is a local path that holds no model."""
    if model is None:
        return None
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            return f"--model {model}: no config.json there; give a Hugging Face model folder or id"
        return None
    if model.startswith(("/", ".", "~")) or model.count("/") > 1 or model.endswith("/"):
        return f"--model {model}: no such folder; give a Hugging Face model folder or id (org/name)"
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(model, "config.json"), str):
        return (f"--model {model}: not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
                "download it first (`hf download MODEL`) or give a local model folder")
    return None


def check_trl_args(args: argparse.Namespace) -> None:
    positive = {"--max-steps": args.max_steps, "--prompts-per-step": args.prompts_per_step,
                "--max-completion-length": args.max_completion_length,
                "--learning-rate": args.learning_rate, "--temperature": args.temperature,
                "--probe-timeout-s": args.probe_timeout_s}
    for flag, value in positive.items():
        if not value > 0:
            raise UserError(f"{flag} must be > 0 (got {value})")
    if args.num_generations < 2:
        raise UserError(f"--num-generations must be >= 2: GRPO compares completions of one prompt "
                        f"(got {args.num_generations})")
    if args.save_steps < 0 or args.warmup_steps < 0:
        raise UserError(f"--save-steps and --warmup-steps must be >= 0 (got {args.save_steps}, {args.warmup_steps})")
    if args.eval_steps < 0 or args.top_k < 0:
        raise UserError(f"--eval-steps and --top-k must be >= 0 (got {args.eval_steps}, {args.top_k})")
    if args.eval_steps and args.eval_generations < 2:
        raise UserError(f"--eval-generations must be >= 2: the held-out standard error needs two "
                        f"completions of a prompt (got {args.eval_generations})")


def server_token() -> str | None:
    """The reward server's bearer token: the file $REWARD_SERVER_TOKEN_FILE (or the value
    $REWARD_SERVER_TOKEN); a named file that gives none is a UserError."""
    from reward_server.client import TokenFileError, bearer_token

    try:
        return bearer_token()
    except TokenFileError as e:
        raise UserError(str(e)) from None


def probe_server(args: argparse.Namespace) -> dict[str, Any]:
    """The reward server's Info within --probe-timeout-s, as provenance; UserError otherwise."""
    import dataclasses

    from reward_server.integrations.probe import ServerUnreachable, address_problem, probe_blocking

    problem = address_problem(args.reward_server)
    if problem:
        raise UserError(problem)
    try:
        info = probe_blocking(args.reward_server, token=server_token(),
                              timeout_s=args.probe_timeout_s)
    except ServerUnreachable as e:
        raise UserError(str(e)) from None
    return {"reward_server": args.reward_server, **dataclasses.asdict(info)}


def log_provenance(provenance: dict[str, Any]) -> None:
    """The server's Info, logged once the run starts (not before a mistake found later)."""
    logger.info("reward provenance: api %s server %s judge %s nli %s templates %s",
                provenance.get("api_version"), provenance.get("server_version"),
                provenance.get("judge_model"), provenance.get("nli_model"),
                provenance.get("template_versions"))


def main_trl(args: argparse.Namespace) -> int:
    """Every input checked (data, model, output dir, server) before the run folder is made."""
    from reward_server.client import RetryBudget

    if not args.reward_server:
        raise UserError("--engine trl needs --reward-server HOST:PORT (or $REWARD_SERVER_ADDRESS)")
    data = trl_data(args.data)
    problem = model_problem(args.model)
    if problem:
        raise UserError(problem)
    check_trl_args(args)
    val = (data if data.is_dir() else data.parent) / "trl_val.parquet"
    if args.eval_steps and not val.is_file():
        raise UserError(f"--eval-steps: no held-out split {val}; prepare the data with --val-size 1 "
                        "or more (the default), or drop --eval-steps")
    names = report_to(args.report_to)
    try:
        retry = RetryBudget(**budget_overrides(args))
    except ValueError as e:
        raise UserError(f"reward call budget: {e}") from None
    path = run_path(args, args.data.name)
    provenance = probe_server(args)
    from trainer.trl_runner import TrlRunSettings, run_trl

    path.mkdir(parents=True, exist_ok=True)
    print(f"run directory: {path}", flush=True)
    log_provenance(provenance)
    result = run_trl(TrlRunSettings(
        data=data, output_dir=path, reward_server=args.reward_server,
        model=args.model, device=args.device, max_steps=args.max_steps, save_steps=args.save_steps,
        learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        temperature=args.temperature, seed=args.seed, report_to=names, retry=retry,
        token=server_token(), mask_infra_failures=args.mask_infra_failures,
        resume=args.resume, probe_timeout_s=args.probe_timeout_s, provenance=provenance,
        prefetch_reward=args.reward_prefetch, share_prompt=args.share_prompt, profile=args.profile,
        reward_transform=args.reward_transform, top_k=args.top_k, eval_steps=args.eval_steps,
        eval_generations=args.eval_generations, eval_on_start=args.eval_on_start,
    ))
    if result["model"] is not None:  # on the main process
        print(f"model:      {result['model']}\nrun log:    {result['log']}\nplot:       {result['plot']}"
              f"\nprovenance: {result['provenance_path']}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = parser().parse_known_args(argv)
    problem = deps.check(args.engine)
    if problem:
        print(problem, file=sys.stderr)
        return 3
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.engine == "verl":
            return main_verl(args, overrides)
        if overrides:
            parser().error(f"unrecognized arguments for --engine trl: {' '.join(overrides)}")
        return main_trl(args)
    except UserError as e:
        print(f"error: {e.code}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
