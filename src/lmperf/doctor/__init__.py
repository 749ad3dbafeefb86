"""`lmperf doctor`: does each path lmperf relies on work on this machine? Checked for real.

`lmperf.doctor(...)` (this package, callable) is `lmperf.doctor.api.doctor`.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.doctor.api:doctor")
