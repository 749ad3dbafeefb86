"""`lmperf train`: a small LM trained once per precision regime (data, loop, report, plots).

`lmperf.train(...)` is `lmperf.questions.train.api.train`.
"""
