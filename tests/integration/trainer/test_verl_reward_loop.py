"""verl's own RewardLoopManager, with 2 RewardLoopWorker Ray actors loading our reward function
the way our presets configure it (``pkg://reward_server.integrations.verl``), scores a DataProto
of rollouts against a real reward server: each score and every extra key equal a direct call.
An infrastructure failure raises by default and masks on request."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import grpc
import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from reward_server.api.rows import read_row
from reward_server.client import RewardCallError
from reward_server.integrations import verl as rv
from trainer import verl_runner
from trainer.data.prepare import build_rows, sample_records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GOOD = json.dumps([{"rule": 'The review opens with the word "Honestly".'},
                   {"rule": 'The review mentions "my kids" using the product.'}])
OTHER = json.dumps([{"rule": 'The review opens with the word "Honestly".'},
                    {"rule": 'The review mentions the word "battery".'}])
RESPONSES = [GOOD, "not json", OTHER, GOOD]


@pytest.fixture(scope="module")
def tokenizer_path(smollm2_path) -> str:  # type: ignore[no-untyped-def]
    return str(smollm2_path)


def manager(tokenizer_path: str, target: str, *extra: str, workers: int = 2) -> Any:
    from verl.experimental.reward_loop import RewardLoopManager

    config = verl_runner.compose("rubric_generator", [
        f"actor_rollout_ref.model.path={tokenizer_path}",
        f"reward.num_workers={workers}",
        f"reward.custom_reward_function.reward_kwargs.reward_server={target}",
        "reward.custom_reward_function.reward_kwargs.attempts=1",
        "reward.custom_reward_function.reward_kwargs.deadline_s=3",
        *extra,
    ])
    return RewardLoopManager(config)


def stop(mgr: Any) -> None:
    import ray

    names = [f"reward_loop_worker_{i}" for i in range(len(mgr.reward_loop_workers))]
    for w in mgr.reward_loop_workers:
        ray.kill(w)
    deadline = time.monotonic() + 30
    for name in names:  # the next manager reuses the names
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            time.sleep(0.2)


def batch(tokenizer_path: str, rows: list[dict], responses: list[str]) -> tuple[Any, list[str]]:
    """A DataProto shaped as verl builds it for the reward loop; and the decoded responses."""
    import torch
    from transformers import AutoTokenizer
    from verl import DataProto

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    enc = [tok(r, add_special_tokens=False)["input_ids"] for r in responses]
    width = max(len(e) for e in enc)
    resp = torch.full((len(enc), width), tok.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros((len(enc), 4 + width), dtype=torch.long)
    mask[:, :4] = 1
    for i, e in enumerate(enc):
        resp[i, : len(e)] = torch.tensor(e)
        mask[i, 4: 4 + len(e)] = 1
    data = DataProto.from_dict(
        tensors={"prompts": torch.ones((len(enc), 4), dtype=torch.long), "responses": resp,
                 "attention_mask": mask},
        non_tensors={
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "reward_model": np.array([r["reward_model"] for r in rows], dtype=object),
            "extra_info": np.array([dict(r["extra_info"]) for r in rows], dtype=object),
        },
    )
    return data, [tok.decode(e, skip_special_tokens=True) for e in enc]


def direct(rows: list[dict], texts: list[str], **kwargs: Any) -> list[dict[str, float]]:
    async def all_() -> list[dict[str, float]]:
        try:
            return [await rv.compute_score(r["data_source"], t, None, dict(r["extra_info"]), **kwargs)
                    for r, t in zip(rows, texts, strict=True)]
        finally:
            await rv.close_clients()

    return asyncio.run(all_())


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9)


def test_reward_loop_manager_scores_like_direct_calls_and_raises_on_infra_failure(
    ray_session, thread_server, tokenizer_path
) -> None:
    # the two workers' calls may overlap; with attempts=1 (so the outage below fails at once)
    # the second would be refused at admission's startup floor (one engine batch, 512
    # judgments; refusal and retry on pushback are tested in test_overload_retry.py), so this
    # server admits them both: this test is about verl's seam, not admission
    server = thread_server(["service.admission.min_judgments_in_flight=4096"])
    rows = build_rows(sample_records()[:2] * 2, "rubric_generator")
    data, texts = batch(tokenizer_path, rows, RESPONSES)
    mgr = manager(tokenizer_path, server.target)
    try:
        assert len(mgr.reward_loop_workers) == 2
        out = mgr.compute_rm_score(data)
        want = direct(rows, texts, reward_server=server.target)
        # the score sits on the last valid response token, as verl's naive manager places it
        scores = out.batch["rm_scores"].sum(dim=-1).tolist()
        assert [scores[i] == pytest.approx(w["score"], rel=1e-6) for i, w in enumerate(want)] == [True] * 4
        assert out.meta_info["reward_extra_keys"] == list(want[0])  # from the first result
        for key in want[0]:
            got = out.non_tensor_batch[key].tolist()
            assert all(same(g, w[key]) for g, w in zip(got, want, strict=True)), key
        assert out.non_tensor_batch["policy_invalid"].tolist() == [0.0, 1.0, 0.0, 0.0]
        assert want[0]["score"] != want[2]["score"]  # a real, discriminating reward

        server.stop()  # the server goes away: the default raises with the server's status,
        # as our own type on this side of the RewardLoopWorker actors (not Ray's
        # UnserializableException holding only the text)
        with pytest.raises(RewardCallError) as err:
            mgr.compute_rm_score(data)
        assert err.value.code is grpc.StatusCode.UNAVAILABLE and err.value.attempts == 1
    finally:
        stop(mgr)


def test_reward_loop_manager_masks_infra_failures_on_request(ray_session, tokenizer_path) -> None:
    rows = build_rows(sample_records()[:2], "rubric_generator")
    data, _ = batch(tokenizer_path, rows, [GOOD, GOOD])
    # one worker: masking happens in each worker's compute_score (the test above shows two
    # workers scoring one batch); a second worker process (verl, torch) costs seconds here
    mgr = manager(tokenizer_path, "127.0.0.1:1",
                  "reward.custom_reward_function.reward_kwargs.mask_infra_failures=true",
                  workers=1)
    try:
        out = mgr.compute_rm_score(data)
    finally:
        stop(mgr)
    assert all(math.isnan(s) for s in out.batch["rm_scores"].sum(dim=-1).tolist())
    assert out.non_tensor_batch["reward_masked"].tolist() == [1.0, 1.0]
    names = read_row(rows[0]["extra_info"]).component_names  # a PARL row's own components
    assert set(out.meta_info["reward_extra_keys"]) == set(rv.masked_dict(names))
