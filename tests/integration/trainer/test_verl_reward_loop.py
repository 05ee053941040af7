"""verl's own reward-loop worker (naive manager, run_single) calling trainer/reward_fn.py
against a real local reward server on the fake engines."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from reward_server.app import start_app
from reward_server.client import RewardCallError
from reward_server.config import load_config
from trainer import verl_runner
from trainer.data.prepare import build_rows, sample_records

GOOD = json.dumps([{"rule": 'The review opens with the word "Honestly".'},
                   {"rule": 'The review mentions "my kids" using the product.'}])


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture(scope="module")
def tokenizer_path() -> str:
    from reward_server.backends.smollm2 import local_smollm2_path
    from reward_server.errors import ModelLoadError

    try:
        return str(local_smollm2_path())
    except ModelLoadError as e:
        pytest.skip(f"no local SmolLM2 tokenizer: {e}")


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[str]:
    config = load_config(overrides=["server.port=0", "server.drain_delay_s=0",
                                    "engines={judge: {kind: fake}, nli: {kind: fake}}"], env={})
    app = await start_app(config)
    yield f"127.0.0.1:{app.port}"
    await app.stop(grace=1.0, drain_delay=0)


def worker(tokenizer_path: str, target: str, *extra: str):  # type: ignore[no-untyped-def]
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    config = verl_runner.compose("rubric_generator", [
        f"actor_rollout_ref.model.path={tokenizer_path}",
        f"reward.custom_reward_function.reward_kwargs.reward_server={target}",
        "reward.custom_reward_function.reward_kwargs.max_retries=0",
        "reward.custom_reward_function.reward_kwargs.timeout_s=20",
        *extra,
    ])
    return RewardLoopWorker(config)


def batch(tokenizer_path: str, rows: list[dict], responses: list[str]):  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoTokenizer
    from verl import DataProto

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    enc = [tok(r, add_special_tokens=False)["input_ids"] for r in responses]
    width = max(len(e) for e in enc)
    resp = torch.full((len(enc), width), tok.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros((len(enc), 4 + width), dtype=torch.long)
    for i, e in enumerate(enc):
        resp[i, : len(e)] = torch.tensor(e)
        mask[i, : 4 + len(e)] = 1
    return DataProto.from_dict(
        tensors={"prompts": torch.ones((len(enc), 4), dtype=torch.long), "responses": resp,
                 "attention_mask": mask},
        non_tensors={
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "reward_model": np.array([r["reward_model"] for r in rows], dtype=object),
            "extra_info": np.array([dict(r["extra_info"]) for r in rows], dtype=object),
        },
    )


def expected_parl_a() -> float:
    # enthusiast's target has both terms (p=0.98 each): S_T = 0.98; baselines Non, RAG, SFT,
    # SFT+GRPO have neither (S=0.02), GRPO starts with "Honestly" (S=(0.98+0.02)/2=0.5).
    gamma = sigmoid(20 * 0.96) ** 4 * sigmoid(20 * 0.48)
    return 0.1 + 10 * 1.0 * 0.98 * gamma


async def test_naive_reward_loop_scores_each_rollout(tokenizer_path: str, server: str) -> None:
    rows = build_rows(sample_records()[:1] * 3, "rubric_generator")
    w = worker(tokenizer_path, server)
    out = await w.compute_score_batch(batch(tokenizer_path, rows, [GOOD, "not json", GOOD]))
    good, bad, good2 = (o["reward_extra_info"] for o in out)
    assert out[0]["reward_score"] == pytest.approx(expected_parl_a(), rel=1e-9)
    assert good["s_target"] == pytest.approx(0.98) and good["n_valid"] == 2.0
    assert good["policy_invalid"] == 0.0 and good["reward_masked"] == 0.0
    assert out[1]["reward_score"] == 0.0 and bad["policy_invalid"] == 1.0
    assert math.isnan(bad["s_target"]) and bad["n_parsed"] == 0.0
    assert set(good) == set(bad) == set(good2)  # verl takes the keys from the first result
    assert out[2]["reward_score"] == out[0]["reward_score"]


async def test_infra_failure_raises_by_default(tokenizer_path: str) -> None:
    rows = build_rows(sample_records()[:1], "rubric_generator")
    w = worker(tokenizer_path, "127.0.0.1:1")
    with pytest.raises(RewardCallError) as err:
        await w.compute_score_batch(batch(tokenizer_path, rows, [GOOD]))
    assert err.value.code.name == "UNAVAILABLE"


async def test_infra_failure_masked_on_request(tokenizer_path: str) -> None:
    from trainer import reward_fn

    rows = build_rows(sample_records()[:2], "rubric_generator")
    w = worker(tokenizer_path, "127.0.0.1:1",
               "reward.custom_reward_function.reward_kwargs.mask_infra_failures=true")
    out = await w.compute_score_batch(batch(tokenizer_path, rows, [GOOD, GOOD]))
    for o in out:
        assert math.isnan(o["reward_score"]) and o["reward_extra_info"]["reward_masked"] == 1.0
    assert reward_fn.counters()["masked"] >= 0  # the file-loaded copy keeps its own counters
