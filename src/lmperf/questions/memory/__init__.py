"""Where the memory goes: peaks per phase, saved activations, estimates, checkpointing, snapshots.

`lmperf.memory(...)` is `lmperf.questions.memory.api.memory`.
"""
