"""A live companion under a seeded fuzzer, while an honest device keeps generating.

The fuzzer opens thousands of websocket connections to a real `CompanionServer` on loopback and
sends what an attacker or a broken client would: random bytes, truncated, mutated and padded
frames, wrong protocol versions, text frames, frames over websockets' max_size, huge claimed
counts, ids beyond the vocabulary, messages out of order, invalid settings, and abrupt
disconnects in the middle of a round. Each connection first walks the protocol with random but
valid requests (random prompts, settings and drafted ids, some sent as fragmented messages),
so the hostile frame lands in every state, and the companion's replies to the valid ones are
checked by the device's own state machine. The oracle for every frame: within a timeout the
companion answers with a valid reply, or an Error frame with a specific code (never INTERNAL;
the exact code when the fault is targeted) followed by a close, or it closes. Meanwhile a
well-behaved `Client` generates in a thread and must produce exactly the tokens of a reference
run made before the fuzzer started, never degraded. Seed: $SPECSTEER_FUZZ_SEED.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from helpers.wire_bytes import varint
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from specsteer import protocol
from specsteer.client import Client
from specsteer.errors import ProtocolError
from specsteer.history import HistoryStore
from specsteer.link import CompanionLink
from specsteer.protocol import ErrorCode, Mode, SessionSettings
from specsteer.steer import SELECTS
from specsteer.transport import WebSocketChannel
from specsteer_companion.server import CompanionServer, ServerConfig
from specsteer_companion.verifier import Verifier

SEED = int(os.environ.get("SPECSTEER_FUZZ_SEED", "7301"))
TARGET_FRAMES = 10_000
# Enough concurrent attackers to keep both verify workers busy, few enough that the honest
# device's requests wait behind at most a dozen others.
WORKERS = 12
# An answer slower than this is a hang: a busy companion answers tiny-model requests in ms, and
# a minute leaves room for a machine loaded many times over (what is checked is that an answer
# comes, not how fast).
REPLY_TIMEOUT_S = 60.0
# The fuzzer stops at TARGET_FRAMES, or here whatever it reached (the frame count then fails):
# far beyond what the frames take on a loaded 2-core machine (~80 s at 5,700 frames a minute
# under a load of 13), so the count does not depend on the machine's speed.
DEADLINE_S = 900.0
LIMITS = protocol.Limits()
KNOWN_CODES = frozenset(int(code) for code in ErrorCode)
CONTEXT = 2048  # the tiny models' window: longer prompts are valid frames the companion refuses
# Hostile but valid settings (temperature 1e-30, alpha 1e30) push log-probabilities past float16;
# they saturate to +-inf on the wire by design, and numpy says so in a warning.
# a live companion under a fuzzer: not in ./dev test --fast
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
              pytest.mark.slow]
CASES = [  # the honest device: all three session modes
    ("Budget for the next quarter", {"method": "specsteer"}),
    ("Meeting notes", {"method": "speculative"}),
    ("Budget for the next quarter", {"method": "light_costeer"}),
]


UNKNOWN_TYPES = [t for t in (0, 13, 99, 255) if t not in set(protocol.MessageType)]
OTHER_VERSIONS = [v for v in (0, 1, 2, 3, 255) if v != protocol.PROTOCOL_VERSION]


def _frame(kind: protocol.MessageType, *parts: bytes) -> bytes:
    return bytes((protocol.PROTOCOL_VERSION, kind)) + b"".join(parts)


def _ids(ids: list[int]) -> bytes:
    return varint(len(ids)) + b"".join(varint(i) for i in ids)


def _settings(
    mode: int = 0,
    select: int = 0,
    flag: int = 0,
    gamma: float = 0.5,
    top_k: int = 8,
    top_p: float = 1.0,
) -> bytes:
    return struct.pack("<BBBfffHQf", mode, select, flag, gamma, 1.0, 0.0, top_k, 0, top_p)


@dataclass
class Tally:
    """What the fuzzer sent and what came back; `problems` must stay empty."""

    frames: int = 0
    hostile: int = 0  # frames built to be rejected, one ends each connection
    valid: int = 0  # random but well-formed requests that must get a valid reply
    connections: int = 0
    aborted: int = 0  # connections dropped without a close handshake mid-round
    codes: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


Expect = frozenset[int] | None  # the exact Error codes allowed, or None: any specific code


@dataclass
class Fuzzer:
    """Builds each connection's script from (SEED, connection index) and checks the replies."""

    url: str
    vocab: int
    tally: Tally = field(default_factory=Tally)

    # -- hostile frames: (name, frame or text, expected codes; "close" = a close, no Error) ----
    def hostile(
        self, rng: random.Random, conn: protocol.DeviceConnection, valid_frame: bytes
    ) -> tuple[str, bytes | str, Expect | str]:
        v, r = self.vocab, conn.round
        state = conn.state
        bad_id = rng.choice([v, v + 1, rng.randrange(v, 2**32)])
        any_code: Expect = None
        menu: list[Callable[[], tuple[str, bytes | str, Expect | str]]] = [
            lambda: ("random bytes", rng.randbytes(rng.randrange(0, 48)), any_code),
            lambda: (
                "wrong version",
                bytes([rng.choice(OTHER_VERSIONS)]) + valid_frame[1:],
                frozenset({ErrorCode.BAD_VERSION}),
            ),
            lambda: (
                "text frame",
                "".join(rng.choice("ab\x01{é") for _ in range(9)),
                frozenset({ErrorCode.BAD_FRAME}),
            ),
            lambda: (
                "oversized",
                bytes((protocol.PROTOCOL_VERSION, 5))
                + rng.randbytes(LIMITS.max_message_bytes + rng.randrange(1, 40_000)),
                "close",
            ),
            lambda: (
                "truncated",
                valid_frame[: rng.randrange(len(valid_frame))],
                frozenset({ErrorCode.BAD_FRAME}),
            ),
            lambda: (
                "trailing bytes",
                valid_frame + rng.randbytes(rng.randrange(1, 9)),
                frozenset({ErrorCode.BAD_FRAME}),
            ),
            lambda: ("mutated", _mutate(rng, valid_frame), any_code),
            lambda: (
                "unknown type",
                bytes((protocol.PROTOCOL_VERSION, rng.choice(UNKNOWN_TYPES))) + valid_frame[2:],
                frozenset({ErrorCode.UNKNOWN_TYPE}),
            ),
            lambda: (
                "prompt id >= vocab",
                _frame(protocol.MessageType.OPEN_SESSION, _settings(), _ids([3, bad_id])),
                frozenset({ErrorCode.BAD_TOKEN}),
            ),
            lambda: (
                "draft id >= vocab",
                _frame(
                    protocol.MessageType.DRAFT,
                    varint(r),
                    _ids([]),
                    varint(2),
                    varint(5),
                    varint(bad_id),
                ),
                frozenset({ErrorCode.BAD_TOKEN}),
            ),
            lambda: (
                "committed id >= vocab",
                _frame(protocol.MessageType.ROW_REQUEST, _ids([bad_id])),
                frozenset({ErrorCode.BAD_TOKEN}),
            ),
            lambda: (
                "huge prompt count",
                _frame(
                    protocol.MessageType.OPEN_SESSION,
                    _settings(),
                    varint(rng.randrange(LIMITS.max_prompt_tokens + 1, 2**32)),
                    b"\x01",
                ),
                frozenset({ErrorCode.LIMIT_EXCEEDED}),
            ),
            lambda: (
                "huge draft count",
                _frame(
                    protocol.MessageType.DRAFT,
                    varint(r),
                    _ids([]),
                    varint(rng.randrange(LIMITS.max_draft + 1, 2**31)),
                    b"\x01",
                ),
                frozenset({ErrorCode.LIMIT_EXCEEDED}),
            ),
            lambda: (
                "huge committed count",
                _frame(
                    protocol.MessageType.ROW_REQUEST,
                    varint(rng.randrange(LIMITS.max_committed + 1, 2**32)),
                    b"\x01",
                ),
                frozenset({ErrorCode.LIMIT_EXCEEDED}),
            ),
            lambda: (
                "count without bytes",
                _frame(
                    protocol.MessageType.ROW_REQUEST,
                    varint(rng.randrange(2, LIMITS.max_committed + 1)),
                    b"\x01",
                ),
                frozenset({ErrorCode.BAD_FRAME}),
            ),
            lambda: (
                "varint over 32 bits",
                _frame(protocol.MessageType.DRAFT, b"\xff\xff\xff\xff\x7f"),
                frozenset({ErrorCode.BAD_FRAME}),
            ),
            lambda: (
                "NaN logp_s0",
                _frame(protocol.MessageType.DRAFT_S0, varint(r), varint(1), b"\x00\x7e"),
                frozenset({ErrorCode.BAD_VALUE}),
            ),
            lambda: (
                "top_k over limit",
                _frame(
                    protocol.MessageType.OPEN_SESSION,
                    _settings(top_k=rng.randrange(LIMITS.max_top_k + 1, 65536)),
                    _ids([1]),
                ),
                frozenset({ErrorCode.LIMIT_EXCEEDED}),
            ),
            lambda: (
                "invalid settings",
                _frame(
                    protocol.MessageType.OPEN_SESSION,
                    rng.choice(
                        [
                            _settings(mode=7),
                            _settings(select=9),
                            _settings(top_k=0),
                            _settings(gamma=-1.0),
                            _settings(gamma=float("nan")),
                            _settings(top_p=0.0),
                            _settings(top_p=1.5),
                        ]
                    ),
                    _ids([1]),
                ),
                frozenset({ErrorCode.BAD_VALUE}),
            ),
            lambda: (
                "flag byte 2",
                _frame(protocol.MessageType.OPEN_SESSION, _settings(flag=2), _ids([1])),
                frozenset({ErrorCode.BAD_FRAME}),
            ),
            lambda: (
                "companion-only message",
                protocol.encode(
                    rng.choice(
                        [
                            protocol.Verdict(r, 0, [1], [0.0]),
                            protocol.SessionOpened(1, 1),
                            protocol.RowReply([1], [0.0], [0.0]),
                            protocol.HelloOk("x", "", "", v, 4, 8, 1024, 8),
                        ]
                    )
                ),
                frozenset({ErrorCode.OUT_OF_ORDER}),
            ),
            lambda: (
                "device Close/Error",
                protocol.encode(
                    rng.choice(
                        [protocol.Close("bye"), protocol.Error(rng.randrange(65536), "boom")]
                    )
                ),
                "close",
            ),
        ]
        if state is protocol.State.START:
            menu.append(
                lambda: (
                    "request before Hello",
                    protocol.encode(
                        rng.choice(
                            [
                                protocol.OpenSession([1, 2]),
                                protocol.Draft(0, [], [1]),
                                protocol.RowRequest([1]),
                            ]
                        )
                    ),
                    frozenset({ErrorCode.OUT_OF_ORDER}),
                )
            )
            menu.append(
                lambda: (
                    "invalid UTF-8 in Hello",
                    _frame(protocol.MessageType.HELLO, b"\x02\xc3\x28", b"\x00" * 3),
                    frozenset({ErrorCode.BAD_FRAME}),
                )
            )
        else:
            menu.append(
                lambda: (
                    "second Hello",
                    protocol.encode(protocol.Hello("")),
                    frozenset({ErrorCode.OUT_OF_ORDER}),
                )
            )
            # Valid frames the tiny companion cannot serve; refused, and the quota comes back.
            menu.append(
                lambda: (
                    "empty prompt",
                    protocol.encode(protocol.OpenSession([])),
                    frozenset({ErrorCode.BAD_VALUE}),
                )
            )
            menu.append(
                lambda: (
                    "prompt over the KV cache",
                    protocol.encode(
                        protocol.OpenSession(
                            [rng.randrange(v) for _ in range(CONTEXT + rng.randrange(1, 99))]
                        )
                    ),
                    frozenset({ErrorCode.LIMIT_EXCEEDED}),
                )
            )
        if state is protocol.State.SESSION:
            session = conn.session
            assert session is not None
            rows = session.settings.mode is Mode.ROWS
            menu.append(
                lambda: (
                    "wrong round",
                    protocol.encode(protocol.Draft(r + rng.randrange(1, 9), [], [1])),
                    frozenset({ErrorCode.OUT_OF_ORDER}),
                )
            )
            menu.append(
                lambda: (
                    "request of the other mode",
                    protocol.encode(
                        protocol.Draft(r, [], [1]) if rows else protocol.RowRequest([1])
                    ),
                    frozenset({ErrorCode.OUT_OF_ORDER}),
                )
            )

            def over_the_cache() -> protocol.Message:  # committed ids the session cannot hold
                ids = [rng.randrange(v) for _ in range(CONTEXT + 1)]
                return (
                    protocol.RowRequest(ids)
                    if rows
                    else protocol.Draft(r, ids, [1])
                )

            menu.append(
                lambda: (
                    "session over the KV cache",
                    protocol.encode(over_the_cache()),
                    frozenset({ErrorCode.LIMIT_EXCEEDED}),
                )
            )
            if not rows:
                menu.append(
                    lambda: (
                        "DraftS0 with no Draft outstanding",
                        protocol.encode(protocol.DraftS0(r, [-1.0])),
                        frozenset({ErrorCode.OUT_OF_ORDER}),
                    )
                )
        return rng.choice(menu)()

    # -- one connection ------------------------------------------------------------------------
    async def connection(self, index: int, worker: int) -> None:
        rng = random.Random(f"{SEED}:{index}")
        self.tally.connections += 1
        async with connect(
            self.url,
            compression=None,
            max_size=None,
            proxy=None,
            open_timeout=REPLY_TIMEOUT_S,
            close_timeout=2,
        ) as ws:
            conn = protocol.DeviceConnection()
            if rng.random() < 0.25:  # the hostile frame is the very first one
                await self.finish(rng, ws, conn, protocol.encode(protocol.Hello("")))
                return
            name = rng.choice([f"fuzz-{worker}", "", "ü" * rng.randrange(1, 300)])
            conn.hello("", "", auth_token=rng.randbytes(8).hex(), client_name=name)
            shared = name == ""  # every nameless device is "anonymous": its quota may be full
            last = conn.data_to_send()
            if not await self.valid(ws, conn, last, shared):
                return
            for _ in range(rng.randrange(0, 5)):
                last = self.valid_request(rng, conn)
                if not await self.valid(ws, conn, last, shared, fragmented=rng.random() < 0.1):
                    return
            ending = rng.random()
            if ending < 0.08 and conn.state is protocol.State.SESSION:
                frames = self.valid_request(rng, conn)  # then vanish mid-round (a Draft
                for frame in frames[: rng.randrange(1, len(frames) + 1)]:  # without its P_S0)
                    await ws.send(frame)
                    self.tally.frames += 1
                    self.tally.valid += 1
                ws.transport.abort()
                self.tally.aborted += 1
                self.tally.outcomes["aborted"] += 1
            elif ending < 0.12:
                conn.close("done")
                for frame in conn.data_to_send():
                    await ws.send(frame)
                    self.tally.frames += 1
                self.tally.outcomes["polite close"] += 1
            else:
                await self.finish(rng, ws, conn, last[-1])

    def valid_request(self, rng: random.Random, conn: protocol.DeviceConnection) -> list[bytes]:
        """A random but valid request for the current state, as frames to send."""
        v = self.vocab
        if conn.state is protocol.State.READY or rng.random() < 0.05:
            mode = rng.choice(list(Mode))
            length = (
                rng.randrange(64, CONTEXT - 400)
                if rng.random() < 0.05
                else rng.choice([1, 2, rng.randrange(1, 64)])
            )
            conn.open_session(
                [rng.randrange(v) for _ in range(length)],
                SessionSettings(
                mode=mode,
                gamma=rng.choice([0.0, 0.5, 1.0, 1e-30, 1e30, rng.uniform(0, 5)]),
                alpha=rng.choice([0.0, 1.0, -3.0, 1e30, rng.uniform(-5, 5)]),
                top_k=rng.choice([1, 8, 64, 64, LIMITS.max_top_k, rng.randrange(1, 200)]),
                temperature=rng.choice([0.0, 0.0, 1.0, 1e-30, 1e30, rng.uniform(0, 3)]),
                seed=rng.randrange(2**64),
                select=rng.choice(SELECTS),
                s0_on_device=mode is not Mode.ROWS and rng.random() < 0.3,
                top_p=rng.choice([1.0, 1.0, 0.5, 1e-6, rng.uniform(1e-6, 1.0)]),
                ),
            )
        elif conn.session is not None and conn.session.settings.mode is Mode.ROWS:
            conn.request_row([rng.randrange(v) for _ in range(rng.randrange(0, 4))])
        else:
            assert conn.session is not None
            draft = [rng.randrange(v) for _ in range(rng.randrange(0, LIMITS.max_draft + 1))]
            logp = [
                rng.choice([0.0, -1.5, -70000.0, float("-inf"), float("inf"), rng.uniform(-20, 0)])
                for _ in draft
            ]
            committed = [rng.randrange(v) for _ in range(rng.randrange(3))]
            conn.send_draft(draft, committed_ids=committed)
            if conn.session.settings.s0_on_device:
                conn.send_draft_s0(logp)
        return conn.data_to_send()

    async def valid(
        self,
        ws: ClientConnection,
        conn: protocol.DeviceConnection,
        frames: list[bytes],
        shared: bool,
        fragmented: bool = False,
    ) -> bool:
        """Send a valid request; its reply must be valid for the device's state machine."""
        for frame in frames:
            if fragmented and len(frame) > 2:
                cut = len(frame) // 2
                await ws.send([frame[:cut], frame[cut:]])
            else:
                await ws.send(frame)
            self.tally.frames += 1
            self.tally.valid += 1
        reply = await self.reply(ws, "valid request")
        if not isinstance(reply, bytes):
            return False
        try:
            events = conn.receive_frame(reply)
        except ProtocolError as exc:
            self.tally.problems.append(f"invalid reply to a valid request: {exc}")
            return False
        for event in events:
            if isinstance(event, protocol.ErrorReceived):
                self.tally.codes[event.code] += 1
                if not (shared and event.code == ErrorCode.SESSION_LIMIT):
                    self.tally.problems.append(f"valid request refused: {event}")
                return False
        return True

    async def finish(
        self,
        rng: random.Random,
        ws: ClientConnection,
        conn: protocol.DeviceConnection,
        valid_frame: bytes,
    ) -> None:
        """Send one hostile frame; check the Error code (or the close) and that a close follows."""
        name, frame, expected = self.hostile(rng, conn, valid_frame)
        self.tally.frames += 1
        self.tally.hostile += 1
        with contextlib.suppress(ConnectionClosed):  # closed while an oversized frame was sent
            await ws.send(frame)
        reply = await self.reply(ws, name)
        if reply == "closed":
            self.tally.outcomes["closed"] += 1
            if isinstance(expected, frozenset):
                self.tally.problems.append(f"{name}: closed ({ws.close_code}), not an Error")
            if name == "oversized" and ws.close_code != 1009:
                self.tally.problems.append(f"oversized: close code {ws.close_code}, not 1009")
            return
        if not isinstance(reply, bytes):
            return
        try:
            message = protocol.decode(reply, LIMITS)
        except ProtocolError as exc:
            self.tally.problems.append(f"{name}: undecodable reply {exc}")
            return
        if not isinstance(message, protocol.Error):  # a mutation that stayed valid: fine
            self.tally.outcomes["valid by chance"] += 1
            return
        self.tally.codes[message.code] += 1
        self.tally.outcomes["error"] += 1
        if (
            message.code not in KNOWN_CODES
            or message.code == ErrorCode.INTERNAL
            or expected == "close"
            or (isinstance(expected, frozenset) and message.code not in expected)
        ):
            self.tally.problems.append(
                f"{name}: got {message.code} {message.message!r}, expected {expected}"
            )
        try:  # after an Error the companion closes; anything else it sends is a problem
            extra = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
            self.tally.problems.append(f"{name}: frame after the Error: {extra!r:.60}")
        except ConnectionClosed:
            pass
        except TimeoutError:
            self.tally.problems.append(f"{name}: connection left open after the Error")

    async def reply(self, ws: ClientConnection, what: str) -> bytes | str:
        try:
            return await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S)
        except ConnectionClosed:
            return "closed"
        except TimeoutError:
            self.tally.problems.append(f"{what}: no answer within {REPLY_TIMEOUT_S} s (hang)")
            return "hang"

    async def run(self) -> Tally:
        next_index = 0
        deadline = time.monotonic() + DEADLINE_S

        async def worker(number: int) -> None:
            nonlocal next_index
            while self.tally.frames < TARGET_FRAMES and time.monotonic() < deadline:
                index, next_index = next_index, next_index + 1
                try:
                    await self.connection(index, number)
                except (ConnectionClosed, OSError, TimeoutError) as exc:
                    self.tally.problems.append(f"connection {index}: {type(exc).__name__} {exc}")

        await asyncio.gather(*(worker(n) for n in range(WORKERS)))
        return self.tally


def _name(code: int) -> str:
    return ErrorCode(code).name if code in KNOWN_CODES else str(code)


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(3)
        if op == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 1:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        elif data:
            del data[rng.randrange(len(data))]
    return bytes(data)


def test_fuzzer_against_a_live_companion(tiny_model, tiny_generalist):
    history = HistoryStore(memory=True)
    history.add(
        kind="email",
        title="Budget for the next quarter",
        body="Dear team, the budget for the next quarter stays as it is.",
    )
    server = CompanionServer(Verifier(tiny_generalist, tiny_model), ServerConfig(port=0))
    with server.running() as url:
        client = Client(tiny_model, history=history, companion=url, timeout_s=REPLY_TIMEOUT_S,
                        connect_timeout_s=REPLY_TIMEOUT_S)
        reference = [
            client.generate(q, max_new_tokens=24, offline="fail", **p).tokens for q, p in CASES
        ]
        stop = threading.Event()
        honest: list[tuple[int, list[int], bool, str | None]] = []
        crashed: list[BaseException] = []

        def generate_all_the_time() -> None:
            try:
                while not stop.is_set():
                    for n, (query, params) in enumerate(CASES):
                        r = client.generate(query, max_new_tokens=24, **params)
                        honest.append((n, r.tokens, r.stats.degraded, r.stats.offline_reason))
            except BaseException as exc:  # reported below: nothing may escape to the app
                crashed.append(exc)

        thread = threading.Thread(target=generate_all_the_time, name="honest-device")
        thread.start()
        started = time.perf_counter()
        try:
            tally = asyncio.run(Fuzzer(url, tiny_generalist.vocab_size).run())
        finally:
            stop.set()
            thread.join(60)
        elapsed = time.perf_counter() - started
        print(
            f"\nfuzz seed {SEED}: {tally.frames} frames ({tally.hostile} hostile, "
            f"{tally.valid} valid random) over {tally.connections} connections, "
            f"{tally.aborted} aborted mid-round, in {elapsed:.1f} s; honest generations: "
            f"{len(honest)}; outcomes {dict(tally.outcomes)}; "
            f"codes { {_name(c): n for c, n in sorted(tally.codes.items())} }"
        )

        assert not thread.is_alive() and not crashed, crashed
        assert tally.problems == [], tally.problems[:20]
        assert tally.frames >= TARGET_FRAMES, f"only {tally.frames} frames in {DEADLINE_S} s"
        assert tally.hostile >= 1000 and tally.aborted >= 50
        assert len(honest) >= len(CASES)
        for n, tokens, degraded, reason in honest:
            assert not degraded, reason
            assert tokens == reference[n]

        # still serving: every session the fuzzer opened was released, and a device is served
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while server.open_sessions() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.open_sessions() == 0
        for n, (query, params) in enumerate(CASES):
            again = client.generate(query, max_new_tokens=24, offline="fail", **params)
            assert again.tokens == reference[n] and not again.stats.degraded
        link = CompanionLink(WebSocketChannel(url), timeout=REPLY_TIMEOUT_S)
        assert link.hello(client_name="fuzz-0").vocab_size == tiny_generalist.vocab_size
        link.close()
