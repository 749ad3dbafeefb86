"""The Python API: one function per question, each returning a `Report`.

These are the questions' own functions (real signatures, defaults and docstrings: `help()`,
`inspect.signature` and IDEs see them), gathered in one place. Keyword names are the CLI's flag
names; `None` means "the device's default" (`lmperf.core.vocabulary.DEFAULTS`); `out=None`
keeps the records in memory. `import lmperf` loads this module on first use of a name, so
`lmperf --help` stays fast.
"""

from __future__ import annotations

from lmperf.questions.amp.api import amp
from lmperf.questions.attention.api import attention
from lmperf.questions.bench.api import bench
from lmperf.questions.compare.api import compare
from lmperf.questions.doctor.api import doctor
from lmperf.questions.memory.api import memory
from lmperf.questions.parallel.api import dist
from lmperf.questions.plan.api import plan
from lmperf.questions.profile.api import profile
from lmperf.questions.train.api import train
from lmperf.questions.writeup.api import report

__all__ = ["amp", "attention", "bench", "compare", "dist", "doctor", "memory", "plan", "profile",
           "report", "train"]
