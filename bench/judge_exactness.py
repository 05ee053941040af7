"""Exactness of p_yes per judge engine and method, against the transformers judge (the exact
value: logits of every variant id) on the same SmolLM2 weights (fp32, CPU) and prompts (the
judge prompts of the default template; the line to record in docs/parl.md names it and its digest).

Runs in the serving venv (``make venv-vllm``), where vLLM's CPU build is installed. Loads the
transformers judge, one in-process vLLM engine and vLLM's OpenAI-compatible API server on
loopback, then scores the same prompts with each method and prints, per method, the largest
|p - p_transformers| and how many prompts had a variant (or a whole answer) outside the natural
top 20:

* transformers, prefix-KV sharing (the engine's default path) vs its full-prompt path;
* vllm (in-process): ``logprob_token_ids``;
* openai -> vLLM 0.32: ``logprob_token_ids`` through the API;
* openai -> older vLLM: the same server behind a loopback proxy that drops
  ``logprob_token_ids`` (what a server without the field does), so the engine forces each
  missing variant with ``allowed_token_ids``;
* openai, no vLLM extensions (the plain OpenAI API's case): the midpoint of the bound, and the
  bound's largest half-width.

    VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python bench/judge_exactness.py
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reward_server.backends.base import JudgePrompt
from reward_server.backends.openai_judge import OpenAIJudge
from reward_server.backends.smollm2 import local_smollm2_path
from reward_server.backends.transformers_judge import TransformersJudge
from reward_server.backends.yes_no import answer_vocab
from reward_server.domain import Task
from reward_server.rubric.templates import DEFAULT_TEMPLATE, judge_prompts, template_digest

TEXTS = [
    ("Blender X200, 5 stars", "honestly love it. cheap, loud, works. five stars."),
    ("Toaster T1, 1 star", "Terrible! It burnt my bread twice and the lever broke after a week."),
    ("Kettle K9, 4 stars", "Boils a liter in under three minutes. The handle gets warm, though."),
    ("Headphones, 3 stars", "Sound is fine for the price; the ear pads wore out in two months."),
]
RULES = (
    "The review is written in lowercase letters.",
    "The review mentions the price.",
    "The review ends with an exclamation mark.",
    "The review gives a star rating.",
    "The review complains about durability.",
)
FREE = [
    "Say Yes.",
    "Say the word 'No' and nothing else.",
    "What is the opposite of 'no'? Reply with one word.",
    "Translate to English: 'Nein'. Reply with one word.",
    "Write a haiku about the sea.",
]
PROMPTS = [p for ctx, text in TEXTS for p in judge_prompts(ctx, text, RULES, Task.AMAZON)] + [
    JudgePrompt("You are a helpful assistant.", "", q) for q in FREE
]
EXTENSIONS = ("logprob_token_ids",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_api_server(model: str, port: int, log: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--enable-prefix-caching",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"vLLM API server did not start; see {log}") from None
            time.sleep(1.0)


def dropping_proxy(upstream: str, drop: Sequence[str]) -> tuple[ThreadingHTTPServer, str, list[int]]:
    """A loopback proxy to ``upstream`` that removes the ``drop`` fields from request bodies;
    the list counts the requests it forwarded."""
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            for name in drop:
                body.pop(name, None)
            count[0] += 1
            req = urllib.request.Request(
                upstream + self.path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                data = resp.read()
                self.send_response(resp.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", count


def top20_misses(base: str, vocab: dict[str, int]) -> tuple[int, int, list[float]]:
    """(prompts with some variant outside the server's top 20, prompts with a whole answer
    outside, per prompt the half-width of the p_yes bound a top-20 read allows)."""
    from reward_server.backends.yes_no import chat_messages, p_yes_bounds, side_of

    some = whole = 0
    widths: list[float] = []
    for p in PROMPTS:
        body = {"model": "smollm2", "messages": chat_messages(p.system, p.prefix + p.suffix), "max_tokens": 1,
                "temperature": 0.0, "logprobs": True, "top_logprobs": 20, "return_tokens_as_token_ids": True}
        req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            top = json.load(resp)["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        lps = {int(e["token"].split(":")[1]): float(e["logprob"]) for e in top}
        listed = set(lps)
        sides = {w: {i for s, i in vocab.items() if side_of(s) == w} for w in ("yes", "no")}
        some += not set(vocab.values()) <= listed
        whole += any(not ids & listed for ids in sides.values())
        known = {w: [lps[i] for i in ids if i in lps] for w, ids in sides.items()}
        lo, hi = p_yes_bounds(known["yes"], known["no"], cap=min(lps.values()),
                              missing_yes=len(sides["yes"]) - len(known["yes"]),
                              missing_no=len(sides["no"]) - len(known["no"]))
        widths.append((hi - lo) / 2)
    return some, whole, widths


def max_dp(got: Sequence[float], want: Sequence[float]) -> float:
    return max(abs(a - b) for a, b in zip(got, want, strict=True))


async def main() -> None:
    from reward_server.backends.vllm_judge import VLLMJudge

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    path = str(local_smollm2_path())
    ref = TransformersJudge(path, device="cpu", dtype="float32")
    want = ref.p_yes_sync(PROMPTS, share_prefix=False)
    vocab = answer_vocab(ref.tokenizer)
    rows: list[tuple[str, str, str, str]] = []
    shared = ref.p_yes_sync(PROMPTS)
    rows.append(("transformers", "logits of every variant id, prefix-KV shared", "-", f"{max_dp(shared, want):.1e}"))

    t0 = time.monotonic()
    engine = VLLMJudge(path, dtype="float32", max_model_len=2048, enforce_eager=True)
    print(f"vLLM engine up in {time.monotonic() - t0:.0f} s", flush=True)
    got = await engine.p_yes(PROMPTS)
    rows.append(("vllm (in-process)", "logprob_token_ids", "1", f"{max_dp(got, want):.1e}"))
    await engine.close()

    port = free_port()
    log = tempfile.mktemp(prefix="vllm-api-", suffix=".log")
    t0 = time.monotonic()
    proc = start_api_server(path, port, log)
    print(f"vLLM API server up in {time.monotonic() - t0:.0f} s (log {log})", flush=True)
    base = f"http://127.0.0.1:{port}"
    proxy, proxy_url, forwarded = dropping_proxy(base, EXTENSIONS)
    try:
        some, whole, widths = top20_misses(base, vocab)
        judge = OpenAIJudge(f"{base}/v1", "smollm2", answer_tokens=vocab)
        got = await judge.p_yes(PROMPTS)
        rows.append(("openai -> vLLM 0.32", "logprob_token_ids", "1", f"{max_dp(got, want):.1e}"))
        await judge.close()
        old = OpenAIJudge(f"{proxy_url}/v1", "smollm2", answer_tokens=vocab)
        got = await old.p_yes(PROMPTS)
        per = f"{forwarded[0] / len(PROMPTS):.1f} (1 + missing variants)"
        rows.append(("openai -> older vLLM", "top 20, allowed_token_ids=[id] per missing variant", per,
                     f"{max_dp(got, want):.1e}"))
        await old.close()
        plain = OpenAIJudge(f"{base}/v1", "smollm2", answer_tokens=vocab, vllm_extensions=False, max_p_error=0.5)
        got = await plain.p_yes(PROMPTS)
        n = len(PROMPTS) - len(FREE)  # the judge-template prompts first, the free-form ones last
        rows.append(("openai, no extensions", f"top 20, midpoint of the bound (judge prompts; half-width <= "
                     f"{max(widths[:n]):.1e})", "1", f"{max_dp(got[:n], want[:n]):.1e}"))
        rows.append(("openai, no extensions", f"top 20, midpoint of the bound (free-form; half-width <= "
                     f"{max(widths[n:]):.1e})", "1", f"{max_dp(got[n:], want[n:]):.1e}"))
        await plain.close()
    finally:
        proxy.shutdown()
        proc.terminate()
        proc.wait(60)
    print(f"\n{len(PROMPTS)} prompts; the natural top 20 misses a variant on {some}, a whole answer on {whole}")
    print(f"measured with judge template `{DEFAULT_TEMPLATE}` (digest `{template_digest(DEFAULT_TEMPLATE)}`)\n")
    print("| engine | method | requests per judgment | max abs dp vs transformers |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    asyncio.run(main())
