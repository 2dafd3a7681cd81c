"""A cold start on the device's runtime: the private prefill runs beside the companion's
session opening (connection, hello, the companion's prefill of the public prompt), and the
text is the one the prefill-first order writes (the same passes)."""

from __future__ import annotations

import threading

from specsteer import protocol
from specsteer.cli.generate import first_token_wait
from specsteer.client import Client
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
        f"{stats.session_ready_s:.2f} s, then the first round" in wait

    # the same text as the prefill first: on ONNX Runtime GenAI nothing runs beside the
    # opening (its passes hold the GIL), and its logits are the device runtime's
    first = Client(load_model(tiny_model_dir("llama", seed=0)), companion=lambda: (
        LocalChannel.for_verifier(Verifier(generalist, device)))).generate(
        request, warm_start=False, max_new_tokens=24)
    assert result.tokens == first.tokens and result.provenance == first.provenance
