"""Does work on one core slow the companion's opening on the other? (the benchmarks' machine)

The latency benchmark runs the device and the companion on one machine, pinned to separate
cores; on two machines, as deployed, neither slows the other. This times the Generalist's
opening (a prefill of `--tokens` public tokens, one thread, pinned to the last core) alone and
beside three neighbours on core 0, in interleaved rounds so drift hits each arm alike:
  * the device's prefill (the Specialist at its device default, looping over 768 tokens in
    128-token passes, as a device prefills a private prompt);
  * a register-only VNNI loop (`bench/mac_peak.c`: no memory traffic at all), where the CPU
    has VNNI and a C compiler is at hand;
  * a scalar busy loop (`python -c "while True: pass"`: no vector units, no memory traffic).
If only the device's prefill slows the opening, the two share memory bandwidth; if the other
loops do too, the cores themselves share the host's execution resources (SMT siblings of a
VM, or a shared clock budget), and any neighbour costs the companion the same.

    flock /tmp/specsteer-heavy.lock python bench/shared_core.py --rounds 6
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from prefill_rate import build_mac_peak  # bench/ is the script's folder: on sys.path

from specsteer.runtime import load_device_model

NEIGHBOUR_CORE = 0


def device_prefill_loop(specialist: str, stop) -> None:
    """Prefill a 768-token prompt over and over on `NEIGHBOUR_CORE` until `stop` is set."""
    os.sched_setaffinity(0, {NEIGHBOUR_CORE})
    model = load_device_model(specialist, threads=1)
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 768)]
    while not stop.is_set():
        session = model.new_session(max_length=800)
        for at in range(0, len(ids), 128):
            session.append(ids[at: at + 128], rows=1)
            if stop.is_set():
                break
        session.close()


def pinned(command: list[str]) -> subprocess.Popen:
    """`command` running on `NEIGHBOUR_CORE`."""
    return subprocess.Popen(["taskset", "-c", str(NEIGHBOUR_CORE), *command],
                            stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generalist", default="qwen2.5-1.5b")
    ap.add_argument("--precision", default="int8", help="the Generalist's")
    ap.add_argument("--specialist", default="qwen2.5-0.5b")
    ap.add_argument("--tokens", type=int, default=128, help="the public prompt's length")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs two cores: one for the companion, one for its neighbour")
    os.sched_setaffinity(0, {cores[-1]})
    generalist = load_device_model(args.generalist, precision=args.precision, threads=1)
    ids = [int(i) for i in np.random.default_rng(1).integers(100, 20000, args.tokens)]

    def opening() -> float:
        session = generalist.new_session(max_length=args.tokens + 8)
        started = time.perf_counter()
        session.append(ids, rows=1)
        seconds = time.perf_counter() - started
        session.close()
        return seconds

    opening()  # warm-up
    with tempfile.TemporaryDirectory() as work:
        peak = build_mac_peak(Path(work))
        arms: dict[str, list[float]] = {"alone": [], "beside the device's prefill": [],
                                        "beside a scalar busy loop": []}
        if peak is not None:
            arms["beside a register-only VNNI loop"] = []
        for _ in range(args.rounds):
            arms["alone"].append(opening())
            stop = mp.Event()
            device = mp.Process(target=device_prefill_loop, args=(args.specialist, stop))
            device.start()
            time.sleep(3.0)  # loaded, and prefilling
            arms["beside the device's prefill"].append(opening())
            stop.set()
            device.join()
            neighbours = {"beside a scalar busy loop": [sys.executable, "-c", "while True: pass"]}
            if peak is not None:
                neighbours["beside a register-only VNNI loop"] = [str(peak), "vnni", "1", "60"]
            for arm, command in neighbours.items():
                process = pinned(command)
                time.sleep(0.3)
                arms[arm].append(opening())
                process.kill()
                process.wait()
    alone = statistics.median(arms["alone"])
    print(f"the Generalist's {args.tokens}-token opening, {args.rounds} rounds "
          f"(median, min-max, x alone):")
    for arm, seconds in arms.items():
        median = statistics.median(seconds)
        print(f"  {arm:34s} {median:.3f} s  ({min(seconds):.3f}-{max(seconds):.3f})  "
              f"{median / alone:.2f}x")


if __name__ == "__main__":
    main()
