"""Model factories for the custom-model tests, loaded as "tests.model.factories:<name>"."""

from __future__ import annotations

import torch
import torch.nn as nn

from lmperf.model import ModelConfig, TransformerLM

NOT_CALLABLE = 42
NONE_VALUE = None
received: list[ModelConfig] = []  # configs the factories were called with, for assertions


def reference(config: ModelConfig) -> nn.Module:
    """The reference LM itself, built from the config."""
    received.append(config)
    return TransformerLM(**config.as_kwargs())


class Bigram(nn.Module):
    """A tiny custom LM: embedding straight to logits, (B, T) -> (B, T, V)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


def bigram(config: ModelConfig) -> nn.Module:
    received.append(config)
    return Bigram(config.vocab_size)


class _WrongVocab(Bigram):
    def forward(self, ids):
        return torch.cat([self.table(ids), self.table(ids)[..., :1]], dim=-1)  # V + 1 columns


def wrong_vocab(config: ModelConfig) -> nn.Module:
    return _WrongVocab(config.vocab_size)


def own_vocab(config: ModelConfig) -> nn.Module:
    """A model with its own vocabulary (512), whatever it is handed (a pretrained one's)."""
    return Bigram(512)


class _LastPositionOnly(Bigram):
    def forward(self, ids):
        return self.table(ids)[:, -1]  # (B, V): drops the sequence axis


def last_position_only(config: ModelConfig) -> nn.Module:
    return _LastPositionOnly(config.vocab_size)


class _ReturnsTuple(Bigram):
    def forward(self, ids):
        return self.table(ids), None


def returns_tuple(config: ModelConfig) -> nn.Module:
    return _ReturnsTuple(config.vocab_size)


class _ForwardRaises(Bigram):
    def forward(self, ids):
        raise RuntimeError("boom in forward")


def forward_raises(config: ModelConfig) -> nn.Module:
    return _ForwardRaises(config.vocab_size)


class _NoMetaKernel(Bigram):
    def forward(self, ids):
        raise NotImplementedError("no meta kernel for this op")


def no_meta_kernel(config: ModelConfig) -> nn.Module:
    return _NoMetaKernel(config.vocab_size)


def not_a_module(config: ModelConfig):
    return {"vocab_size": config.vocab_size}


def factory_raises(config: ModelConfig):
    raise KeyError("missing setting")
