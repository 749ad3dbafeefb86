"""`lmperf bench`: how long forward, backward and the optimizer step take, over a grid.

`lmperf.bench(...)` is `lmperf.questions.bench.api.bench`.
"""
