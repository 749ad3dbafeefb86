"""`lmperf report`: results files of any kinds -> one write-up (self-contained HTML or Markdown).

`lmperf.report(...)` is `lmperf.questions.writeup.api.report`. Not to be confused
with `lmperf.core.report`, the `Report` type every question returns: this package reads the
Reports of the records it is given and lays them out as a page.
"""
