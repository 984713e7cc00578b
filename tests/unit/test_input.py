"""Checks on what users send: refusals name the problem, accepted attachments are delimited."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphs.core.settings import Settings
from ui.input import Attachment, InputRejected, check_message, compose


@dataclass
class Upload:
    """What check_message reads of a Chainlit file element."""

    name: str
    mime: str
    path: str


@pytest.fixture
def settings() -> Settings:
    return Settings(_env_file=None, max_message_chars=8000, max_upload_mb=1)  # type: ignore[call-arg]


def upload(tmp_path: Path, name: str, data: bytes, mime: str = "text/plain") -> Upload:
    path = tmp_path / name
    path.write_bytes(data)
    return Upload(name=name, mime=mime, path=str(path))


@pytest.mark.parametrize("content", ["", "   ", "\n\t  \n"], ids=["empty", "spaces", "blank"])
def test_a_message_with_nothing_in_it_is_refused(content: str, settings: Settings) -> None:
    with pytest.raises(InputRejected, match="empty"):
        check_message(content, [], settings)


def test_a_message_exactly_at_the_limit_is_accepted(settings: Settings) -> None:
    assert check_message("a" * settings.max_message_chars, [], settings) == []


def test_an_overlong_message_is_refused_with_both_numbers(settings: Settings) -> None:
    with pytest.raises(InputRejected) as caught:
        check_message("a" * (settings.max_message_chars + 1), [], settings)

    assert "8,001" in str(caught.value)
    assert "8,000" in str(caught.value)


def test_an_attachment_alone_is_a_message(tmp_path: Path, settings: Settings) -> None:
    notes = upload(tmp_path, "notes.txt", b"buy milk")

    assert check_message("", [notes], settings) == [Attachment("notes.txt", "buy milk")]


def test_a_disallowed_file_type_is_refused_by_name(tmp_path: Path, settings: Settings) -> None:
    report = upload(tmp_path, "report.pdf", b"%PDF-1.7", mime="application/pdf")

    with pytest.raises(InputRejected) as caught:
        check_message("summarise this", [report], settings)

    assert "report.pdf" in str(caught.value)
    assert "application/pdf" in str(caught.value)


def test_a_file_without_a_type_is_refused(tmp_path: Path, settings: Settings) -> None:
    mystery = upload(tmp_path, "mystery", b"hello", mime="")

    with pytest.raises(InputRejected, match="unknown"):
        check_message("what is this", [mystery], settings)


def test_an_oversize_attachment_is_refused(tmp_path: Path, settings: Settings) -> None:
    big = upload(tmp_path, "big.txt", b"a" * (1024 * 1024 + 1))

    with pytest.raises(InputRejected) as caught:
        check_message("read this", [big], settings)

    assert "big.txt" in str(caught.value)
    assert "1 MB" in str(caught.value)


def test_an_attachment_at_the_size_limit_is_accepted(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, max_message_chars=2 * 1024 * 1024, max_upload_mb=1)  # type: ignore[call-arg]
    exact = upload(tmp_path, "exact.txt", b"a" * (1024 * 1024))

    [attachment] = check_message("read this", [exact], settings)

    assert len(attachment.text) == 1024 * 1024


def test_a_non_utf8_file_is_refused(tmp_path: Path, settings: Settings) -> None:
    latin = upload(tmp_path, "latin1.txt", "café crème".encode("latin-1"))

    with pytest.raises(InputRejected) as caught:
        check_message("read this", [latin], settings)

    assert "latin1.txt" in str(caught.value)
    assert "UTF-8" in str(caught.value)


def test_a_utf8_file_with_nul_characters_is_refused(tmp_path: Path, settings: Settings) -> None:
    binary = upload(tmp_path, "dump.txt", b"looks like text\x00\x00then not")

    with pytest.raises(InputRejected, match=re.escape("dump.txt is not a text file")):
        check_message("what is this?", [binary], settings)


def test_one_bad_file_refuses_the_whole_message(tmp_path: Path, settings: Settings) -> None:
    good = upload(tmp_path, "good.txt", b"fine")
    bad = upload(tmp_path, "bad.bin", b"\x00\x01", mime="application/octet-stream")

    with pytest.raises(InputRejected, match=re.escape("bad.bin")):
        check_message("both please", [good, bad], settings)


def test_more_files_than_the_browser_allows_are_refused(tmp_path: Path, settings: Settings) -> None:
    """A hand-written client skips the browser's limit: one file fifty times was fifty copies
    (each up to the message limit) in front of the model."""
    notes = upload(tmp_path, "notes.txt", b"the same notes")
    limit = settings.max_upload_files

    assert len(check_message("read these", [notes] * limit, settings)) == limit
    with pytest.raises(InputRejected, match=f"{limit + 1} files attached; the limit is {limit}"):
        check_message("read these", [notes] * (limit + 1), settings)


def test_a_long_attachment_is_not_silently_cut(tmp_path: Path, settings: Settings) -> None:
    # Invariant 8: bad input gets a clear error, nothing is kept half-way. An attachment the
    # model cannot see whole must be refused, not truncated without a word to the user.
    text = "line of notes\n" * 1000  # 14,000 characters, well under the 1 MB upload limit
    long = upload(tmp_path, "long.txt", text.encode())

    try:
        [attachment] = check_message("summarise", [long], settings)
        outcome = "kept whole" if attachment.text == text else "cut without telling the user"
    except InputRejected as refused:
        outcome = "refused by name" if "long.txt" in str(refused) else "refused anonymously"

    assert outcome in {"kept whole", "refused by name"}


def test_compose_puts_each_attachment_in_a_delimited_block(tmp_path: Path) -> None:
    composed = compose(
        "  Compare these two.  ",
        [Attachment("a.txt", "alpha notes"), Attachment("b.md", "# beta")],
    )

    assert composed.startswith("Compare these two.")
    assert '<attachment name="a.txt">\nalpha notes\n</attachment>' in composed
    assert '<attachment name="b.md">\n# beta\n</attachment>' in composed
    assert composed.index("a.txt") < composed.index("b.md")


def test_compose_of_an_attachment_alone_has_no_leading_blank_text() -> None:
    composed = compose("   ", [Attachment("a.txt", "alpha")])

    assert composed == '<attachment name="a.txt">\nalpha\n</attachment>'


def test_compose_of_plain_text_is_the_text() -> None:
    assert compose(" hello ", []) == "hello"
