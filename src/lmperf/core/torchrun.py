"""Where a distributed job runs: torchrun, started and watched from the sweep's process.

`run_job(job)` is the job's runner (the core's protocol: spec -> list of records, never raises
for a failure of the run). It starts `python -m torch.distributed.run --standalone` (a free
port from torchrun's c10d rendezvous) with `lmperf.core.rank` on every rank, watches the ranks'
state files (a line on stderr says what each does), and makes every way a rank fails (it
raises, dies, or hangs past the item's timeout: every process killed) a row of the item it ran,
naming the rank and with its log's tail (docs/commands/dist.md, "Faults"); the items after it
are launched again. A job has `world_size`, `timeout_s`, `threads`, `device`, `items()`,
`item_spec(item)`, `with_items(items)` and a `worker` (`lmperf.core.rank`'s protocol).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lmperf.core.jobs import class_path
from lmperf.core.launch import alive, descendants, kill_process_tree, log_tail, signal_name
from lmperf.core.rank import ENV_DIR

POLL_S = 0.1
KILL_WAIT_S = 5.0
PROGRESS_S = 2.0  # at most one line on stderr this often, saying what each rank is doing


def torchrun_command(nproc: int, worker_args: list[str]) -> list[str]:
    """`python -m torch.distributed.run ...` for this interpreter on this node: `--standalone`
    (a local c10d rendezvous on a free port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.1",
            *worker_args]


@dataclass
class Attempt:
    """One torchrun launch: the records it finished, the failed item's row, what is left."""

    records: list[dict] = field(default_factory=list)
    failed: dict | None = None
    remaining: list[str] = field(default_factory=list)


def run_job(job: object) -> list[dict]:
    """Run every item of `job` under torchrun; one record per item, failures included."""
    items = job.items()  # type: ignore[attr-defined]
    records: list[dict] = []
    while items:
        attempt = launch_once(job, items)
        records += attempt.records + ([attempt.failed] if attempt.failed else [])
        items = attempt.remaining
    return records


def launch_once(job: object, items: list[str]) -> Attempt:
    """One torchrun launch for `items`; a failure ends it (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="lmperf-dist-") as tmp:
        folder = Path(tmp)
        job_path = folder / "job.json"
        job_path.write_text(json.dumps({"spec_class": class_path(job),
                                        "spec": job.to_full_dict(),  # type: ignore[attr-defined]
                                        "items": items}), encoding="utf-8")
        cmd = torchrun_command(job.world_size, ["-m", "lmperf.core.rank", str(job_path)])  # type: ignore[attr-defined]
        threads = getattr(job, "threads", 0) or 1
        env = {**os.environ, ENV_DIR: str(folder), "OMP_NUM_THREADS": str(threads),
               "PYTHONUNBUFFERED": "1"}
        started = time.time()
        with open(folder / "agent.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env)
            timed_out = None
            try:
                timed_out = _watch(proc, folder, job.timeout_s, started)  # type: ignore[attr-defined]
            except BaseException:  # Ctrl-C: never leave ranks behind
                kill_tree(proc, folder)
                raise
            if timed_out is not None:
                kill_tree(proc, folder)
            code = proc.wait()
        return _collect(job, items, folder, code, timed_out)


def _states(folder: Path) -> dict[int, dict]:
    """rank -> its last state (see lmperf.core.rank.Progress)."""
    states = {}
    for path in folder.glob("rank_*.state.json"):
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # being replaced right now: read it next time
            continue
        states[state["rank"]] = state
    return states


def _watch(proc: subprocess.Popen, folder: Path, timeout_s: float, started: float) -> dict | None:
    """Wait for torchrun; returns the ranks' states if the current item ran past `timeout_s`
    (measured from the moment the first rank started it, or from the launch)."""
    seen: dict[int, float] = {}  # item index -> when the first rank started it
    said, last = "", started
    while proc.poll() is None:
        time.sleep(POLL_S)
        states = _states(folder)
        doing: dict[str, list[str]] = {}
        for r, state in sorted(states.items()):
            doing.setdefault(": ".join(filter(None, (state["item"], state["stage"]))),
                             []).append(str(r))
        now = "; ".join(f"rank {','.join(ranks)} {what}" for what, ranks in doing.items())
        if now != said and time.time() - last >= PROGRESS_S:  # what each rank is doing
            print(f"  {now}", file=sys.stderr, flush=True)
            said, last = now, time.time()
        index = max((s["index"] for s in states.values()), default=-1)
        if index not in seen:
            seen[index] = time.time() if index >= 0 else started
        if time.time() - seen[index] > timeout_s:
            return states
    return None


def kill_tree(proc: subprocess.Popen, folder: Path) -> None:
    """SIGKILL torchrun and every rank. torchrun starts each rank in its own session, so killing
    torchrun's process group is not enough: the ranks are found as torchrun's descendants (and
    by the pids in their state files) before anything is killed, and each rank's group too."""
    below = set(descendants(proc.pid))
    orphans = {s["pid"] for s in _states(folder).values()} - below  # ranks no longer below it
    for pid in [proc.pid, *sorted(orphans)]:
        kill_process_tree(pid)
    proc.wait()
    deadline = time.time() + KILL_WAIT_S
    while time.time() < deadline and any(alive(p) for p in below | orphans):
        time.sleep(POLL_S)


def _collect(job: object, items: list[str], folder: Path, code: int,
             timed_out: dict | None) -> Attempt:
    """The attempt's records, and a row for the item that did not finish."""
    records = []
    path = folder / "records.jsonl"
    if path.exists():
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                   if line.strip()]
    done = len(records)
    logs = {r: log_tail(folder / f"rank_{r}.log") for r in range(job.world_size)}  # type: ignore[attr-defined]
    if done == len(items):
        _exit_warnings(records, code, logs, folder, job)
        return Attempt(records)
    item = items[done]
    states = timed_out if timed_out is not None else _states(folder)
    status, message, rank = _diagnose(job, item, folder, code, timed_out, states)
    started = any(s.get("index", -1) >= 0 for s in states.values())
    failed = _failed_record(job, item, status, message, rank, logs, folder)
    if not started:  # it never got to an item: every later launch would fail the same way
        rest = [_failed_record(job, i, status, message, rank, logs, folder) for i in items[done + 1:]]
        return Attempt(records + [failed] + rest)
    return Attempt(records, failed, items[done + 1:])


# What a rank's error says when it failed because of another rank (it lost its peer, or waited
# in a collective until the collective's own timeout).
_PEER_LOST = ("connection closed by peer", "connection reset", "remote worker crash",
              "broken pipe", "socket closed", "timed out", "timeout")


def _diagnose(job: object, item: str, folder: Path, code: int, timed_out: dict | None,
              states: dict[int, dict]) -> tuple[str, str, int | None]:
    """(status, message, rank) of the failure of `item`: the rank that failed first, not the
    ranks that failed because it did (a peer's collective then fails with "connection closed by
    peer", and torchrun stops everyone else with SIGTERM)."""
    fails = {}
    for path in folder.glob("rank_*.fail.json"):
        info = json.loads(path.read_text(encoding="utf-8"))
        fails[info["rank"]] = info
    own = sorted(r for r, f in fails.items()
                 if not any(p in f["message"].lower() for p in _PEER_LOST))
    if own:  # a rank raised on its own: its account is the best one
        info = fails[own[0]]
        return info["status"], f"rank {info['rank']}: {info['message']}", info["rank"]
    if timed_out is not None:
        return "error", _hang_message(job, item, states), _laggard(states)
    exits = _exit_codes(log_tail(folder / "agent.log", 400))
    died = sorted(r for r, c in exits.items() if r not in fails and c != -signal.SIGTERM)
    if not died and fails and states:  # every failure was a consequence: blame who stopped first
        lag = _laggard(states)
        waited = ", ".join(map(str, sorted(fails)))
        return "error", (f"rank {lag} stopped at '{states[lag]['stage']}' (hung) while rank(s) "
                         f"{waited} failed waiting for it in a collective: "
                         f"{fails[min(fails)]['message']}"), lag
    rank = died[0] if died else _laggard(states)
    where = states.get(rank, {}).get("stage", "starting") if rank is not None else "starting"
    who = f"rank {rank}" if rank is not None else "a rank"
    what = f"torchrun exited with code {code}"
    if rank in exits:  # 'exit code -11 (SIGSEGV)'
        died_with = exits[rank]
        what = f"exit code {died_with}" + (f" ({signal_name(-died_with)})" if died_with < 0 else "")
    return "error", f"{who} died ({what}) while {where}; the other ranks were stopped", rank


def _laggard(states: dict[int, dict]) -> int | None:
    """The rank the others wait for: of the ranks not waiting in a collective (all of them if
    none or every one is), the one with the fewest stage changes."""
    if not states:
        return None
    working = [s for s in states.values() if not s.get("waiting")] or list(states.values())
    return min(working, key=lambda s: (s["index"], s["seq"]))["rank"]


def _hang_message(job: object, item: str, states: dict[int, dict]) -> str:
    timeout = job.timeout_s  # type: ignore[attr-defined]
    if not states:
        return (f"timed out after {timeout:g} s before any rank started (torchrun or the "
                "rendezvous hung); every process was killed")
    lag = _laggard(states)
    others = sorted(r for r in states if r != lag)
    waiting = {states[r]["stage"] for r in others}
    lagging = states[lag]["stage"]  # type: ignore[index]
    alone = sum(not s.get("waiting") for s in states.values()) == 1  # the others wait for it
    if len(states) > 1 and not alone and states[lag]["seq"] == max(s["seq"] for s in states.values()):  # type: ignore[index]
        return (f"timed out after {timeout:g} s in {item}: every rank stopped at '{lagging}' "
                "(a collective that never completed); every process was killed")
    peers = (f" while rank(s) {', '.join(map(str, others))} waited at "
             f"'{', '.join(sorted(waiting))}'" if others else "")  # none at world size 1
    return (f"timed out after {timeout:g} s in {item}: rank {lag} hung at '{lagging}'{peers}; "
            "every process was killed")


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def _exit_codes(lines: list[str]) -> dict[int, int]:
    """rank -> exit code, from torchrun's failure summary (every rank it lists)."""
    return {int(r): int(c) for r, c in _FAILURE.findall("\n".join(lines))}


def _failed_record(job: object, item: str, status: str, message: str, rank: int | None,
                   logs: dict[int, list[str]], folder: Path) -> dict:
    from lmperf.core.launch import parent_env
    from lmperf.results.schema import make_record

    tail = logs.get(rank, []) if rank is not None else log_tail(folder / "agent.log")
    return make_record(job.kind, job.item_spec(item), status, parent_env(job),  # type: ignore[attr-defined]
                       message=message, failed_rank=rank, log_tail=tail)


def _exit_warnings(records: list[dict], code: int, logs: dict[int, list[str]], folder: Path,
                   job: object) -> None:
    """Every item finished; say so on the records if the ranks did not leave cleanly."""
    aborted = [r for r, lines in logs.items() if any("terminate called" in ln for ln in lines)]
    unclean = [r for r in range(job.world_size)  # type: ignore[attr-defined]
               if not (folder / f"rank_{r}.exit.json").exists()]
    notes = []
    if aborted:
        notes.append(f"rank(s) {aborted} aborted at exit ('terminate called')")
    if code != 0 or unclean:
        notes.append(f"torchrun exited with code {code}; rank(s) {unclean} did not finish "
                     "destroy_process_group()")
    for record in records:
        record["warnings"] = list(record.get("warnings", [])) + notes
