"""Hugging Face models, built from small configs (no download), called with keyword inputs:
one training step under their lowest front point equals the unmodified model's, and the
measured peak is the predicted one."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import assert_lowest_point_trains_like_the_model, live_bytes_by_operator

import explorer
from explorer.backend import RESIZED, wrap_with_schedule

transformers.logging.set_verbosity_error()


def _bert():
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    inputs = {
        "input_ids": torch.randint(0, 100, (2, 12)),
        "attention_mask": torch.tensor([[1] * 12, [1] * 8 + [0] * 4]),
        "labels": torch.tensor([0, 1]),
    }
    return transformers.BertForSequenceClassification(config), inputs


def _gpt2(use_cache: bool = False):
    config = transformers.GPT2Config(
        vocab_size=100,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=use_cache,
    )
    inputs = {"input_ids": torch.randint(0, 100, (2, 12)), "labels": torch.randint(0, 100, (2, 12))}
    return transformers.GPT2LMHeadModel(config), inputs


def _mistral_with_cache():
    """A causal language model as its config comes: `use_cache=True`, so its output holds a
    DynamicCache of each layer's key and value states."""
    config = transformers.MistralConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        attention_dropout=0.1,
    )
    assert config.use_cache
    inputs = {"input_ids": torch.randint(0, 100, (4, 32)), "labels": torch.randint(0, 100, (4, 32))}
    return transformers.MistralForCausalLM(config), inputs


def _t5():
    config = transformers.T5Config(
        vocab_size=100,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        use_cache=False,
    )
    inputs = {
        "input_ids": torch.randint(0, 100, (2, 12)),
        "attention_mask": torch.ones(2, 12, dtype=torch.long),
        "labels": torch.randint(0, 100, (2, 7)),
    }
    return transformers.T5ForConditionalGeneration(config), inputs


@pytest.mark.parametrize("build", [_bert, _gpt2, _t5], ids=["bert", "gpt2", "t5"])
def test_one_training_step_equals_the_model(build, quick_search):
    torch.manual_seed(0)
    model, inputs = build()
    assert_lowest_point_trains_like_the_model(explorer.Planner(model, (), inputs))


@pytest.mark.parametrize(
    ("build", "over"),
    # Mistral: one graph; the prediction is 16 to 32 bytes over what the run holds, from the
    # forward on (the graph also returns two 8-byte integer tensors for the cache; not traced
    # further). GPT-2: two graphs, 3,072 bytes over with or without a cache (see the next test)
    [(_mistral_with_cache, 64), (lambda: _gpt2(use_cache=True), 3072 + 64)],
    ids=["mistral", "gpt2"],
)
def test_a_key_value_cache_in_the_output_gets_its_tangents(build, over, quick_search):
    # catches: verify's step leaving out the key and value states inside the DynamicCache
    # (use_cache=True, the default of causal language models), which the plan gives a tangent
    # each like any output (Mistral's peak measured up to 6.7% under the prediction, verify
    # failed); and, with two graphs, the plan taking those tangents for autograd's (made when
    # the backward starts, freed after their last use: GPT-2 measured 4,544 bytes over)
    torch.manual_seed(0)
    model, inputs = build()
    report = assert_lowest_point_trains_like_the_model(explorer.Planner(model, (), inputs))
    peak = next(r for r in report.rows if r.quantity == "peak memory (bytes)")
    measured, predicted = int(peak.measured), int(peak.predicted)
    assert 0 <= predicted - measured <= over, (measured, predicted)


def test_a_loss_graph_after_the_model_graph_is_predicted_after_every_operator():
    """GPT-2 with labels is two graphs: the model, then the loss, which reads the logits the
    user holds too. The model graph's backward gets autograd's sum of the user's tangent for
    the logits and the loss graph's gradient (a logits-sized tensor the plan left out: with a
    20,000-word vocabulary the step measured 1.9 MB, 13%, over its prediction on torch 2.11,
    which keeps it to the end of that backward), and its other output, a hidden state only a
    Python frame held, gets a tangent only when that backward starts (the plan counted it
    from the loss graph's backward on, 3,072 bytes). Now exact through both graphs' forwards,
    the loss graph's backward and the start of the model graph's; within that backward the
    hidden state's tangent goes earlier than predicted (3,072 bytes over, on 2.11 and 2.14).
    catches: either tangent counted as before"""
    torch.manual_seed(0)
    model, inputs = _gpt2()
    plan = explorer.Planner(model, (), inputs)
    rows = live_bytes_by_operator(plan, plan.baseline(), (), inputs)
    over = [predicted - measured for _, predicted, measured in rows]
    assert min(over) == 0 and max(over) == 3072, rows
    first_over = next(k for k, excess in enumerate(over) if excess)
    assert rows[first_over][0].startswith("g1:") and rows[first_over - 1][0].startswith("g1:")
    assert all(o == 0 for o in over[:first_over])


def test_keyword_call_with_another_sequence_length(quick_search):
    torch.manual_seed(0)
    model, inputs = _bert()
    plan = explorer.Planner(model, (), inputs)
    schedule = plan.sweep(points=3).points[0].schedule
    wrapped = wrap_with_schedule(model.__class__(model.config), plan.made_for(), schedule.to_dict())
    wrapped.model.load_state_dict(model.state_dict())
    shorter = {k: v[:, :9] if k != "labels" else v for k, v in inputs.items()}
    for m in (model, wrapped):
        torch.manual_seed(3)
        m(**shorter).loss.backward()
    for p, q in zip(model.parameters(), wrapped.model.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert wrapped.plans[-1].how == RESIZED
