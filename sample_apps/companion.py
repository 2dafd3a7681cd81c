"""The models and the companion process the sample apps use (shared by notes and mail).

`models(real)` gives the (device Specialist, companion Generalist) folders: the tiny test models
(built in seconds) by default, the compiled Qwen2.5 0.5B/1.5B int8 pair with `real`. Run as a
script (`python sample_apps/companion.py [--real] [--no-companion]`), it starts a companion on a
free loopback port, prints one JSON line `{"specialist", "generalist", "companion"}` and serves
until its stdin closes or it is terminated: how the Node mail app gets one.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys


def models(real: bool) -> tuple[str, str]:
    """(device Specialist, companion Generalist) folders."""
    if real:
        from specsteer.models.compile import compile_model

        return (str(compile_model("qwen2.5-0.5b", "int8")),
                str(compile_model("qwen2.5-1.5b", "int8")))
    from specsteer.models.tiny import tiny_model_dir

    return str(tiny_model_dir("llama", seed=0)), str(tiny_model_dir("llama", seed=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--no-companion", action="store_true")
    args = parser.parse_args()
    specialist, generalist = models(args.real)
    proc, url = None, ""
    if not args.no_companion:
        from specsteer_companion.process import start_companion

        proc, url = start_companion(generalist, specialist, timeout_s=600)
    print(json.dumps({"specialist": specialist, "generalist": generalist, "companion": url}),
          flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        sys.stdin.read()  # until the app closes the pipe (or dies)
    except KeyboardInterrupt:
        pass
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
