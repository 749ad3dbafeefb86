"""`lmperf report`: results files of any kinds -> one write-up (self-contained HTML or Markdown).

`lmperf.report(...)` (this package, callable) is `lmperf.report.api.report`. Not to be confused
with `lmperf.core.report`, the `Report` type every question returns: this package reads the
Reports of the records it is given and lays them out as a page.
"""

from lmperf._callable import make_callable

make_callable(__name__, "lmperf.report.api:report")
