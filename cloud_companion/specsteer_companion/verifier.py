"""Per-session verification on the companion: the Generalist and the generic Specialist.

The companion holds, per device session, one KV session of the Generalist (P_G) and one of the
context-free Specialist (P_S0, the very same compiled artifact the device runs). A round appends
the newly committed ids and the draft to both in one pass each, decides acceptance with the ratio
test of `specsteer.steer`, prepares the sparse vector for the next position, and rewinds both
caches to the accepted prefix. It never sees, and has no way to receive, the private context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from specsteer import steer
from specsteer.protocol import Mode, OpenSession, Select
from specsteer.runtime.base import LanguageModel, Session

if TYPE_CHECKING:
    from specsteer_companion.cross import CrossVerifierSession


@dataclass(frozen=True)
class RoundResult:
    """What one verification round sends back: accepted count and sparse candidates."""

    accepted: int
    ids: np.ndarray
    values: np.ndarray
    # for ROWS mode: logp_S0 at the same ids
    s0_values: np.ndarray | None = None


@dataclass
class Verifier:
    """The companion's models. `specialist` may be None when devices send P_S0 themselves."""

    generalist: LanguageModel
    specialist: LanguageModel | None = None
    max_session_tokens: int = 4096

    def open(self, request: OpenSession) -> VerifierSession | CrossVerifierSession:
        """A session on the token path, or on the text path when the tokenizers differ."""
        s = self.specialist
        if s is not None and s.tokenizer.vocab_hash != self.generalist.tokenizer.vocab_hash:
            from specsteer_companion.cross import CrossVerifierSession  # imports this module

            return CrossVerifierSession(self, request)
        return VerifierSession(self, request)


@dataclass
class _Track:
    """One model's KV session plus its row for the next position."""

    session: Session
    pending: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))

    def extend(self, ids: Sequence[int]) -> np.ndarray:
        """Rows predicting each of `ids` and the position after them: [len(ids)+1, V]."""
        if not ids:
            return self.pending[None, :]
        rows = self.session.append(ids)
        return np.concatenate([self.pending[None, :], rows])

    def keep(self, length: int, row: np.ndarray) -> None:
        self.session.rewind(length)
        self.pending = row


class VerifierSession:
    """One device's generation on the companion."""

    def __init__(self, verifier: Verifier, request: OpenSession) -> None:
        self.request = request
        self.mode = Mode(request.mode)
        prompt = list(request.prompt_ids)
        self.temperature = request.temperature if request.temperature > 0 else 1.0
        self.g = self._track(verifier.generalist, prompt, verifier.max_session_tokens)
        needs_s0 = self.mode is Mode.SPECSTEER and not request.s0_on_device
        needs_s0 |= self.mode is Mode.ROWS and request.alpha != 0.0
        if needs_s0 and verifier.specialist is None:
            raise ValueError(
                "this companion hosts no generic Specialist; send logp_S0 from the device"
            )
        self.s0 = (
            self._track(verifier.specialist, prompt, verifier.max_session_tokens)
            if needs_s0
            else None
        )
        self.length = len(prompt)
        self.rng = np.random.default_rng(request.seed) if request.temperature > 0 else None

    @staticmethod
    def _track(model: LanguageModel, prompt: list[int], max_tokens: int) -> _Track:
        session = model.new_session(max_length=max_tokens)
        track = _Track(session)
        track.pending = session.append(prompt)[-1]
        return track

    def _logp(self, rows: np.ndarray) -> np.ndarray:
        return steer.log_softmax(rows, self.temperature)

    def verify(
        self,
        committed: Sequence[int],
        draft: Sequence[int],
        logp_s0_draft: Sequence[float] | None = None,
    ) -> RoundResult:
        """One Draft–Verify–Recover round (or a classic speculative round in SPECULATIVE mode)."""
        seq = [*committed, *draft]
        offset = len(committed)
        g_rows = self.g.extend(seq)
        if self.mode is Mode.SPECULATIVE:
            accepted, token = steer.classic_accept_greedy(draft, g_rows[offset:])
            ids, values = np.array([token], np.int32), np.zeros(1, np.float16)
            self._keep(offset, accepted, g_rows, None)
            return RoundResult(accepted, ids, values)
        logp_g = self._logp(g_rows)
        positions = np.arange(len(draft))
        lg_draft = logp_g[offset + positions, list(draft)] if draft else np.zeros(0, np.float32)
        if self.s0 is not None:
            s0_rows = self.s0.extend(seq)
            logp_s0 = self._logp(s0_rows)
            ls0_draft = logp_s0[offset + positions, list(draft)] if draft else lg_draft
        else:
            s0_rows = logp_s0 = None
            ls0_draft = np.asarray(logp_s0_draft, np.float32)
        accepted = steer.ratio_accept_count(lg_draft, ls0_draft, self.request.gamma, self.rng)
        at = offset + accepted
        if logp_s0 is None:  # P_S0 lives on the device: send top-k of logp_G, the device fuses
            top = steer.nucleus(
                logp_g[at], steer.top_k_ids(logp_g[at], self.request.top_k), self.request.top_p
            )
            result = RoundResult(accepted, top.astype(np.int32), logp_g[at, top].astype(np.float16))
        else:
            select = "difference" if self.request.select == Select.TOP_DIFFERENCE else "generalist"
            sparse = steer.sparse_steer(
                logp_g[at],
                logp_s0[at],
                self.request.alpha,
                self.request.top_k,
                select,
                self.request.top_p,
            )
            result = RoundResult(accepted, sparse.ids, sparse.values)
        self._keep(offset, accepted, g_rows, s0_rows)
        return result

    def row(self, committed: Sequence[int]) -> RoundResult:
        """ROWS mode: top-k of logp_G for the next position, with logp_S0 at the same ids."""
        g_rows = self.g.extend(committed)
        logp_g = self._logp(g_rows[-1])
        top = steer.nucleus(logp_g, steer.top_k_ids(logp_g, self.request.top_k), self.request.top_p)
        if self.s0 is not None:
            s0_rows = self.s0.extend(committed)
            s0_values = self._logp(s0_rows[-1])[top].astype(np.float16)
        else:
            s0_rows, s0_values = None, np.zeros(len(top), np.float16)
        self._keep(len(committed), 0, g_rows, s0_rows)
        return RoundResult(0, top.astype(np.int32), logp_g[top].astype(np.float16), s0_values)

    def _keep(
        self, offset: int, accepted: int, g_rows: np.ndarray, s0_rows: np.ndarray | None
    ) -> None:
        self.length += offset + accepted
        self.g.keep(self.length, g_rows[offset + accepted])
        if self.s0 is not None and s0_rows is not None:
            self.s0.keep(self.length, s0_rows[offset + accepted])

    def close(self) -> None:
        self.g.session.close()
        if self.s0 is not None:
            self.s0.session.close()
