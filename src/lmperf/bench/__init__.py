"""`lmperf bench`: how long forward, backward and the optimizer step take, over a grid.

`lmperf.bench(...)` (this package, callable) is `lmperf.bench.api.bench`.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.bench.api:bench")
