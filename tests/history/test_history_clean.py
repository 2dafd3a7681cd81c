"""The user's own words of a mail or post: quotes, attributions and signatures taken out."""

from __future__ import annotations

from specsteer.history.clean import own_words

POST = """In article <1993Apr20.164517.20876@kpc.com> henrik@quayle.kpc.com writes:

>At last, I hope that the U.S. insists that Turkey stay out of the
>crisis so that the repeat WILL NEVER OCCUR again.

Do you have a terminal cold? Here we are, almost at the end of the
century, and nobody asks.

|> quoted with a bar
# |## quoted with a hash
gb> quoted with the writer's initials

Where are all the decent people?

--
Serdar Argic                      serdar@zuma.uucp
"""


def test_quotes_attribution_and_signature_go_paragraphs_stay() -> None:
    assert own_words(POST) == (
        "Do you have a terminal cold? Here we are, almost at the end of the\n"
        "century, and nobody asks.\n\nWhere are all the decent people?"
    )


def test_folded_attribution_over_two_lines() -> None:
    text = ("In article <C53L1s.D61@acsu.buffalo.edu>\n  psyrobtw@buffalo.edu (Robert Weiss) "
            "writes:\n>The Mormon Jesus\n\nIt is true that Mormons believe it.")
    assert own_words(text) == "It is true that Mormons believe it."


def test_mail_attribution_and_contact_block() -> None:
    text = ("On Mon, 3 May 1993, Ana wrote:\n> Can you send the slides?\n\nSure, attached.\n\n"
            "Kent Sandvik\nsandvik@newton.apple.com\nPhone: (408) 555-1234")
    assert own_words(text) == "Sure, attached."


def test_a_closing_paragraph_of_prose_is_kept() -> None:
    text = "I agree with you.\n\nSee you at the meeting on Monday,\nAna"
    assert own_words(text) == text


def test_only_quotes_leaves_nothing_and_plain_text_is_unchanged() -> None:
    assert own_words("X writes:\n> all quoted\n> here") == ""
    plain = "One line.\nAnother: with a colon inside, and a > sign."
    assert own_words(plain) == plain
