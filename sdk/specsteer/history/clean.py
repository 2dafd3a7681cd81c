"""The user's own words in a message: quoted text, attributions and signatures taken out.

Owns one pure function, `own_words`, applied on the device when a mail or newsgroup post becomes
an example of the user's writing in a prompt (the stored record stays as it was). Lines quoted
from another message (`> ...`, `gb> ...`, `| ...`), the attribution that introduces them
("In article <id> someone writes:", "On Mon, X wrote:"), a signature after a "-- " (or "--", "---")
separator, and a trailing block of contact lines are not the user's words: a model shown them as
the user's text copies their shape (invented quotes, addresses) instead of the user's voice.
Must not load models or touch the store.
"""

from __future__ import annotations

import re

# "> text", ">> text", "gb> text" (initials of the quoted writer), "|> text", "| text",
# "# |## text", ": text" (newsreaders quote with a bar, a hash or a colon too).
_QUOTED = re.compile(r"^\s*(?:[A-Za-z]{1,4}>|>|\|[>#:]|\|(?=\s|$)|#\s*[|>#]|#(?=\s)|:(?=\s))")
# Attributions: the line that introduces a quote. Folded headers put the message id on one line
# and "X writes:" on the next, so "In article <...>" alone is an attribution too.
_ATTRIBUTION = re.compile(
    r"^\s*(?:in\s+article\s+<[^>]*>.*|in\s+<[^>]*>.*|.*\b(?:writes|wrote|says|said)\s*:\s*"
    r"|.*\bwrites\s+in\s+.*:\s*|on\s+.*\d.*\bwrote\b.*|>?\s*from\s*:.*@.*)$",
    re.IGNORECASE,
)
_SIGNATURE = re.compile(r"^-{2,3}\s*$")  # "-- " is the standard; "--" and "---" are common
# Lines that are contact details, not prose: an address, a phone number, a path of hosts.
_CONTACT = re.compile(
    r"(@[\w.-]+\.\w+|\b(?:phone|fax|tel|voice|email|e-mail)\b\s*:|^\s*[-=_*~#/\\|+]{4,}\s*$"
    r"|\(\d{3}\)\s*\d{3}-\d{4}|\b[a-z0-9]+![a-z0-9!]+)",
    re.IGNORECASE,
)
_BLANKS = re.compile(r"\n{3,}")
# A trailing block counts as a signature when it is this short and mostly contact lines.
_SIGNATURE_BLOCK_LINES = 6


def _without_trailing_signature(lines: list[str]) -> list[str]:
    """Drop a last paragraph of at most a few lines when most of it is contact details."""
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    start = end
    while start and lines[start - 1].strip():
        start -= 1
    block = lines[start:end]
    if start and 0 < len(block) <= _SIGNATURE_BLOCK_LINES:
        contact = sum(1 for line in block if _CONTACT.search(line))
        if contact * 2 >= len(block):
            return lines[:start]
    return lines[:end]


def own_words(text: str) -> str:
    """`text` without quoted lines, attributions, a "-- " signature or a contact-line block.

    Returns "" when nothing of the writer's own is left (a post that only quotes). Paragraph
    breaks are kept; runs of blank lines left by the removals become one blank line.
    """
    kept: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if _SIGNATURE.match(line):
            break
        if _QUOTED.match(line) or _ATTRIBUTION.match(line):
            continue
        kept.append(line.rstrip())
    kept = _without_trailing_signature(kept)
    return _BLANKS.sub("\n\n", "\n".join(kept)).strip()
