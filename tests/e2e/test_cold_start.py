"""A cold start on the device's runtime: the private prefill runs beside the companion's
session opening (connection, hello, the companion's prefill of the public prompt), and the
text is the one the prefill-first order writes (the same passes)."""

from __future__ import annotations

import threading

from specsteer import protocol
from specsteer.cli.generate import first_token_wait
from specsteer.client import Client
from specsteer.errors import CompanionUnavailable
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_device_model, load_model
from specsteer_companion.local import LocalChannel
from specsteer_companion.verifier import Verifier

GATE_S = 60.0  # how long a prefill pass waits for the companion's OpenSession before going on


class GatedSession:
    """A device session whose first pass waits until the companion was asked to open its
    session: it can only see that request if it runs beside the opening."""

    def __init__(self, session, opened: threading.Event, seen: list[bool]) -> None:
        self.session, self.opened, self.seen = session, opened, seen

    @property
    def length(self) -> int:
        return self.session.length

    def _gate(self) -> None:
        if not self.seen:
            self.seen.append(self.opened.wait(GATE_S))

    def append(self, ids, rows=None):
        self._gate()
        return self.session.append(ids, rows)

    def append_cancellable(self, ids, cancel, rows=None):
        self._gate()
        return self.session.append_cancellable(ids, cancel, rows)

    def rewind(self, length: int) -> None:
        self.session.rewind(length)

    def close(self) -> None:
        self.session.close()


class GatedModel:
    """The device's model, its sessions gated (everything else is the model's own)."""

    def __init__(self, model, opened: threading.Event) -> None:
        self.model, self.opened, self.seen = model, opened, []

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def new_session(self, max_length: int | None = None) -> GatedSession:
        return GatedSession(self.model.new_session(max_length), self.opened, self.seen)


def _opened_when_asked(opened: threading.Event):
    def tap(direction: str, frame: bytes) -> None:
        if direction == "up" and isinstance(protocol.decode(frame, protocol.Limits()),
                                                  protocol.OpenSession):
            opened.set()
    return tap


def test_the_private_prefill_runs_beside_the_session_opening():
    device = load_device_model(tiny_model_dir("llama", seed=0), threads=1)
    generalist = load_model(tiny_model_dir("llama", seed=1))
    opened = threading.Event()
    gated = GatedModel(device, opened)
    client = Client(gated, companion=lambda: LocalChannel.for_verifier(
        Verifier(generalist, device)), tap=_opened_when_asked(opened))
    request = "the budget for next quarter, in the voice of the earlier posts " * 6
    result = client.generate(request, warm_start=False, max_new_tokens=24)
    assert gated.seen == [True]  # the first prefill pass ran after the companion was asked
    stats = result.stats
    assert stats.session_ready_s is not None and stats.prefill_tokens > 0
    assert not stats.degraded and stats.warm_tokens == 0 and stats.drafted > 0
    wait = first_token_wait(stats)  # what the demo's stats table says
    assert f"device prefill {stats.prefill_s:.2f} s beside the companion session " \
        f"{stats.session_ready_s:.2f} s, then the first token" in wait

    # the same text as the prefill first: on ONNX Runtime GenAI nothing runs beside the
    # opening (its passes hold the GIL), and its logits are the device runtime's
    first = Client(load_model(tiny_model_dir("llama", seed=0)), companion=lambda: (
        LocalChannel.for_verifier(Verifier(generalist, device)))).generate(
        request, warm_start=False, max_new_tokens=24)
    assert result.tokens == first.tokens and result.provenance == first.provenance


class Recorder:
    """The device's model, recording each session's length after every pass (the device's
    track, P_S0's track on the device) and when the companion's SessionOpened came down."""

    def __init__(self, model) -> None:
        self.model, self.lengths, self.opened_at = model, [], None
        self.prompt, self.s0_length = 0, 0  # what the companion waits for before it answers
        self.lock = threading.Lock()

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def new_session(self, max_length: int | None = None):
        session = self.model.new_session(max_length)
        recorder, mine = self, len(self.lengths)
        self.lengths.append([])

        class Recorded(GatedSession):
            def _gate(self) -> None:
                pass

            def append(self, ids, rows=None):
                out = self.session.append(ids, rows)
                recorder.note(mine, self.session.length)
                return out

            def append_cancellable(self, ids, cancel, rows=None):
                out = self.session.append_cancellable(ids, cancel, rows)
                recorder.note(mine, self.session.length)
                return out

        return Recorded(session, threading.Event(), [])

    def note(self, session: int, length: int) -> None:
        with self.lock:
            self.lengths[session].append((length, self.opened_at is not None))

    def tap(self, direction: str, frame: bytes) -> None:
        if direction == "down" and isinstance(protocol.decode(frame, protocol.Limits()),
                                              protocol.SessionOpened):
            # the companion is slow to open: the device has had time for its first round
            pause = threading.Event()
            for _ in range(1200):  # up to 60 s: a loaded test machine
                if self._made():
                    break
                pause.wait(0.05)
            with self.lock:
                self.opened_at = True

    def _made(self) -> bool:
        """The device's track went past its prompt (a draft) and, with `s0_length`, the second
        session reached it (P_S0's public prefill)."""
        with self.lock:
            reached = [max((length for length, _ in passes), default=0)
                       for passes in self.lengths]
        wanted = [self.prompt + 1] + ([self.s0_length] if self.s0_length else [])
        return len(reached) >= len(wanted) and all(
            r >= w for r, w in zip(reached, wanted, strict=False))


REQUEST = "the budget for next quarter, in the voice of the earlier posts " * 6


def _device_and_generalist():
    return (load_device_model(tiny_model_dir("llama", seed=0), threads=1),
            load_model(tiny_model_dir("llama", seed=1)))


def test_the_first_round_is_drafted_beside_the_session_opening():
    """After its prefill the device drafts the first round while the companion still opens
    the session: the draft's passes come before SessionOpened, and the text is the one the
    prefill-first order writes (ONNX Runtime GenAI: nothing beside the opening)."""
    device, generalist = _device_and_generalist()
    recorder = Recorder(device)
    client = Client(recorder, companion=lambda: LocalChannel.for_verifier(
        Verifier(generalist, device)), tap=recorder.tap)
    recorder.prompt = len(client.render(REQUEST)[1].private_ids)
    result = client.generate(REQUEST, warm_start=False, max_new_tokens=24, k=3)
    before = [length for length, opened in recorder.lengths[0] if not opened]
    assert max(before) > recorder.prompt  # drafted tokens pushed before the session opened
    assert result.stats.drafted_beside_opening == 3 and result.stats.drafted_ahead == 0
    assert "(its 3-token draft made beside the session)" in first_token_wait(result.stats)

    first = Client(load_model(tiny_model_dir("llama", seed=0)), companion=lambda: (
        LocalChannel.for_verifier(Verifier(generalist, device)))).generate(
        REQUEST, warm_start=False, max_new_tokens=24, k=3)
    assert first.stats.drafted_beside_opening == 0
    assert (result.tokens, result.provenance) == (first.tokens, first.provenance)


def test_p_s0_on_the_device_prefills_the_public_prompt_beside_the_opening():
    """With P_S0 asked on the device, its track over the public prompt is prefilled while the
    companion opens (on the Generalist alone): the rounds find it ready, and the text is the
    prefill-first order's."""
    device, generalist = _device_and_generalist()
    recorder = Recorder(device)
    client = Client(recorder, companion=lambda: LocalChannel.for_verifier(
        Verifier(generalist)), tap=recorder.tap)
    private, public = (len(ids) for ids in (client.render(REQUEST)[1].private_ids,
                                            client.render(REQUEST)[1].public_ids))
    recorder.prompt, recorder.s0_length = private, public
    result = client.generate(REQUEST, warm_start=False, max_new_tokens=24, s0_on_device=True)
    s0_passes = recorder.lengths[1]  # the second session: P_S0's, over the public prompt
    assert (public, False) in s0_passes  # prefilled before SessionOpened came down
    assert not result.stats.degraded and result.stats.drafted > 0

    first = Client(load_model(tiny_model_dir("llama", seed=0)), companion=lambda: (
        LocalChannel.for_verifier(Verifier(generalist)))).generate(
        REQUEST, warm_start=False, max_new_tokens=24, s0_on_device=True)
    assert (result.tokens, result.provenance) == (first.tokens, first.provenance)


def test_a_first_draft_made_beside_a_failed_opening_is_dropped():
    """The companion is gone: what the device drafted beside the attempt is forgotten, and the
    local text starts right after the prompt, as with no companion at all."""
    device, _ = _device_and_generalist()

    def gone():
        raise CompanionUnavailable("no companion here")

    alone = Client(load_model(tiny_model_dir("llama", seed=0))).generate(
        REQUEST, max_new_tokens=24)
    result = Client(device, companion=gone).generate(REQUEST, warm_start=False,
                                                     max_new_tokens=24)
    assert result.stats.degraded and result.tokens == alone.tokens
