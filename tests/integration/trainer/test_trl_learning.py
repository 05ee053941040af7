"""The TRL runner's learning-check pieces on a tiny random policy (SmolLM2's tokenizer, 2 layers)
against a real reward server (fake engines): the shared-prompt log-probs equal TRL's own, the
step's time splits into sections, the held-out evaluation scores the true reward of unseen
users, and the control arms transform the training rewards only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="the TRL engine needs the trl extra: pip install -e .[trl]")
torch = pytest.importorskip("torch")

from trainer.data import prepare  # noqa: E402
from trainer.heldout import summarize  # noqa: E402
from trainer.trl_runner import TrlRunSettings, run_trl  # noqa: E402
from trainer.trl_shared_prompt import shared_prefix_generate, shared_prompt_logps  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def tiny_policy(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template, saved as a model folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-policy")
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    assert prepare.main(["--sample", "--task", "personalized_generator", "--reward-kind", "rubric_score",
                         "--history-limit", "1", "--out", str(out)]) == 0
    assert (out / "trl_val.parquet").is_file()
    return out


def test_shared_prompt_logps_equal_trls_own_with_gradients(tiny_policy: Path) -> None:
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    model.train()
    torch.manual_seed(1)
    p, c, g = 24, 10, 3
    prompts = torch.randint(100, 20000, (2, p))
    ids_p = prompts.repeat_interleave(g, dim=0)
    mask_p = torch.ones_like(ids_p)
    mask_p[g:, :5] = 0  # the second prompt left-padded, as TRL pads
    ids_p[g:, :5] = 2
    comp = torch.randint(100, 20000, (2 * g, c))
    mask_c = torch.ones_like(comp)
    mask_c[0, 4:] = 0  # a completion that ended early
    order = torch.randperm(2 * g)  # rows of one prompt need not be adjacent
    ids = torch.cat([ids_p, comp], dim=1)[order]
    mask = torch.cat([mask_p, mask_c], dim=1)[order]

    labels = ids.masked_fill(mask == 0, -100)  # TRL's _get_per_token_logps_and_entropies
    labels[:, :-c] = -100
    ref = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    ref_logps, ref_ent = ref.log_probs[:, -c:], ref.entropy[:, -c:]
    (ref_logps * mask[:, -c:]).sum().backward()
    ref_grads = {n: q.grad.clone() for n, q in model.named_parameters()}
    model.zero_grad()

    logps, ent = shared_prompt_logps(model, ids, mask, c, compute_entropy=True, batch_size=4)
    (logps * mask[:, -c:]).sum().backward()
    valid = mask[:, -c:].bool()
    assert torch.allclose(logps[valid], ref_logps[valid], atol=1e-5)
    assert torch.allclose(ent[valid], ref_ent[valid], atol=1e-5)
    for name, q in model.named_parameters():
        assert torch.allclose(q.grad, ref_grads[name], rtol=1e-4, atol=1e-6), name


def test_shared_prefix_generation_equals_generate_and_prefills_each_prompt_once(tiny_policy: Path) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    torch.manual_seed(2)
    g, p = 3, 12
    prompts = torch.randint(100, 20000, (2, p))
    ids = prompts.repeat_interleave(g, dim=0)
    mask = torch.ones_like(ids)
    mask[g:, :4] = 0  # the second prompt left-padded, as TRL pads for generation
    ids[g:, :4] = 2
    order = torch.randperm(2 * g)
    ids, mask = ids[order], mask[order]
    config = GenerationConfig(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=2)

    rows: list[tuple[int, int]] = []  # (rows, tokens) of each backbone forward
    hook = model.base_model.register_forward_pre_hook(
        lambda _m, args, kwargs: rows.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        first_ref = rows[0]
        rows.clear()
        out = shared_prefix_generate(model, input_ids=ids, attention_mask=mask, generation_config=config)
    hook.remove()
    assert torch.equal(out, ref)
    assert first_ref == (2 * g, p)  # generate's own first forward: every row's whole prompt
    # ours: each distinct prompt once (its last token aside), then every row's last prompt token
    assert rows[0] == (2, p - 1) and rows[1] == (2 * g, 1)


def run(tmp_path: Path, tiny_policy: Path, data: Path, server: Any, **kw: Any) -> dict[str, Any]:
    settings = TrlRunSettings(data=data, output_dir=tmp_path, reward_server=server.target, model=str(tiny_policy),
                              device="cpu", max_steps=2, prompts_per_step=2, num_generations=4,
                              max_completion_length=8, temperature=1.0, learning_rate=1e-3, **kw)
    return run_trl(settings)


def log_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(result["log"]).read_text().splitlines() if x.strip()]


@pytest.mark.e2e  # two short runs through run_trl (TRL, a server, ~40 s each here)
def test_a_run_profiles_its_steps_and_evaluates_the_held_out_users(tmp_path, tiny_policy, data,
                                                                    reward_server) -> None:
    result = run(tmp_path, tiny_policy, data, reward_server, eval_steps=2, eval_generations=4, profile=True,
                 warmup_steps=2)
    trainer = result["trainer"]
    assert trainer.shared_prompt_calls >= 4  # ref and policy forwards of both steps took the shared path
    assert trainer.shared_generate_calls >= 3  # both steps' generations and the evaluations' shared the prefill
    rows = log_rows(result)
    train = [r for r in rows if "reward" in r and "step" in r]
    assert len(train) == 2
    # --warmup-steps 2: the learning rate ramps from 0 (the first step only fills Adam's moments)
    assert [r["learning_rate"] for r in train] == pytest.approx([0.0, 0.5e-3])
    for r in train:
        parts = [v for k, v in r.items() if k.startswith("time/") and k != "time/step"]
        assert sum(parts) == pytest.approx(r["time/step"], rel=1e-6)
        assert r["time/generate"] > 0 and r["time/ref_forward"] > 0 and r["time/policy_forward"] > 0
        assert r["time/backward"] > 0
    evals = [r for r in rows if "eval_heldout_mean" in r]
    assert [r["step"] for r in evals] == [0, 2]  # before training and after its last step
    held = summarize(tmp_path / "heldout")
    assert sorted(held) == [0, 2]
    for r, h in zip(evals, held.values(), strict=True):
        assert h.prompts == 3 and h.samples == 12  # 3 held-out users x 4 completions
        assert r["eval_heldout_mean"] == pytest.approx(h.mean) and r["eval_heldout_se"] == pytest.approx(h.se)
    val_users = {json.loads(x)["user_id"] for x in
                 __import__("pyarrow.parquet", fromlist=["x"]).read_table(data / "trl_val.parquet")
                 .column("extra_info_json").to_pylist()}
    seen = {json.loads(x)["user_id"] for x in (tmp_path / "heldout" / "step-0.jsonl").read_text().splitlines()}
    assert seen == val_users  # the held-out users, and only those


@pytest.mark.e2e
@pytest.mark.parametrize("transform", ["negate", "shuffle"])
def test_control_arms_transform_training_rewards_not_the_evaluation(tmp_path, tiny_policy, data, reward_server,
                                                                     transform) -> None:
    result = run(tmp_path, tiny_policy, data, reward_server, eval_steps=2, eval_generations=4,
                 reward_transform=transform)
    rows = log_rows(result)
    train = [r for r in rows if "reward" in r and "step" in r]
    for r in train:
        raw = r["reward_raw"]  # the server's rewards, as logged before the transform
        expected = -raw if transform == "negate" else raw  # a permutation keeps the mean
        assert r["reward"] == pytest.approx(expected, abs=1e-6)
        assert math.isfinite(raw) and raw > 0
    for r in (r for r in rows if "eval_heldout_mean" in r):
        assert r["eval_heldout_mean"] > 0  # the evaluation scores the true reward
