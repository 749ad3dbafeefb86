"""`lmperf attention`: attention implementations swept over shapes, one isolated process each.

`lmperf.attention(...)` (this package, callable) is `lmperf.attention.api.attention`.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.attention.api:attention")
