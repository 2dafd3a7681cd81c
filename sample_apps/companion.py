"""The models and the companion process the sample apps use (shared by notes and mail).

`models(tiny)` gives the (device Specialist, companion Generalist) folders: the compiled Qwen2.5
0.5B/1.5B pair (the 0.5B at the device default, w8a8 on a CPU with VNNI and int8 elsewhere; the
1.5B at int8; `./dev demo` compiles both), or with `tiny` the tiny test models (random weights:
they write random text; for tests, and `--tiny` shows a banner saying so). Without the compiled
pair and without `tiny` it stops with what to do, rather than writing random text.

`KeptCompanion` runs `specsteer-companion serve` for an app and keeps it running: a companion
that exits on its own (a crash, a SIGTERM) is reaped at once and started again on the same port,
so the app's URL stays right and its badge comes back online by itself.

Run as a script (`python sample_apps/companion.py [--tiny] [--no-companion]`), it starts a kept
companion on a free loopback port, prints one JSON line `{"specialist", "generalist",
"companion", "test_models"}` and serves until its stdin closes or it is terminated: how the Node
mail app gets one.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

PAIR = ("qwen2.5-0.5b", "qwen2.5-1.5b")  # (device Specialist, companion Generalist)
TEST_MODELS_BANNER = "test models: random text"


def models(tiny: bool) -> tuple[str, str]:
    """(device Specialist, companion Generalist) folders: the Qwen pair, or the tiny ones."""
    if tiny:
        from specsteer.models.tiny import tiny_model_dir

        return str(tiny_model_dir("llama", seed=0)), str(tiny_model_dir("llama", seed=1))
    from specsteer.models.registry import compiled_dir, get_spec

    specs = [get_spec(name) for name in PAIR]  # the device's Specialist at its device default
    folders = [compiled_dir(specs[0], specs[0].device_default),
               compiled_dir(specs[1], specs[1].default_precision)]
    if not all(folder.is_dir() for folder in folders):
        missing = ", ".join(name for name, f in zip(PAIR, folders, strict=True) if not f.is_dir())
        raise SystemExit(
            f"the Qwen pair is not compiled yet ({missing} missing from {folders[0].parent}): "
            "run `./dev demo` once (it fetches and compiles both, ~10 min and 18 GB of RAM), or "
            f"start the app with --tiny for the tiny test models ({TEST_MODELS_BANNER})")
    return str(folders[0]), str(folders[1])


class KeptCompanion:
    """A companion process that is started again when it exits on its own.

    A watcher thread waits on the process (so a dead one is reaped at once, never left
    `<defunct>`), then starts a new one on the same port, retrying with backoff while that
    fails. Another thread drains the process's output, so a companion that logs a line per
    connection (the badge's probes) never blocks on a full pipe; its last lines are kept and
    shown (`log`) when it dies.
    """

    def __init__(self, generalist: str, specialist: str, *, retry_s: tuple[float, float] = (
            1.0, 30.0), log: Callable[[str], None] | None = None) -> None:
        from specsteer_companion.process import start_companion

        self._start = lambda port: start_companion(generalist, specialist, timeout_s=600,
                                                   port=port)
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._retry_s = retry_s
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.restarts = 0
        self._last: deque[str] = deque(maxlen=20)  # the running companion's last output lines
        self.proc, self.url = self._start(0)
        self.port = urlsplit(self.url).port
        self._drain(self.proc)
        threading.Thread(target=self._watch, name="companion-watch", daemon=True).start()

    def _drain(self, proc: object) -> None:
        def run() -> None:
            for line in proc.stdout:  # type: ignore[attr-defined]
                self._last.append(line.rstrip())
        threading.Thread(target=run, name="companion-output", daemon=True).start()

    def _watch(self) -> None:
        while True:
            code = self.proc.wait()  # reaps it
            if self._stopping.is_set():
                return
            last = "\n".join(f"  companion: {line}" for line in self._last)
            self._log(f"the companion exited (code {code}); starting it again on port "
                      f"{self.port}" + (f"; its last lines:\n{last}" if last else ""))
            self._last.clear()
            delay = self._retry_s[0]
            while not self._stopping.is_set():
                try:
                    with self._lock:
                        if self._stopping.is_set():
                            return
                        self.proc, _ = self._start(self.port)
                        self.restarts += 1
                    self._drain(self.proc)
                    break
                except Exception as exc:  # noqa: BLE001 - the port still held, a slow start...
                    self._log(f"the companion did not start again ({exc}); retrying in "
                              f"{delay:g} s")
                    self._stopping.wait(delay)
                    delay = min(delay * 2, self._retry_s[1])

    def stop(self) -> None:
        """Stop the companion for good (the app is closing)."""
        with self._lock:
            self._stopping.set()
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 - a companion that ignores SIGTERM
            self.proc.kill()
            self.proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true",
                        help=f"the tiny test models ({TEST_MODELS_BANNER})")
    parser.add_argument("--no-companion", action="store_true")
    args = parser.parse_args()
    specialist, generalist = models(args.tiny)
    kept = None if args.no_companion else KeptCompanion(generalist, specialist)
    print(json.dumps({"specialist": specialist, "generalist": generalist,
                      "companion": kept.url if kept is not None else "",
                      "test_models": args.tiny}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        sys.stdin.read()  # until the app closes the pipe (or dies)
    except KeyboardInterrupt:
        pass
    finally:
        if kept is not None:
            kept.stop()


if __name__ == "__main__":
    main()
