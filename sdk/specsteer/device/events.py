"""What a generation yields and counts: `TokenEvent`, `DecodeStats`, and its two prompts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenEvent:
    """One emitted token and where it came from.

    provenance: "draft" (Specialist draft accepted by the companion), "recovered" (chosen after a
    reject by fusing the companion's sparse vector with the private term), "bonus" (same fusion
    after a fully accepted draft), "generalist" (baselines steered by the Generalist's row every
    token), "local" (the Specialist alone: local methods or offline-degraded mode).
    """

    token: int
    provenance: str
    round: int


@dataclass
class DecodeStats:
    """Counters of one generation; timings in seconds."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    prefill_s: float = 0.0
    device_s: float = 0.0
    wait_s: float = 0.0
    first_token_s: float | None = None
    degraded: bool = False
    offline_reason: str | None = None
    reconnects: int = 0  # times collaboration resumed after going local
    resyncs: int = 0  # dropped links replaced at once by a resumed session (no local token)
    pipelined: int = 0  # rounds whose draft was made while the previous one was verified
    cancelled: bool = False  # the caller's cancel event stopped the generation
    loop_ended: bool = False  # `Params.loop_end_ngram` ended a looping text at a sentence end
    warm_tokens: int = 0  # Generalist tokens written during a warm start, before the switch
    switch_s: float | None = None  # seconds from the start until Draft-Verify-Recover took over
    # seconds from the start until the companion held the session (hello, its prefill of the
    # public prompt; a cold start's private prefill runs beside them)
    session_ready_s: float | None = None
    session_reused: bool = False  # the companion session was opened ahead by `Client.prepare`
    drafted_ahead: int = 0  # tokens of the first round's draft made ahead by `Client.prepare`
    accept_lengths: list[int] = field(default_factory=list)
    # the leak guard (device/leak_guard.py): spans it flagged; drafted tokens it cut from drafts
    # or picks it turned away ("redact"); tokens decoded on the device alone because it held
    leak_flagged: int = 0
    leak_redacted: int = 0
    leak_held: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class DevicePrompt:
    """The two views of one request: with the private context (device only) and without."""

    private_ids: Sequence[int]  # chat prompt with the retrieved history: P_Sc, never sent
    public_ids: Sequence[int]  # the same request without it: what the companion sees
