"""`lmperf profile`: where the time goes: annotated ranges, torch.profiler and Nsight Systems
backends, per-phase tables.

`lmperf.profile(...)` (this package, callable) is `lmperf.profile.api.profile`.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.profile.api:profile")
