"""`lmperf compare`: is NEW faster than BASE, phase by phase, beyond the noise?

`lmperf.compare(...)` (this package, callable) is `lmperf.compare.api.compare`.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.compare.api:compare")
