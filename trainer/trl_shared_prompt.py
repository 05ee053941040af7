"""A GRPO group's prompt run once in TRL's log-prob forwards and in its generation.

TRL 1.16 computes the policy's (with gradients) and the reference model's log-probs of a
batch by running every row, prompt and completion, through the model, and on devices without
Triton (a CPU) its fused LM head projects EVERY position onto the vocabulary, the prompt's
included, although only the completion's log-probs are kept (``trl/trainer/utils.py``,
``add_fused_lm_head``: "Elsewhere ... every position is scored instead"). A GRPO batch holds
each prompt ``num_generations`` times, and prompts are most of the tokens (the demo: ~350
prompt tokens, 48 completion tokens, 4 completions a prompt): most of that work is repeated.

:func:`shared_prompt_logps` computes the same log-probs (and entropies) by running each
distinct padded prompt once (its last token aside) through the backbone into a KV cache,
selecting that cache for every row of the prompt, and running only the last prompt token and
the completion through the model and its fused head. Positions, attention mask and
temperature are TRL's own, so the values are TRL's up to float rounding; gradients flow
through the shared cache into the prompt's forward. :func:`shared_prompt_trainer` uses it
where it holds (a plain causal LM in one process, no gradient checkpointing, no images, no
MoE auxiliary loss) and TRL's own method elsewhere.

Generation repeats the same work: TRL's transformers path hands ``generate`` every prompt
``num_generations`` times, and the prefill of those identical rows was ~38 % of a demo-sized
generation on CPU (a 350-token prompt, 8 completions of 48 tokens: 3.21 s of 8.42 s; one row's
prefill 0.46 s; ``bench/generation_prefill.py``). :func:`shared_prefix_generate` prefills each
distinct prompt once (its last token aside, at the positions ``generate`` gives it), selects that
KV cache for every row, and lets ``generate`` continue from it: the same prompts and sampling,
the prompt's forward run once.
"""

from __future__ import annotations

import functools
from typing import Any


def distinct_rows(ids: Any, mask: Any) -> tuple[Any, Any]:
    """``(unique, inverse)`` of the rows of ``ids`` and ``mask`` side by side (``torch.unique``
    over ``[ids | mask]``): the distinct rows and, for every row, its distinct row's index."""
    import torch

    return torch.unique(torch.cat([ids, mask], dim=1), dim=0, return_inverse=True)  # type: ignore[no-any-return]


def prefix_cache(model: Any, ids: Any, mask: Any, *, distinct: tuple[Any, Any] | None = None,
                 position_ids: bool = False) -> Any:
    """A ``DynamicCache`` of ``ids`` for every row, each distinct row (:func:`distinct_rows`, or
    ``distinct`` when the caller has it) run once through ``model``'s backbone; with
    ``position_ids``, at the positions ``generate`` derives from the attention mask."""
    from transformers import DynamicCache

    unique, inverse = distinct if distinct is not None else distinct_rows(ids, mask)
    n = ids.size(1)
    u_ids, u_mask = unique[:, :n], unique[:, n:]
    extra = {}
    if position_ids:
        extra["position_ids"] = (u_mask.long().cumsum(-1) - 1).masked_fill(u_mask == 0, 0)
    cache = DynamicCache(config=model.config)
    model.base_model(input_ids=u_ids, attention_mask=u_mask, past_key_values=cache, use_cache=True, **extra)
    cache.batch_select_indices(inverse)
    return cache


def shared_prompt_logps(
    model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *,
    compute_entropy: bool = False, batch_size: int | None = None,
) -> tuple[Any, Any]:
    """``(log_probs, entropies or None)`` of the last ``logits_to_keep`` tokens of each row, as
    ``GRPOTrainer._get_per_token_logps_and_entropies`` returns them; rows are handled
    ``batch_size`` at a time (all at once for None) and rows with equal prompts share one
    prompt forward."""
    import torch

    rows = input_ids.size(0)
    step = batch_size or rows
    logps, entropies = [], []
    cut = input_ids.size(1) - logits_to_keep - 1  # the prompt minus its last token
    for start in range(0, rows, step):
        ids, mask = input_ids[start:start + step], attention_mask[start:start + step]
        cache = prefix_cache(model, ids[:, :cut], mask[:, :cut])
        tail = ids[:, cut:]
        labels = tail.masked_fill(mask[:, cut:] == 0, -100)
        out = model(input_ids=tail, attention_mask=mask, past_key_values=cache, labels=labels,
                    fused_lm_head=True)
        logps.append(out.log_probs[:, -logits_to_keep:])
        if compute_entropy:
            entropies.append(out.entropy[:, -logits_to_keep:])
    return torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None


def shared_prefix_generate(model: Any, *, input_ids: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """``model.generate(input_ids=..., attention_mask=..., **kwargs)`` with each distinct prompt
    prefilled once: its tokens but the last in a :func:`prefix_cache` (at ``generate``'s
    positions) selected for every row, and ``generate`` continuing from it (it feeds only the
    tokens the cache lacks). Rows whose prompts are all distinct, a caller's own cache or a
    configured cache implementation go to ``generate`` unchanged."""
    import torch

    generation_config = kwargs.get("generation_config")
    n = input_ids.size(1)
    distinct = distinct_rows(input_ids[:, :n - 1], attention_mask[:, :n - 1]) if n >= 2 else None
    if (distinct is None or distinct[0].size(0) == input_ids.size(0) or "past_key_values" in kwargs
            or getattr(generation_config, "cache_implementation", None) is not None):
        return type(model).generate(model, input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    with torch.no_grad():
        cache = prefix_cache(model, input_ids[:, :n - 1], attention_mask[:, :n - 1], distinct=distinct,
                             position_ids=True)
    return type(model).generate(model, input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                                **kwargs)


def shares_generation(trainer: Any, model: Any, images: Any, multimodal_fields: Any) -> bool:
    """Whether TRL's ``_generate_single_turn`` takes its plain ``model.generate`` path here, on
    a causal LM in one process (no vLLM, no continuous batching, no images)."""
    from transformers import PreTrainedModel

    return (isinstance(model, PreTrainedModel) and trainer.accelerator.num_processes == 1
            and not trainer.use_vllm and not getattr(trainer, "use_transformers_continuous_batching", False)
            and not getattr(trainer, "_is_vlm", False) and not multimodal_fields
            and (images is None or all(i is None for i in images)))


def shares_prompt(trainer: Any, model: Any, input_ids: Any, logits_to_keep: int, extra: dict[str, Any]) -> bool:
    """Whether :func:`shared_prompt_logps` computes what TRL would for this call."""
    from transformers import PreTrainedModel

    return (isinstance(model, PreTrainedModel) and trainer.accelerator.num_processes == 1
            and not getattr(model, "is_gradient_checkpointing", False)
            and input_ids.size(1) - logits_to_keep >= 2
            and all(v is None for v in extra.values()))


def shared_prompt_trainer(base: type[Any]) -> type[Any]:
    """``base`` (a ``GRPOTrainer`` class) computing log-probs with :func:`shared_prompt_logps`
    where :func:`shares_prompt` says it may, with TRL's own method elsewhere."""

    class SharedPromptGRPOTrainer(base):  # type: ignore[misc]
        shared_prompt_calls = 0
        shared_generate_calls = 0

        def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: Any,
                                  has_tool_images: bool = False) -> Any:
            model = self.accelerator.unwrap_model(self.model_wrapped)
            if not shares_generation(self, model, images, multimodal_fields):
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images=has_tool_images)
            self.shared_generate_calls += 1
            # TRL calls ``unwrapped_model.generate``: for this call only, that is the shared-prefix one
            model.generate = functools.partial(shared_prefix_generate, model)
            try:
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images=has_tool_images)
            finally:
                del model.generate

        def _get_per_token_logps_and_entropies(
            self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
            batch_size: int | None = None, compute_entropy: bool = False, compute_aux_loss: bool = False,
            **extra: Any,
        ) -> Any:
            if compute_aux_loss or not shares_prompt(self, model, input_ids, logits_to_keep, extra):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)
            self.shared_prompt_calls += 1
            with self.accelerator.autocast():
                logps, entropies = shared_prompt_logps(model, input_ids, attention_mask, logits_to_keep,
                                                       compute_entropy=compute_entropy, batch_size=batch_size)
            return logps, entropies, None

    return SharedPromptGRPOTrainer
