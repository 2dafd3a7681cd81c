"""The leak guard: finds verbatim private history in what is about to leave the device.

A draft is the Specialist's continuation of the *private* prompt, so it can copy the user's
history word for word; every drafted id goes to the companion. Before a draft leaves, the
guard scans the ids the companion would hold (the text so far plus the draft) for these
disclosures and names the first token to withhold:

* **private n-grams**: a window of `n` consecutive token ids that occurs in the private prompt
  (history records) and not in the public prompt; the token completing the window is flagged,
  so at most `n - 1` consecutive tokens of a private span can go up.
* **patterns**: an e-mail address (its local part and "@" suffice), a phone number, an
  IBAN- or card-like digit run, or a URL whose host is private (localhost, private IP ranges,
  .local/.lan/.internal/.corp/.home/.intranet), drafted and not in the public prompt's text;
  the first draft token overlapping the match is flagged.
* **private words however tokenized**: `n` words in a row (letters and digits, lower-cased,
  punctuation and spacing aside) that the private prompt has and the public one lacks: the
  same copy written with other ids, which `redact` pushes the Specialist to ("  My town" for
  " My town", a comma dropped); the token that completes the run is flagged.
* **private details in any spelling**: the local parts and domain names of the e-mail
  addresses in the private prompt, wherever they appear (with or without "@", glued to other
  text), and any 7 consecutive digits of its phone, card or IBAN numbers however they are
  spaced: the Specialist, turned away from a copy, writes " @domain" or "+442079 4 6..."
  next, which the patterns alone let through.

The policy (`Params.leak_guard`, applied in `device.rounds` and `device.loop`): "allow" counts
flagged spans and sends them; "redact" cuts the draft at the flagged token's word (its first
token not yet sent: `word_start`) and, in the fused pick at that position, bans the token it
cut off, every candidate that would complete a flagged span, and their respellings, pieces and
extensions (`redact_mask`); "hold" stops collaborating at the flagged
token and finishes the generation on the device alone, so neither the span nor anything after
it is sent. docs/companion-security.md ("Drafts and the leak guard") has the
threat model.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from specsteer.settings import LEAK_GUARDS
from specsteer.tokenizer import Tokenizer

PATTERN_CONTEXT_TOKENS = 48  # ids before the draft re-decoded to find patterns across rounds

_PRIVATE_SUFFIXES = (".local", ".lan", ".internal", ".corp", ".home", ".intranet", ".localdomain")
PATTERNS: dict[str, re.Pattern[str]] = {
    # the local part and "@" already identify a mailbox: flag before the domain is drafted
    "email": re.compile(r"[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)?"),
    "phone": re.compile(r"(?<![\w-])\+?\(?\d{2,4}\)?(?:[ .-]?\d{2,4}){2,5}(?![\w-])"),
    "iban": re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b"),
    "card": re.compile(r"(?<!\d)\d(?:[ -]?\d){11,18}(?!\d)"),
    "url": re.compile(r"\b(?:https?|ftp)://([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])"),
}
_DATE = re.compile(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{4}")
# Digits as a number is written, respaced or split: at most three of " +-.()/" between two digits.
_DIGIT_RUN = re.compile(r"\d(?:[ +\-.()/]{0,3}\d)*")
NUMBER_WINDOW = 7  # consecutive digits of a private number flagged in any spelling (a phone's)
DETAIL_MIN_CHARS = 5  # shorter local parts and domain names match too much ordinary text
# Domain names that say nothing about the user: never flagged on their own.
COMMON_MAIL_DOMAINS = frozenset({
    "gmail", "googlemail", "yahoo", "hotmail", "outlook", "icloud", "proton", "protonmail",
    "example", "email", "live", "mail",
})


class LeakHeld(Exception):
    """Raised by a round under the "hold" policy: stop collaborating, finish on the device."""

    def __init__(self, flag: Flag) -> None:
        super().__init__(f"leak guard held a {flag.kind} span")
        self.flag = flag


def ngrams(ids: Sequence[int], n: int) -> set[tuple[int, ...]]:
    """Every window of `n` consecutive ids."""
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


def private_ngrams(
    private_ids: Sequence[int], public_ids: Sequence[int], n: int
) -> frozenset[tuple[int, ...]]:
    """Windows of the private prompt that the public prompt does not contain."""
    return frozenset(ngrams(private_ids, n) - ngrams(public_ids, n))


_WORD = re.compile(r"[^\W_]+")  # letters and digits: case, spacing and punctuation aside


def words(text: str) -> list[str]:
    """The words of `text`, lower-cased, without the punctuation and spacing between them."""
    return _WORD.findall(text.lower())


def private_word_windows(private_text: str, public_text: str, n: int) -> frozenset[tuple[str, ...]]:
    """Runs of `n` words of the private text that the public text does not contain: the
    same copy as `private_ngrams` however it is tokenized, cased, spaced or punctuated."""
    return frozenset(ngrams(words(private_text), n) - ngrams(words(public_text), n))


def _letters(text: str) -> str:
    """A token's letters and digits, lower-cased: what is left of it in any respelling."""
    return "".join(words(text))


def _respells(letters: str, away: set[str]) -> bool:
    """Whether a candidate's letters are one turned away's, a prefix of them, or them extended."""
    return bool(letters) and any(a.startswith(letters) or letters.startswith(a) for a in away)


def private_host(host: str) -> bool:
    """Whether a URL host names a machine of a private network."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or host.endswith(_PRIVATE_SUFFIXES)
    return address.is_private or address.is_loopback or address.is_link_local


def pattern_matches(text: str, public_text: str = "") -> list[tuple[int, int, str]]:
    """(start, end, kind) of every pattern match in `text` that is not in `public_text`;
    URLs only when their host is private."""
    found = []
    for kind, pattern in PATTERNS.items():
        for match in pattern.finditer(text):
            if kind == "url" and not private_host(match.group(1)):
                continue
            if kind == "phone" and (sum(c.isdigit() for c in match.group()) < 7
                                    or _DATE.fullmatch(match.group())):
                continue
            if match.group() in public_text:
                continue
            found.append((match.start(), match.end(), kind))
    return sorted(found)


def private_details(private_text: str, public_text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(words, digit windows): the private text's personal data as the guard looks for it in
    any spelling. Words: its e-mail addresses' local parts and domain names (lower case, at
    least `DETAIL_MIN_CHARS`, common providers and top-level domains left out); digit windows:
    every `NUMBER_WINDOW` consecutive digits of its phone, card and IBAN numbers. Matches that
    are in the public text are left out, as are words the public text contains."""
    words: set[str] = set()
    digits: set[str] = set()
    public_lower = public_text.lower()
    for start, end, kind in pattern_matches(private_text, public_text):
        found = private_text[start:end]
        if kind == "email":
            local, _, domain = found.lower().partition("@")
            labels = domain.split(".")[:-1] if "." in domain else [domain]
            words |= {w for w in [local, *labels]
                      if len(w) >= DETAIL_MIN_CHARS and w not in COMMON_MAIL_DOMAINS}
        elif kind in ("phone", "card", "iban"):
            number = re.sub(r"\D", "", found)
            digits |= {number[i : i + NUMBER_WINDOW]
                       for i in range(len(number) - NUMBER_WINDOW + 1)}
    return frozenset(w for w in words if w not in public_lower), frozenset(digits)


def detail_matches(text: str, words: frozenset[str],
                   digits: frozenset[str]) -> list[tuple[int, int, str]]:
    """(start, end, kind) of private details in `text`: a word of `words` (not preceded by a
    letter or digit; glued to what follows or not), and `NUMBER_WINDOW` digits of a number
    run (however spaced) that are a window of `digits`."""
    found = []
    lower = text.lower()
    for word in words:
        for match in re.finditer(rf"(?<![a-z0-9]){re.escape(word)}", lower):
            found.append((match.start(), match.end(), "email"))
    if digits:
        for run in _DIGIT_RUN.finditer(text):
            at = [run.start() + i for i, c in enumerate(run.group()) if c.isdigit()]
            number = "".join(text[i] for i in at)
            for i in range(len(number) - NUMBER_WINDOW + 1):
                if number[i : i + NUMBER_WINDOW] in digits:
                    found.append((at[i], at[i + NUMBER_WINDOW - 1] + 1, "number"))
    return sorted(found)


@dataclass(frozen=True)
class Flag:
    """The first token of a scanned run to withhold, and why ("ngram" or a pattern name)."""

    index: int
    kind: str


class LeakGuard:
    """The guard of one generation: the private-only n-grams and the public prompt's text.

    `scan(context, tokens)`: the first of `tokens` that would disclose private history, given
    the output before them (`context`: ids written after the prompt, already sent). Windows
    never reach into the prompt: its chat template is not history (a window made of the
    template's last tokens and the first output token would match the private prompt's
    rendering of earlier records, not anything the user wrote). `blocks(context, token)`: whether
    one candidate would.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        private_ids: Sequence[int],
        public_ids: Sequence[int],
        *,
        policy: str = "allow",
        n: int = 8,
        patterns: bool = True,
    ) -> None:
        if policy not in LEAK_GUARDS or n < 2:
            raise ValueError(f"policy must be one of {', '.join(LEAK_GUARDS)} and n >= 2")
        self.tokenizer, self.policy, self.n = tokenizer, policy, n
        self.private = private_ngrams(private_ids, public_ids, n)
        self.patterns = patterns
        self.public_text = tokenizer.decode(public_ids)
        private_text = tokenizer.decode(private_ids)
        self.private_words = private_word_windows(private_text, self.public_text, n)
        self.words, self.digits = private_details(private_text, self.public_text)

    def scan(self, context: Sequence[int], tokens: Sequence[int]) -> Flag | None:
        """The first token of `tokens` to withhold (None: nothing private in them)."""
        if not tokens:
            return None
        flags = [f for f in (self._ngram(context, tokens), self._respelled(context, tokens),
                             self._pattern(context, tokens)) if f]
        return min(flags, key=lambda f: f.index) if flags else None

    def blocks(self, context: Sequence[int], token: int) -> bool:
        return self.scan(context, [token]) is not None

    def allowed(self, context: Sequence[int], ids: Iterable[int]) -> np.ndarray:
        """Mask over `ids`: True where the candidate discloses nothing."""
        return np.array([not self.blocks(context, int(t)) for t in ids], dtype=bool)

    def redact_mask(self, context: Sequence[int], ids: np.ndarray,
                    withheld: int | None = None) -> np.ndarray:
        """Mask over candidate `ids` for `redact`'s pick: True where a candidate discloses
        nothing, is not `withheld`, and is not a respelling of one turned away. A respelling
        is the same letters and digits with other spacing, case or punctuation (turned away
        from " continuous", the Specialist glued "andcontinuous" on), or a piece of them or
        more of them: turned away from "ing" after " center", it wrote "centerin"; from
        " forth", "-for"; from " a", " an". Each is the copy's word, damaged, so the pick
        must go to another word."""
        allowed = self.allowed(context, ids)
        if withheld is not None:
            allowed &= ids != withheld
        letters = [_letters(self.tokenizer.decode([int(t)])) for t in ids]
        away = {spelt for spelt, ok in zip(letters, allowed, strict=True) if not ok}
        if withheld is not None:
            away.add(_letters(self.tokenizer.decode([withheld])))
        away.discard("")
        if away:
            allowed &= np.array([not _respells(spelt, away) for spelt in letters], dtype=bool)
        return allowed

    def word_start(self, ids: Sequence[int], index: int, floor: int = 0) -> int:
        """The first token (not before `floor`) of the word that `ids[index]` ends or
        continues: `redact` cuts there, so the pick replaces the whole word; cut at the
        flagged token itself, the word's beginning stayed and the Specialist finished it
        another way ("centerin", "center on" for a withheld "centering")."""
        decode = self.tokenizer.decode
        start = index
        while start > floor:
            text, before = decode([int(ids[start])]), decode([int(ids[start - 1])])
            if not text[:1].isalnum() or not before[-1:].isalnum():
                break
            start -= 1
        return start

    def _ngram(self, context: Sequence[int], tokens: Sequence[int]) -> Flag | None:
        if not self.private:
            return None
        run = [*context[max(0, len(context) - (self.n - 1)) :], *tokens]
        lead = len(run) - len(tokens)
        for j in range(len(tokens)):
            end = lead + j + 1
            if end >= self.n and tuple(run[end - self.n : end]) in self.private:
                return Flag(j, "ngram")
        return None

    def _respelled(self, context: Sequence[int], tokens: Sequence[int]) -> Flag | None:
        """The first token that completes `n` private words in a row, whatever the ids: a
        copy re-tokenized, re-cased or re-spaced (what `redact` pushes the Specialist to)."""
        if not self.private_words:
            return None
        before = list(context[max(0, len(context) - PATTERN_CONTEXT_TOKENS) :])
        decode = self.tokenizer.decode
        done = len(decode(before).lower())
        for j in range(len(tokens)):
            text = decode([*before, *tokens[: j + 1]]).lower()
            found = list(_WORD.finditer(text))
            # windows ending in a word this token wrote or extended
            for w in range(self.n - 1, len(found)):
                if found[w].end() > done and tuple(
                        m.group() for m in found[w - self.n + 1 : w + 1]) in self.private_words:
                    return Flag(j, "words")
            done = len(text)
        return None

    def _pattern(self, context: Sequence[int], tokens: Sequence[int]) -> Flag | None:
        if not self.patterns:
            return None
        before = list(context[max(0, len(context) - PATTERN_CONTEXT_TOKENS) :])
        decode = self.tokenizer.decode
        head = len(decode(before))
        text = decode([*before, *tokens])
        matches = [m for m in [*pattern_matches(text, self.public_text),
                               *detail_matches(text, self.words, self.digits)] if m[1] > head]
        if not matches:
            return None
        start = min(m[0] for m in matches)
        kind = min(matches)[2]
        for j in range(len(tokens)):  # the first drafted token whose text reaches the match
            if len(decode([*before, *tokens[: j + 1]])) > start:
                return Flag(j, kind)
        return Flag(len(tokens) - 1, kind)


def best_allowed(
    guard: LeakGuard, context: Sequence[int], row: np.ndarray, withheld: int | None = None
) -> int:
    """The Specialist's best token that discloses nothing and is not `withheld` (when every
    candidate would disclose)."""
    for token in np.argsort(-row, kind="stable")[:256]:
        if int(token) != withheld and not guard.blocks(context, int(token)):
            return int(token)
    return int(np.argmax(row))
