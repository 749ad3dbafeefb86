"""lmperf: a performance lab for training Transformer language models in PyTorch."""

__version__ = "0.1.0"
