"""SpecSteer Notes: start the notes app (`python sample_apps/notes/app.py`, or `./dev notes`).

Runs the Qwen2.5 0.5B/1.5B pair that `./dev demo` compiles (`--tiny`: the tiny test models,
which write random text, with a banner saying so), fills a new history store with the persona's
notes and sent mail (`sample_apps/data`) on first run, starts a companion process (and starts it
again if it dies) unless `--companion URL` names one (or `--no-companion`), and serves the page
on http://127.0.0.1:8300.
"""

from __future__ import annotations

import argparse
import signal
import sys
import webbrowser
from pathlib import Path

from engine import NotesEngine, Settings
from server import serve

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # sample_apps/companion.py
from companion import TEST_MODELS_BANNER, KeptCompanion, models  # noqa: E402

from specsteer.history import HistoryStore  # noqa: E402
from specsteer.history.ingest import ingest_path  # noqa: E402
from specsteer.models.registry import home  # noqa: E402
from specsteer.runtime import load_device_model  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="./dev notes", description="SpecSteer Notes: a notes app that continues your note "
        "in your voice (Qwen2.5 0.5B on this device, steered by 1.5B in a companion).",
        epilog="examples: ./dev notes  |  ./dev notes --tiny  |  ./dev notes --companion "
        "wss://companion.example:8765 --token $SPECSTEER_TOKEN  (docs/apps.md)")
    parser.add_argument("--port", type=int, default=8300, help="0 picks a free port")
    parser.add_argument("--tiny", action="store_true",
                        help=f"the tiny test models instead of the Qwen pair ({TEST_MODELS_BANNER};"
                        " for tests)")
    parser.add_argument("--companion", default="",
                        help="ws://HOST:PORT of a running companion (default: start one)")
    parser.add_argument("--no-companion", action="store_true", help="local Specialist only")
    parser.add_argument("--token", default="", help="device token for the companion")
    parser.add_argument("--preset", default="default", choices=("default", "fast", "strict"))
    parser.add_argument("--history", type=Path, default=None,
                        help="history file (default: $SPECSTEER_HOME/apps/notes.db)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--min-token-ms", type=float, default=None,
                        help="pace the stream for reading (default 25 with --tiny, else 0)")
    parser.add_argument("--open", action="store_true", help="open the page in a browser")
    return parser.parse_args(argv)


def history(path: Path | None) -> HistoryStore:
    """The user's store; a new one starts with the persona's notes and sent mail."""
    store = HistoryStore(path or home() / "apps" / "notes.db")
    if len(store) == 0:
        for name in ("notes.json", "sent.mbox"):
            ingest_path(store, DATA / name)
    return store


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    specialist, generalist = models(args.tiny)
    companion, kept = args.companion, None
    if not companion and not args.no_companion:
        print("starting a companion (Generalist + generic Specialist)...", flush=True)
        kept = KeptCompanion(generalist, specialist)
        companion = kept.url
    settings = Settings(companion=companion, token=args.token, preset=args.preset)
    engine = NotesEngine(
        load_device_model(specialist), history(args.history), settings,
        max_new_tokens=args.max_new_tokens or (240 if args.tiny else 120),
        min_token_s=(args.min_token_ms if args.min_token_ms is not None
                     else 25.0 if args.tiny else 0.0) / 1000,
        reply_timeout_s=4.0 if args.tiny else 30.0, test_models=args.tiny,
    )
    server = serve(engine, port=args.port)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"SpecSteer Notes on {url}  (companion: {companion or 'none'})", flush=True)
    if args.open:
        webbrowser.open(url)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the companion child is stopped
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.close()
        if kept is not None:
            kept.stop()


if __name__ == "__main__":
    sys.exit(main())
