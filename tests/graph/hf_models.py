"""Tiny Hugging Face models from their configs (random weights, no download): one per family
capture must run as eager PyTorch runs it. Each builder returns ``(model, inputs, loss_fn)``
in training mode; the inputs carry an all-ones attention mask, as a tokenizer returns it
(the case where transformers, if it believed it was traced, would build a causal mask and
``repeat_kv`` copies). ``loss_fn`` is the usual cross-entropy on the logits."""
from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, BATCH, SEQ = 128, 2, 16


def _lm_loss(ids: torch.Tensor) -> Callable:
    def loss_fn(out) -> torch.Tensor:
        return F.cross_entropy(out.logits.flatten(0, 1), ids.flatten())
    return loss_fn


def _decoder(family: str, padded: bool = False):
    import transformers as T

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config, model = {
        "llama": (T.LlamaConfig, T.LlamaForCausalLM),
        "mistral": (T.MistralConfig, T.MistralForCausalLM),
        "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
        "gemma": (T.GemmaConfig, T.GemmaForCausalLM),
    }[family]
    extra = {"head_dim": 16, "num_key_value_heads": 1} if family == "gemma" else {}
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if padded:
        mask[1, SEQ - 4:] = 0
    return (model(config(**{**common, **extra})).train(),
            {"input_ids": ids, "attention_mask": mask}, _lm_loss(ids))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                       n_positions=64))
    return model.train(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, \
        _lm_loss(ids)


def bert():
    from transformers import BertConfig, BertForMaskedLM

    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    model = BertForMaskedLM(BertConfig(num_hidden_layers=2, hidden_size=64,
                                       num_attention_heads=4, intermediate_size=128,
                                       vocab_size=VOCAB))
    return model.train(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, \
        _lm_loss(ids)


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = torch.randint(0, VOCAB, (BATCH, SEQ // 2 + 1))
    model = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128,
                                                num_layers=2, num_heads=4,
                                                decoder_start_token_id=0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "decoder_input_ids": labels[:, :-1]}     # a view of the labels, as people write
    return model.train(), inputs, _lm_loss(labels[:, 1:])


def whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    labels = torch.randint(3, VOCAB, (BATCH, SEQ // 2 + 1))
    config = WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, decoder_layers=2,
                           d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
                           encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
                           max_target_positions=32, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1)
    inputs = {"input_features": torch.randn(BATCH, 16, 64), "decoder_input_ids": labels[:, :-1],
              "decoder_attention_mask": torch.ones_like(labels[:, :-1])}
    return WhisperForConditionalGeneration(config).train(), inputs, _lm_loss(labels[:, 1:])


HF_MODELS = {
    "llama": lambda: _decoder("llama"),
    "mistral": lambda: _decoder("mistral"),
    "qwen2": lambda: _decoder("qwen2"),
    "gemma": lambda: _decoder("gemma"),
    "gpt2": gpt2,
    "bert": bert,
    "t5": t5,
    "whisper": whisper,
}
"""Name -> builder of ``(model, inputs, loss_fn)``: real CPU tensors, training mode."""
