"""Per-device bearer tokens for the companion: issue, verify, revoke, list.

Owns the token store, one small SQLite file (WAL, mode 0600) holding for each token its id, the
device name, timestamps and the SHA-256 of the secret. The secret itself is returned once by
`TokenStore.create` and never written anywhere, so a leaked store file grants no access. Must not
log, print or return a secret or its hash after creation (the CLI prints the one from `create`),
and must not decide session quotas or rate limits (that is `limits`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import sqlite3
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from specsteer.errors import CompanionConfigError, TokenStoreError

log = logging.getLogger("specsteer_companion.auth")

SCHEMA_VERSION = 1
TOKEN_PREFIX = "sst"
# 8 random bytes of id: unique enough for one companion's devices, short enough to type.
_ID_HEX_CHARS = 16
# 32 random bytes: 256 bits, beyond any guessing, which is what lets a plain hash stand in for a
# password KDF (slow KDFs protect low-entropy passwords; nothing here is low-entropy).
_SECRET_BYTES = 32
_TOKEN_RE = re.compile(rf"{TOKEN_PREFIX}_([0-9a-f]{{{_ID_HEX_CHARS}}})_([A-Za-z0-9_-]{{43}})")
_ID_RE = re.compile(rf"[0-9a-f]{{{_ID_HEX_CHARS}}}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_MAX_TOKEN_CHARS = 128
# Compared against when the id is unknown, so unknown and wrong secrets cost the same time.
_DUMMY_DIGEST = hashlib.sha256(b"specsteer-no-such-token").digest()
# A busy store (several server workers plus the CLI) waits this long before giving up.
_BUSY_TIMEOUT_S = 5.0
# `last_used_at` is rewritten at most this often per token, so logins do not write the file each
# time (a write takes the store's lock and syncs the disk; a read does neither).
LAST_USED_RESOLUTION_S = 60.0

# Run one by one inside the creating transaction (executescript would commit it early).
_SCHEMA = (
    """CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        device_name TEXT NOT NULL,
        secret_sha256 TEXT NOT NULL,
        created_at TEXT NOT NULL,
        revoked_at TEXT,
        last_used_at TEXT
    )""",
    "CREATE INDEX tokens_device_name ON tokens(device_name)",
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("ascii")).digest()


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


@dataclass(frozen=True)
class IssuedToken:
    """A freshly created token. `secret` exists only here: store it on the device now."""

    token_id: str
    secret: str = field(repr=False)  # kept out of repr so logging the object leaks nothing
    device_name: str = ""


@dataclass(frozen=True)
class TokenInfo:
    """What the store knows about a token; never the secret or its hash."""

    token_id: str
    device_name: str
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (ISO 8601 UTC times, None where unset)."""
        return {
            "token_id": self.token_id,
            "device_name": self.device_name,
            "created_at": _iso(self.created_at),
            "revoked_at": None if self.revoked_at is None else _iso(self.revoked_at),
            "last_used_at": None if self.last_used_at is None else _iso(self.last_used_at),
        }


class TokenVerifier(Protocol):
    """What a server needs from an authenticator: a secret in, a known device or None out."""

    def verify(self, secret: str) -> TokenInfo | None: ...


def check_device_name(name: str) -> str:
    """Return `name` if usable as a device name, else raise `CompanionConfigError`.

    Names that look like token ids are refused so `revoke(x)` is never ambiguous.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise CompanionConfigError(
            f"invalid device name {name!r}: use 1-64 letters, digits, '.', '_', '-' or '@', "
            "starting with a letter or digit"
        )
    if _ID_RE.fullmatch(name):
        raise CompanionConfigError(
            f"device name {name!r} looks like a token id; pick a name with other characters"
        )
    return name


class TokenStore:
    """The companion's device tokens in one SQLite file; safe to share between threads/processes.

    Each call opens its own short-lived connection, so one store object can be used from any
    thread and several companion processes can share the file (WAL lets readers run beside a
    writer).
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 now: Callable[[], datetime] = _utcnow) -> None:
        self.path = Path(path).expanduser()
        self._now = now
        self._create_file()
        self._init_schema()

    def create(self, device_name: str) -> IssuedToken:
        """Issue a new token for `device_name`; the returned secret is not recoverable later.

        A device may hold several live tokens (rotate by creating the new one, then revoking
        the old one by id).
        """
        check_device_name(device_name)
        token_id = secrets.token_hex(_ID_HEX_CHARS // 2)
        secret = f"{TOKEN_PREFIX}_{token_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
        with self._transaction() as db:
            db.execute(
                "INSERT INTO tokens (id, device_name, secret_sha256, created_at) "
                "VALUES (?, ?, ?, ?)",
                (token_id, device_name, _digest(secret).hex(), _iso(self._now())),
            )
        return IssuedToken(token_id=token_id, secret=secret, device_name=device_name)

    def verify(self, secret: str) -> TokenInfo | None:
        """The token's info if `secret` is a live token, else None.

        Marks the token used when its `last_used_at` is older than `LAST_USED_RESOLUTION_S`
        (so most logins only read the file). Unknown, malformed and revoked tokens all give
        None, so a caller cannot tell which.
        """
        if not isinstance(secret, str) or len(secret) > _MAX_TOKEN_CHARS:
            return None
        match = _TOKEN_RE.fullmatch(secret)
        if match is None:
            return None
        token_id = match[1]
        with self._connect() as db:
            row = db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
        stored = bytes.fromhex(row["secret_sha256"]) if row is not None else _DUMMY_DIGEST
        if not hmac.compare_digest(stored, _digest(secret)) or row is None:
            return None
        if row["revoked_at"] is not None:
            return None
        now = self._now()
        last = _parse_time(row["last_used_at"])
        if last is not None and 0 <= (now - last).total_seconds() < LAST_USED_RESOLUTION_S:
            return _info(row)
        used = _iso(now)
        with self._transaction() as db:
            # `revoked_at IS NULL` here too: a revoke that raced the read above still wins.
            updated = db.execute(
                "UPDATE tokens SET last_used_at = ? WHERE id = ? AND revoked_at IS NULL",
                (used, token_id),
            ).rowcount
        if updated != 1:
            return None
        return _info(row, last_used_at=used)

    def revoke(self, token_id_or_name: str) -> bool:
        """Revoke one token by id, or every live token of a device by name.

        Returns False when nothing live matched (unknown, or already revoked).
        """
        revoked_at = _iso(self._now())
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM tokens WHERE id = ?", (token_id_or_name,)).fetchone():
                column = "id"
            else:
                column = "device_name"
            count = db.execute(
                f"UPDATE tokens SET revoked_at = ? WHERE {column} = ? AND revoked_at IS NULL",
                (revoked_at, token_id_or_name),
            ).rowcount
        return count > 0

    def revoked_among(self, token_ids: Collection[str]) -> set[str]:
        """The ids among `token_ids` that are revoked or unknown (one read, no write): what a
        server asks about its live connections to end those of revoked tokens."""
        wanted = list(token_ids)
        if not wanted:
            return set()
        marks = ",".join("?" * len(wanted))
        with self._connect() as db:
            live = {row[0] for row in db.execute(
                f"SELECT id FROM tokens WHERE revoked_at IS NULL AND id IN ({marks})", wanted)}
        return set(wanted) - live

    def list(self) -> list[TokenInfo]:
        """Every token ever issued, revoked ones included, oldest first."""
        with self._connect() as db:
            rows = db.execute("SELECT * FROM tokens ORDER BY created_at, id").fetchall()
        return [_info(row) for row in rows]

    # -- file handling -------------------------------------------------------------------

    def _create_file(self) -> None:
        """Create the file 0600 before SQLite does, so it is never readable by others.

        SQLite gives the -wal and -shm files the database file's mode, so they follow.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.fchmod(fd, 0o600)  # also tightens a file created earlier with a looser mode
            finally:
                os.close(fd)
        except OSError as exc:
            raise TokenStoreError(
                f"cannot open token store {self.path}: {exc.strerror or exc}; "
                "check the path and its permissions"
            ) from exc

    def _init_schema(self) -> None:
        try:
            with self._connect() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
                if version > SCHEMA_VERSION:
                    raise TokenStoreError(
                        f"token store {self.path} has schema {version}, newer than this "
                        f"companion's {SCHEMA_VERSION}: upgrade specsteer"
                    )
                if version == 0 and tables:
                    raise TokenStoreError(
                        f"{self.path} is a SQLite file but not a token store; choose another path"
                    )
                db.execute("PRAGMA journal_mode=WAL")
                if version == 0:
                    db.execute("BEGIN IMMEDIATE")
                    if db.execute("PRAGMA user_version").fetchone()[0] == 0:  # lost no race
                        for statement in _SCHEMA:
                            db.execute(statement)
                        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    db.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise TokenStoreError(
                f"token store {self.path} is unreadable or damaged ({exc}); "
                "move it aside and issue new tokens"
            ) from exc

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise TokenStoreError(f"cannot open token store {self.path}: {exc}") from exc
        db.row_factory = sqlite3.Row
        try:
            yield db
        except sqlite3.OperationalError as exc:
            raise TokenStoreError(f"token store {self.path}: {exc}") from exc
        finally:
            db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front (no upgrade
        deadlock between two writers)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def _info(row: sqlite3.Row, *, last_used_at: str | None = None) -> TokenInfo:
    return TokenInfo(
        token_id=row["id"],
        device_name=row["device_name"],
        created_at=datetime.fromisoformat(row["created_at"]),
        revoked_at=_parse_time(row["revoked_at"]),
        last_used_at=_parse_time(last_used_at or row["last_used_at"]),
    )


class AllowAll:
    """Accepts any token, for local development only: choosing it is the explicit opt-in.

    Every caller gets the same identity, so per-token session limits apply to all of them
    together. Logs a warning when created so an open companion never goes unnoticed.
    """

    TOKEN_ID = "open"

    def __init__(self, device_name: str = "open-dev", *,
                 now: Callable[[], datetime] = _utcnow) -> None:
        self.device_name = check_device_name(device_name)
        self._now = now
        self._created = now()
        log.warning("companion authentication is OPEN: every client is accepted; "
                    "use this only for local development on a loopback address")

    def verify(self, secret: str) -> TokenInfo:
        """Accept `secret` whatever it is."""
        return TokenInfo(token_id=self.TOKEN_ID, device_name=self.device_name,
                         created_at=self._created, last_used_at=self._now())
