"""`lmperf bench` starts its warm fork server before this process imports torch, so that the
server's imports (torch, then torch._dynamo: the floor of the command's time to answer) begin
at once and the parent's own imports run beside them instead of before them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import json, sys
    import lmperf.core.launch as launch

    seen = []

    class Server:  # stands in for the fork server: records what the parent had imported
        @classmethod
        def get(cls):
            seen.append("torch" in sys.modules)

    launch.ForkServer = Server
    import lmperf.questions.bench.api as api
    imported_api = {"torch": "torch" in sys.modules, "pandas": "pandas" in sys.modules}
    specs = []
    api.run_sweep = lambda s, out, options, rounds=1: specs.extend(s) or []
    api.bench(size="tiny", precision="fp32")
    print(json.dumps({"api": imported_api, "server_started_with_torch": seen,
                      "specs": len(specs)}))
""")


def test_the_fork_server_starts_before_the_parent_imports_torch():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=180)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["api"] == {"torch": False, "pandas": False}
    assert result["server_started_with_torch"] == [False]
    assert result["specs"] == 1  # the plan still ran, after the server was asked for
