"""Where the memory goes: peaks per phase, saved activations, estimates, checkpointing, snapshots.

`lmperf.memory(...)` (this package, callable) is `lmperf.memory.api.memory`.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.memory.api:memory")
