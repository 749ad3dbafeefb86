"""The `lmperf` program ends without the interpreter's teardown (0.5-1.5 s once torch is
loaded, after the answer is printed): `lmperf.cli.run` exits with `main`'s code, everything
printed is flushed, and atexit handlers do not run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import atexit, sys
    atexit.register(lambda: print("TEARDOWN", file=sys.stderr))
    from lmperf.cli import run
    run({argv!r})
    print("run() returned", file=sys.stderr)
""")


@pytest.mark.parametrize("argv, code, out, err", [
    (["--version"], 0, "lmperf ", ""),
    (["bench", "--help"], 0, "--rounds", ""),  # argparse's SystemExit, the help on a pipe
    (["bench", "--size", "nope"], 2, "", "lmperf: error: --size"),
])
def test_run_exits_with_mains_code_flushed_without_teardown(argv, code, out, err):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == code, proc.stderr[-500:]
    assert out in proc.stdout and err in proc.stderr
    assert "TEARDOWN" not in proc.stderr and "returned" not in proc.stderr


def test_the_console_script_and_python_m_lmperf_use_run():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["lmperf"] == "lmperf.cli:run"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import atexit, sys
        atexit.register(lambda: print("TEARDOWN", file=sys.stderr))
        sys.argv = ["lmperf", "--version"]
        import runpy
        runpy.run_module("lmperf", run_name="__main__")
    """)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "lmperf " in proc.stdout
    assert "TEARDOWN" not in proc.stderr
