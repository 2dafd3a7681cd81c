"""Run `specsteer-companion serve` as a child process (demo, benchmarks, fault tests).

A separate process shares no GIL with the device and can be pinned to its own core, as on a
real deployment where the companion is another machine.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from specsteer.errors import CompanionUnavailable

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent thread ends


def start_companion(
    generalist: str,
    specialist: str,
    precision: str = "int8",
    *,
    specialist_precision: str | None = None,
    threads: int = 1,
    workers: int = 1,
    core: int | None = None,
    timeout_s: float = 300.0,
    batch: bool = False,
    open_access: bool = True,
    args: Sequence[str] = (),
    descriptor_limit: int | None = None,
    startup: list[str] | None = None,
    env: dict[str, str] | None = None,
    port: int = 0,
    die_with_parent: bool = False,
) -> tuple[subprocess.Popen[str], str]:
    """Start a companion on a loopback port (`port`; 0: a free one); return it and its ws://
    (or wss://) URL.

    `precision` is the Generalist's; the Specialist (P_S0) is served at `specialist_precision`,
    by default at a device's (the artifact a `Client` loads by name): a bench whose devices
    load another precision passes theirs.

    `batch` serves with `--batch` (cross-session batched passes, default limits); with
    `args=["--generalist-engine", "vllm", ...]` the Generalist runs on a vLLM engine.
    `open_access` adds `--open`; without it pass `--tokens STORE` in `args` (or set
    $SPECSTEER_COMPANION_HOME). `args` go to `serve` as they are (e.g. `--cert`, `--key`).
    `descriptor_limit` sets the child's `ulimit -n`. `startup` receives the lines the child
    printed up to and including its ready line. `env` adds to (or overrides) the child's
    environment, e.g. `PYTHONPATH` to run another checkout's companion. `die_with_parent`
    (Linux): the child gets SIGTERM when the thread that started it ends, so a parent killed
    outright (no `finally` runs) leaves no companion holding its models' memory behind; start
    it from a thread that lives as long as the companion should.
    """
    cmd = [
        sys.executable,
        "-m",
        "specsteer_companion.cli",
        "serve",
        "--generalist",
        generalist,
        "--specialist",
        specialist,
        "--precision",
        precision,
        *(["--specialist-precision", specialist_precision] if specialist_precision else []),
        "--port",
        str(port),
        *(["--open"] if open_access else []),
        "--threads",
        str(threads),
        "--workers",
        str(workers),
        *(["--batch"] if batch else []),
        *args,
    ]

    def pin() -> None:
        if die_with_parent and sys.platform == "linux":
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if core is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {core})
        if descriptor_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptor_limit, descriptor_limit))

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        preexec_fn=pin,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = [] if startup is None else startup
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("companion ready:"):
            return proc, line.split()[2]
    proc.kill()
    raise CompanionUnavailable("the companion did not start:\n" + "".join(seen[-20:]))
