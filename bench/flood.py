"""Distributed lock-out flood: can a device still log in and generate while many addresses hold
sockets open that never log in? (issue 28, item 1)

The attack of issue 28: K loopback addresses (127.0.1.x; Linux routes all of 127/8 to the
loopback) each keep `--per-address` connections open that never send a Hello, and reopen each
one as soon as the companion drops it. Raw TCP sockets by default; `--upgrade` completes the
websocket handshake first and then stays silent (what reached the Ray ingress when Serve's proxy
held its sockets; it listens itself now, like the single process). While the flood runs, a
real device (`Client`, its own device token, the tiny pair) tries `--tries` times, one after
the other, to log in and generate 8 tokens with `offline="fail"`; a try succeeds when the
generation completes with the companion. Reported: successes, the device's time per try
(p50/max), and how hard the flood pushed (connections opened and dropped by the companion per
second).

Single process (`specsteer-companion serve` as a child; `--descriptor-limit 256` sets its
`ulimit -n`, which lowers its caps to 128 connections, 64 before login):

    python bench/flood.py --addresses 13 --per-address 32 --descriptor-limit 256 --tries 40
    python bench/flood.py --addresses 40 --per-address 28 --tries 40

The Ray ingress (`--ray`: a local cluster, one verifier replica; `--max-connections` sets the
ingress's total, 128 standing in for a 256-descriptor limit):

    python bench/flood.py --ray --addresses 13 --per-address 32 --max-connections 128 --tries 40
    python bench/flood.py --ray --addresses 40 --per-address 28 --tries 40
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import selectors
import socket
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

UPGRADE = (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


@dataclass
class FloodCounts:
    opened: int = 0  # connections established
    dropped: int = 0  # established connections the companion closed or reset
    failed: int = 0  # connects that did not complete (refused, reset, timed out)


class Flood:
    """`per_address` silent connections from each of `addresses`, each reopened as soon as it is
    dropped, run by one thread on a selector until `stop()`."""

    def __init__(self, port: int, addresses: list[str], per_address: int, *,
                 host: str = "127.0.0.1", upgrade: bool = False) -> None:
        self.target = (host, port)
        self.addresses, self.per_address, self.upgrade = addresses, per_address, upgrade
        self.counts = FloodCounts()
        self._held = 0
        self._selector = selectors.DefaultSelector()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)

    def held(self) -> int:
        """Connections established and not dropped yet."""
        return self._held

    def _open(self, address: str) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((address, 0))
            code = sock.connect_ex(self.target)
        except OSError:
            code = errno.ECONNREFUSED
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.counts.failed += 1
            return
        self._selector.register(sock, selectors.EVENT_WRITE, (address, False))

    def _run(self) -> None:
        for address in self.addresses:
            for _ in range(self.per_address):
                self._open(address)
        while not self._stopping.is_set():
            for key, _ in self._selector.select(0.05):
                address, established = key.data
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if not established:
                    self._connected(sock, address)
                else:
                    self._readable(sock, address)
            missing = self.per_address * len(self.addresses) - len(self._selector.get_map())
            for n in range(missing):  # connects that failed at once: try again
                self._open(self.addresses[n % len(self.addresses)])
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def _connected(self, sock: socket.socket, address: str) -> None:
        self._selector.unregister(sock)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            sock.close()
            self.counts.failed += 1
            self._open(address)
            return
        self.counts.opened += 1
        self._held += 1
        if self.upgrade:
            with contextlib.suppress(OSError):
                sock.send(UPGRADE)
        self._selector.register(sock, selectors.EVENT_READ, (address, True))

    def _readable(self, sock: socket.socket, address: str) -> None:
        try:
            if sock.recv(65536):  # the handshake's answer: stay silent
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._selector.unregister(sock)
        sock.close()
        self.counts.dropped += 1
        self._held -= 1
        self._open(address)


@dataclass
class Tries:
    """What the device got during the flood."""

    tries: int = 0
    succeeded: int = 0
    seconds: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)


def device_tries(url: str, token: str, tries: int, *, ssl_context=None) -> Tries:  # type: ignore[no-untyped-def]
    """`tries` fresh logins, each generating 8 tokens with the companion (offline="fail")."""
    from specsteer.client import Client
    from specsteer.models.tiny import tiny_model_dir
    from specsteer.runtime import load_model

    model = load_model(tiny_model_dir("llama", seed=0))
    out = Tries()
    for _ in range(tries):
        out.tries += 1
        started = time.monotonic()
        try:
            client = Client(model, companion=url, token=token, ssl_context=ssl_context,
                            connect_timeout_s=10)
            result = client.generate("Team offsite", max_new_tokens=8, offline="fail")
            ok, why = not result.stats.degraded, result.stats.offline_reason or "degraded"
        except Exception as exc:  # noqa: BLE001 - every failure is a lost try, counted by kind
            ok, why = False, f"{type(exc).__name__}: {str(exc)[:80]}"
        out.seconds.append(time.monotonic() - started)
        if ok:
            out.succeeded += 1
        else:
            out.failures[why] = out.failures.get(why, 0) + 1
    return out


def measure(url: str, token: str, args: argparse.Namespace) -> dict:
    """The device alone, then beside the flood."""
    alone = device_tries(url, token, min(args.tries, 5))
    addresses = [f"127.0.1.{n + 1}" for n in range(args.addresses)]
    with Flood(int(url.rsplit(":", 1)[1]), addresses, args.per_address,
               upgrade=args.upgrade) as flood:
        time.sleep(args.warmup_s)  # the flood fills every slot it can
        before = asdict(flood.counts)
        started = time.monotonic()
        during = device_tries(url, token, args.tries)
        elapsed = time.monotonic() - started
        pushed = {k: (v - before[k]) / elapsed for k, v in asdict(flood.counts).items()}
        held = flood.held()
    return {"alone": _summary(alone), "flood": _summary(during),
            "flood_per_s": pushed, "flood_held_at_end": held}


def _summary(tries: Tries) -> dict:
    return {"tries": tries.tries, "succeeded": tries.succeeded,
            "success_rate": tries.succeeded / max(1, tries.tries),
            "p50_s": statistics.median(tries.seconds) if tries.seconds else None,
            "max_s": max(tries.seconds, default=None), "failures": tries.failures}


def single_process(args: argparse.Namespace, store: Path, token: str) -> dict:
    from specsteer.models.tiny import tiny_model_dir
    from specsteer_companion.process import start_companion

    proc, url = start_companion(str(tiny_model_dir("llama", seed=1)),
                                str(tiny_model_dir("llama", seed=0)), open_access=False,
                                descriptor_limit=args.descriptor_limit,
                                args=["--tokens", str(store)], timeout_s=120)
    try:
        return measure(url, token, args)
    finally:
        proc.terminate()
        proc.wait(30)


def on_ray(args: argparse.Namespace, store: Path, token: str) -> dict:
    import ray
    from ray import serve

    from specsteer.models.tiny import tiny_model_dir
    from specsteer_companion import ray_app
    from specsteer_companion.ray_config import parse_config

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
             namespace="specsteer")
    try:
        url = ray_app.start(parse_config({
            "address": "local", "tokens": str(store),
            "models": {"generalist": str(tiny_model_dir("llama", seed=1)),
                       "specialist": str(tiny_model_dir("llama", seed=0))},
            "verifier": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.5},
            "ingress": {"port": port, "num_cpus": 0.25,
                        **({"max_connections": args.max_connections}
                           if args.max_connections else {}),
                        **({"max_unauthenticated": args.max_unauthenticated}
                           if args.max_unauthenticated else {})}}))
        return measure(url, token, args)
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addresses", type=int, default=13, help="attacking loopback addresses")
    ap.add_argument("--per-address", type=int, default=32, help="silent connections each")
    ap.add_argument("--upgrade", action="store_true",
                    help="complete the websocket handshake before staying silent")
    ap.add_argument("--tries", type=int, default=40, help="device logins during the flood")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="flood alone before the tries")
    ap.add_argument("--descriptor-limit", type=int, help="the companion's ulimit -n")
    ap.add_argument("--ray", action="store_true", help="against the Ray ingress")
    ap.add_argument("--max-connections", type=int, help="with --ray: the ingress's total cap")
    ap.add_argument("--max-unauthenticated", type=int,
                    help="with --ray: the ingress's pre-login pool")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()
    if args.addresses > 254:
        ap.error("--addresses: at most 254 (127.0.1.1 ... 127.0.1.254)")
    from specsteer_companion.auth import TokenStore

    with tempfile.TemporaryDirectory() as home:
        store = Path(home) / "tokens.db"
        token = TokenStore(store).create("legit-device").secret
        result = on_ray(args, store, token) if args.ray else single_process(args, store, token)
    result["config"] = {k: v for k, v in vars(args).items() if k != "json"}
    print(json.dumps(result, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
