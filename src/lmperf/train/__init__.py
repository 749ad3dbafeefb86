"""`lmperf train`: a small LM trained once per precision regime (data, loop, report, plots).

`lmperf.train(...)` (this package, callable) is `lmperf.train.api.train`.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.train.api:train")
