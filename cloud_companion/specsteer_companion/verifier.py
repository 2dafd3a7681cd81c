"""Per-session verification on the companion: the Generalist and the generic Specialist.

The companion holds, per device session, one `Track` of the Generalist (P_G) and, unless the
device computes P_S0 itself, one of the context-free Specialist (P_S0, the very same compiled
artifact the device runs). A round appends the newly committed ids and the draft to both in
one pass each, decides acceptance and builds the candidates with `specsteer.steer` (the only
home of the method's rules), and rewinds both caches to the accepted prefix. It never sees,
and has no way to receive, the private context. Mismatched tokenizers go to `cross`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specsteer import steer
from specsteer.protocol import Mode, OpenSession
from specsteer.runtime.base import LanguageModel
from specsteer.runtime.track import Track
from specsteer_companion.cross import CrossVerifierSession


@dataclass
class Verifier:
    """The companion's models. `specialist` may be None when devices send P_S0 themselves."""

    generalist: LanguageModel
    specialist: LanguageModel | None = None
    max_session_tokens: int = 4096

    def open(
        self, request: OpenSession, committed: Sequence[int] = ()
    ) -> VerifierSession | CrossVerifierSession:
        """A session on the token path, or on the text path when the tokenizers differ.

        `committed`: tokens the device generated before this session (a `Resume`): the
        session holds prompt and committed tokens as if it had verified them itself.
        """
        s = self.specialist
        if s is not None and s.tokenizer.vocab_hash != self.generalist.tokenizer.vocab_hash:
            return CrossVerifierSession(self, request, committed=committed)
        return VerifierSession(self, request, committed)


class VerifierSession:
    """One device's generation on the companion (the two models share a tokenizer)."""

    def __init__(
        self, verifier: Verifier, request: OpenSession, committed: Sequence[int] = ()
    ) -> None:
        self.request = request
        self.settings = settings = request.settings
        self.mode = Mode(settings.mode)
        prompt = [*request.prompt_ids, *committed]  # one prefill pass for both
        self.temperature = settings.temperature if settings.temperature > 0 else 1.0
        limit = verifier.max_session_tokens
        if settings.companion_s0 and verifier.specialist is None:
            raise ValueError(
                "this companion hosts no generic Specialist; send logp_S0 from the device"
            )
        self.g = Track(verifier.generalist, prompt, limit)
        self.s0 = Track(verifier.specialist, prompt, limit) \
            if settings.companion_s0 and verifier.specialist is not None else None
        self.length = len(prompt)
        self.rng = np.random.default_rng(settings.seed) if settings.temperature > 0 else None

    def _logp(self, rows: np.ndarray) -> np.ndarray:
        return steer.log_softmax(rows, self.temperature)

    def verify(
        self,
        committed: Sequence[int],
        draft: Sequence[int],
        logp_s0_draft: Sequence[float] | None = None,
    ) -> steer.RoundVerdict:
        """One Draft–Verify–Recover round (or a classic speculative round in SPECULATIVE mode)."""
        seq = [*committed, *draft]
        offset = len(committed)
        g_rows = self.g.extend(seq)
        if self.mode is Mode.SPECULATIVE:
            accepted, token = steer.classic_accept_greedy(draft, g_rows[offset:])
            self._keep(offset + accepted, g_rows, None)
            return steer.RoundVerdict(accepted, steer.SparseSteer([token], [0.0]))
        logp_g = self._logp(g_rows)
        at_draft = offset + np.arange(len(draft))
        lg_draft = logp_g[at_draft, list(draft)] if draft else np.zeros(0, np.float32)
        s0_rows = logp_s0 = None
        if self.s0 is not None:
            s0_rows = self.s0.extend(seq)
            logp_s0 = self._logp(s0_rows)
            ls0_draft = logp_s0[at_draft, list(draft)] if draft else lg_draft
        else:
            ls0_draft = np.asarray(logp_s0_draft, np.float32)
        accepted = steer.ratio_accept_count(lg_draft, ls0_draft, self.settings.gamma, self.rng)
        at = offset + accepted
        candidates = steer.sparse_steer(
            logp_g[at],
            None if logp_s0 is None else logp_s0[at],
            self.settings.alpha,
            self.settings.top_k,
            self.settings.select,
            self.settings.top_p,
        )
        self._keep(at, g_rows, s0_rows)
        return steer.RoundVerdict(accepted, candidates)

    def row(self, committed: Sequence[int]) -> steer.RoundVerdict:
        """ROWS mode: top-k of logp_G for the next position, with logp_S0 at the same ids."""
        g_rows = self.g.extend(committed)
        logp_g = self._logp(g_rows[-1])
        candidates = steer.sparse_steer(
            logp_g, None, 0.0, self.settings.top_k, top_p=self.settings.top_p
        )
        if self.s0 is not None:
            s0_rows = self.s0.extend(committed)
            s0_values = self._logp(s0_rows[-1])[candidates.ids].astype(np.float16)
        else:
            s0_rows, s0_values = None, np.zeros(len(candidates.ids), np.float16)
        self._keep(len(committed), g_rows, s0_rows)
        return steer.RoundVerdict(0, candidates, s0_values)

    def _keep(self, advance: int, g_rows: np.ndarray, s0_rows: np.ndarray | None) -> None:
        """Hold the tokens before and the `advance` new ones; everything after is dropped."""
        self.length += advance
        self.g.keep(self.length, g_rows[advance])
        if self.s0 is not None and s0_rows is not None:
            self.s0.keep(self.length, s0_rows[advance])

    def close(self) -> None:
        self.g.close()
        if self.s0 is not None:
            self.s0.close()
