"""Device token store: secrets never hit the disk, and only live, well-formed tokens verify."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from specsteer.errors import CompanionConfigError, SpecSteerError, TokenStoreError
from specsteer_companion.auth import LAST_USED_RESOLUTION_S, AllowAll, TokenInfo, TokenStore


class StepClock:
    """A UTC clock that advances one second per call, so timestamps are distinct and known."""

    def __init__(self) -> None:
        self.moment = datetime(2025, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.moment += timedelta(seconds=1)
        return self.moment


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    return TokenStore(tmp_path / "state" / "tokens.db", now=StepClock())


def _store_bytes(store: TokenStore) -> bytes:
    files = [store.path, *(Path(f"{store.path}{s}") for s in ("-wal", "-shm", "-journal"))]
    return b"".join(f.read_bytes() for f in files if f.exists())


def test_created_secret_verifies_and_has_the_documented_shape(store: TokenStore) -> None:
    issued = store.create("alice-phone")
    prefix, token_id, random_part = issued.secret.split("_", 2)
    assert (prefix, token_id) == ("sst", issued.token_id)
    assert len(random_part) == 43  # 32 random bytes, urlsafe base64 without padding
    info = store.verify(issued.secret)
    assert info is not None
    assert (info.token_id, info.device_name) == (issued.token_id, "alice-phone")
    assert issued.secret not in repr(issued)


def test_store_file_never_holds_the_secret(store: TokenStore) -> None:
    issued = [store.create(f"device-{i}") for i in range(3)]
    for token in issued:
        assert store.verify(token.secret) is not None
    # Read while a connection is open too, so a WAL file (if any) is scanned as well.
    with sqlite3.connect(store.path) as held:
        held.execute("SELECT count(*) FROM tokens").fetchone()
        raw = _store_bytes(store)
    assert raw  # the scan looked at something
    for token in issued:
        random_part = token.secret.split("_", 2)[2]
        assert token.secret.encode() not in raw
        assert random_part.encode() not in raw
        # The hash is what is kept: proof the scan reads the very bytes where secrets would be.
        assert hashlib.sha256(token.secret.encode()).hexdigest().encode() in raw


def test_store_file_and_wal_are_private_and_in_wal_mode(store: TokenStore) -> None:
    store.create("alice-phone")
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.execute("INSERT INTO tokens VALUES ('x', 'y', 'z', 't', NULL, NULL)")
        wal = Path(f"{store.path}-wal")
        assert wal.exists()
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600
        db.rollback()


def test_existing_world_readable_file_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "tokens.db"
    path.touch(mode=0o644)
    path.chmod(0o644)
    TokenStore(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("bad", [
    "",
    "sst_",
    "not-a-token",
    "sst_0123456789abcdef",
    "sst_0123456789abcdef_" + "A" * 42,          # one character short
    "sst_0123456789ABCDEF_" + "A" * 43,          # id must be lower-case hex
    "xyz_0123456789abcdef_" + "A" * 43,          # wrong prefix
    "sst_0123456789abcdef_" + "A" * 42 + "=",    # not urlsafe base64
    "sst_0123456789abcdef_" + "A" * 4000,        # oversized
])
def test_malformed_tokens_are_refused(store: TokenStore, bad: str) -> None:
    store.create("alice-phone")
    assert store.verify(bad) is None


def test_unknown_and_tampered_tokens_are_refused(store: TokenStore) -> None:
    issued = store.create("alice-phone")
    prefix, token_id, random_part = issued.secret.split("_", 2)
    flipped = ("B" if random_part[0] != "B" else "C") + random_part[1:]
    assert store.verify(f"{prefix}_{token_id}_{flipped}") is None
    other_id = "0" * 16 if token_id != "0" * 16 else "1" * 16
    assert store.verify(f"{prefix}_{other_id}_{random_part}") is None
    assert store.verify(issued.secret) is not None  # the real one still works


def test_revoke_by_id_refuses_only_that_token(store: TokenStore) -> None:
    old = store.create("alice-phone")
    new = store.create("alice-phone")
    assert store.revoke(old.token_id) is True
    assert store.verify(old.secret) is None
    assert store.verify(new.secret) is not None
    assert store.revoke(old.token_id) is False  # already revoked: nothing live matched


def test_revoke_by_name_refuses_every_token_of_that_device(store: TokenStore) -> None:
    a1, a2 = store.create("alice-phone"), store.create("alice-phone")
    bob = store.create("bob-laptop")
    assert store.revoke("alice-phone") is True
    assert store.verify(a1.secret) is None and store.verify(a2.secret) is None
    assert store.verify(bob.secret) is not None
    assert store.revoke("alice-phone") is False
    assert store.revoke("nobody") is False


def test_revocation_is_seen_by_another_store_object_on_the_same_file(tmp_path: Path) -> None:
    server, admin = TokenStore(tmp_path / "t.db"), TokenStore(tmp_path / "t.db")
    issued = admin.create("alice-phone")
    assert server.verify(issued.secret) is not None
    admin.revoke(issued.token_id)
    assert server.verify(issued.secret) is None


def test_list_reports_state_and_never_secrets(store: TokenStore) -> None:
    alice = store.create("alice-phone")
    bob = store.create("bob-laptop")
    store.verify(alice.secret)
    store.revoke(bob.token_id)
    infos = store.list()
    assert [i.token_id for i in infos] == [alice.token_id, bob.token_id]
    by_id = {i.token_id: i for i in infos}
    assert by_id[alice.token_id].last_used_at is not None
    assert not by_id[alice.token_id].revoked
    assert by_id[bob.token_id].revoked and by_id[bob.token_id].last_used_at is None
    assert by_id[alice.token_id].created_at < by_id[bob.token_id].created_at
    hashes = {hashlib.sha256(t.secret.encode()).hexdigest() for t in (alice, bob)}
    for info in infos:
        text = repr(info) + repr(info.to_dict())
        assert not any(t.secret in text for t in (alice, bob))
        assert not any(h in text for h in hashes)
        assert set(info.to_dict()) == {"token_id", "device_name", "created_at", "revoked_at",
                                       "last_used_at"}


class SetClock:
    """A UTC clock that stands still until a test moves it."""

    def __init__(self) -> None:
        self.moment = datetime(2025, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.moment


def test_verify_updates_last_used_at_at_most_once_a_minute(tmp_path: Path) -> None:
    clock = SetClock()
    store = TokenStore(tmp_path / "tokens.db", now=clock)
    issued = store.create("alice-phone")
    first = store.verify(issued.secret)
    assert first is not None and first.last_used_at == clock.moment
    clock.moment += timedelta(seconds=LAST_USED_RESOLUTION_S - 1)
    # a recent token is only read: it verifies even while another writer holds the file
    with sqlite3.connect(store.path, isolation_level=None) as writer:
        writer.execute("BEGIN IMMEDIATE")
        again = store.verify(issued.secret)
        writer.execute("ROLLBACK")
    assert again is not None and again.last_used_at == first.last_used_at
    assert store.list()[0].last_used_at == first.last_used_at
    clock.moment += timedelta(seconds=2)
    later = store.verify(issued.secret)
    assert later is not None and later.last_used_at == clock.moment
    assert store.list()[0].last_used_at == clock.moment


def test_revoked_among_names_revoked_and_unknown_ids(store: TokenStore) -> None:
    alice, bob = store.create("alice-phone"), store.create("bob-phone")
    assert store.revoked_among([alice.token_id, bob.token_id]) == set()
    store.revoke(bob.token_id)
    unknown = "0" * 16
    assert store.revoked_among([alice.token_id, bob.token_id, unknown]) == {bob.token_id, unknown}
    assert store.revoked_among([]) == set()


@pytest.mark.parametrize("name", ["", " alice", "a b", "-dash-first", "x" * 65, "0123456789abcdef"])
def test_bad_device_names_are_refused(store: TokenStore, name: str) -> None:
    with pytest.raises(CompanionConfigError):
        store.create(name)
    assert store.list() == []


def test_garbage_file_is_a_clear_store_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens.db"
    path.write_bytes(b"this is not sqlite at all, " * 100)
    with pytest.raises(TokenStoreError, match="unreadable or damaged"):
        TokenStore(path)


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (x)")
    with pytest.raises(TokenStoreError, match="not a token store"):
        TokenStore(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.db"
    TokenStore(path)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(TokenStoreError, match="newer"):
        TokenStore(path)


def test_store_errors_are_specsteer_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpecSteerError):
        TokenStore(blocker / "tokens.db")  # parent is a file: cannot create


def test_concurrent_creates_and_verifies_from_threads(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens.db")
    results: list[bool] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            issued = store.create(f"device-{i}")
            results.append(store.verify(issued.secret) is not None)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert results == [True] * 8
    assert len(store.list()) == 8


def test_allow_all_accepts_anything_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="specsteer_companion.auth"):
        open_auth = AllowAll()
    assert "OPEN" in caplog.text
    for secret in ("", "anything", "sst_0123456789abcdef_" + "A" * 43):
        info = open_auth.verify(secret)
        assert isinstance(info, TokenInfo)
        assert info.token_id == AllowAll.TOKEN_ID and not info.revoked
