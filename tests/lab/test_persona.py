"""The persona in sample_apps/data: 30-60 items in one voice, and the demo's store built from it
with no shared data set anywhere."""

from __future__ import annotations

import json
import mailbox
from pathlib import Path

import pytest

from specsteer.errors import SpecSteerError
from specsteer_lab import demo

SIGN_OFF = "Dirt under the nails,\nWren"


def _sent() -> list[str]:
    box = mailbox.mbox(str(demo.PERSONA_DIR / "sent.mbox"))
    return [message.get_payload(decode=True).decode("utf-8") for message in box]


def test_persona_has_thirty_to_sixty_items_in_one_voice() -> None:
    notes = json.loads((demo.PERSONA_DIR / "notes.json").read_text(encoding="utf-8"))
    sent = _sent()
    assert 30 <= len(notes) + len(sent) <= 60
    # the voice's habits: a practical list and a "small win" in notes, the same sign-off in mail
    assert all("Practical bits:" in n["body"] or "What worked:" in n["body"] for n in notes)
    assert all("Small win:" in n["body"] for n in notes)
    assert all(body.rstrip().endswith(SIGN_OFF) for body in sent)


def test_persona_store_needs_no_shared_data(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECSTEER_DATA_DIR", str(tmp_path / "nowhere"))
    store = demo.persona_store()
    assert store.stats()["kinds"] == {"note": 25, "email": 16}
    assert demo.persona_store().stats()["kinds"] == {"note": 25, "email": 16}  # idempotent
    hits = store.search("seed swap envelopes", k=2, kinds=["email"])
    assert hits and "envelopes" in hits[0].record.body


def test_missing_persona_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecSteerError, match="persona data is missing.*--data"):
        demo.persona_store(tmp_path)


def test_the_demo_prompt_shows_the_persona_its_own_sign_off(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    # The sign-off is the user's own words: cleaning (history.clean) must keep it in the examples
    # the Specialist sees, or the model can only invent one ("[Your Name]").
    from specsteer.history import prompts

    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))
    store = demo.persona_store()
    hits = prompts.retrieve(store, "email", demo.PERSONA_QUERY, 5)
    prompt = prompts.build_prompt("email", demo.PERSONA_QUERY, hits, max_prompt_tokens=640)
    whole = [answer for (_, answer), record in zip(prompt.examples, reversed(prompt.records),
                                                      strict=True)
             if record not in prompt.truncated]
    assert whole and all(answer.rstrip().endswith(SIGN_OFF) for answer in whole)
    assert "Wren" not in prompt.request  # the public request never names the sender


@pytest.mark.real_model
def test_the_demo_letter_ends_at_its_sign_off(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    # The demo's own call (real pair, the Specialist on the device's runtime, default preset,
    # 96 tokens, 640-token private budget, no warm start): the user's minimum length
    # used to pad the finished letter by repeating its sign-off ("Wren and the garden team.
    # \n\nDairy barn, Wren and the garden team."); an end the Specialist is sure of now stands
    # (Params.end_release)
    from helpers.real_models import real_model

    from specsteer.client import Client
    from specsteer.runtime import load_device_model
    from specsteer_companion.local import LocalChannel
    from specsteer_companion.verifier import Verifier

    specialist, generalist = real_model("qwen2.5-0.5b"), real_model("qwen2.5-1.5b")
    monkeypatch.setenv("SPECSTEER_HOME", str(tmp_path / "home"))  # the persona's store
    verifier = Verifier(generalist, specialist)
    client = Client(load_device_model(specialist.folder), history=demo.persona_store(),
                    max_prompt_tokens=640, companion=lambda: LocalChannel.for_verifier(verifier))
    result = client.generate(demo.PERSONA_QUERY, task="email", max_new_tokens=96,
                             warm_start=False)
    lines = [line.strip() for line in result.text.splitlines() if line.strip()]
    assert "Wren" in lines[-1]  # signed, as the persona signs
    assert len(lines) == len(set(lines))  # and nothing written twice after it
    assert result.stats.tokens < result.prompt.length.min_new_tokens  # it ended by itself
