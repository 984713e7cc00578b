"""Grounding: a fact the model proposes must be drawn from what the user wrote, checked by code."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

# Letters that look like Latin ones (Cyrillic, Greek, fullwidth is handled by NFKC): folded so
# "аdmin" with a Cyrillic "а" reads as "admin" to every check, and cannot pass as new text.
_CONFUSABLES: Final = str.maketrans(
    {
        "а": "a",
        "в": "b",
        "е": "e",
        "ё": "e",
        "к": "k",
        "м": "m",
        "н": "h",
        "о": "o",
        "р": "p",
        "с": "c",
        "т": "t",
        "у": "y",
        "х": "x",
        "і": "i",
        "ј": "j",
        "ѕ": "s",
        "ԁ": "d",
        "ɡ": "g",
        "α": "a",
        "ε": "e",
        "ι": "i",
        "κ": "k",
        "ν": "v",
        "ο": "o",
        "ρ": "p",
        "τ": "t",
        "υ": "u",
        "χ": "x",
        "ı": "i",
    }
)
_APOSTROPHES_RE: Final = re.compile(r"['’‘`´ʼ]")
# ui/input.py compose() appends each uploaded file as <attachment name="…">…</attachment>
# (a closing tag inside a file is defanged there), after what the user typed.
_ATTACHMENT_RE: Final = re.compile(r"<attachment name=\"[^\"]*\">.*?(?:</attachment>|\Z)", re.S)
_WORD_RE: Final = re.compile(r"[^\W_]+")


def fold(text: str) -> str:
    """NFKC, casefold, invisible format characters dropped, look-alike letters made Latin."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return text.casefold().translate(_CONFUSABLES)


# fmt: off
_STOPWORDS: Final = frozenset({
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "with", "from", "by", "as", "into",
    "and", "or", "but", "so", "also", "too", "very", "really", "just", "about", "than", "then",
    "is", "am", "are", "was", "were", "be", "been", "being", "has", "have", "had", "having",
    "do", "does", "did", "will", "would", "shall", "should", "can", "could", "may", "might",
    "i", "me", "my", "mine", "myself", "im", "ive", "id", "ill", "we", "us", "our", "ours",
    "user", "users", "their", "theirs", "they", "them", "themselves", "he", "him", "his",
    "she", "her", "hers", "it", "its", "this", "that", "these", "those", "who", "which",
    "what", "there", "here", "now", "currently", "still", "usually", "generally",
})
# fmt: on
_NEGATIONS: Final = frozenset(
    {
        "not",
        "no",
        "never",
        "none",
        "nor",
        "dont",
        "doesnt",
        "didnt",
        "isnt",
        "arent",
        "wasnt",
        "werent",
        "cant",
        "cannot",
        "wont",
        "wouldnt",
        "shouldnt",
        "couldnt",
        "hasnt",
        "havent",
        "hadnt",
        "neither",
    }
)
NEGATION: Final = "not"
"""Every negation is one token, so "does not" in a fact matches the user's "don't"."""


def typed_text(message: str) -> str:
    """What the user typed in a message, without the files they attached: a document or a
    pasted page is not the user speaking about themselves."""
    return _ATTACHMENT_RE.sub(" ", message)


# The canonical "User …" phrasing needs these even when the user said "I moved to Pune" or
# "I like …": they carry no claim of their own (the object must still be the user's words).
_FRAMING: Final = frozenset({"liv", "prefer", "preference", "nam", "call"})


def _stem(word: str) -> str:
    """A light suffix stripper: "lives"/"lived"/"living" -> "liv", "works" -> "work"."""
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + keep
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiou":
        word = word[:-1]  # "preferred" -> "preferr" -> "prefer"
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]  # "live" and "lives" meet at "liv"
    return word


@lru_cache(maxsize=4096)
def content_words(text: str) -> frozenset[str]:
    """The stems that carry meaning, with every negation as NEGATION."""
    words = _WORD_RE.findall(_APOSTROPHES_RE.sub("", fold(text)))
    found: set[str] = set()
    for word in words:
        if word in _NEGATIONS:
            found.add(NEGATION)
        elif word not in _STOPWORDS:
            found.add(_stem(word))
    return frozenset(found)


def ungrounded_words(
    fact: str, evidence: Iterable[str], *, keep_polarity: bool = False
) -> set[str]:
    """The fact's meaningful words that the user never wrote (empty: the fact is grounded).

    keep_polarity: the evidence is one request ("remember that I'm not vegetarian"), so a fact
    that drops its "not" misstates it, as much as one that adds a word.
    """
    said: set[str] = set()
    for text in evidence:
        said |= content_words(text)
    missing = set(content_words(fact) - said - _FRAMING)
    if keep_polarity and NEGATION in said and NEGATION not in content_words(fact):
        missing.add(NEGATION)
    return missing


# --- explicit requests to remember ------------------------------------------------------------

_REQUEST_RE: Final = re.compile(
    r"\b(?P<polite>please\s+|(?:can|could|would|will)\s+you\s+(?:please\s+)?)?"
    r"(?P<verb>remember|memori[sz]e|keep\s+in\s+mind|make\s+a\s+note|take\s+note|note\s+down"
    r"|note|(?:do\s+not|don'?t|never)\s+forget|save|store)\b"
    r"(?:\s+(?:this|that|it|for\s+me|for\s+later|down))*(?:\s*[:,-])?",
)
# "Do you remember …?", "I can't remember", "remember to call mom", "remember when …": no
# request to store a fact about the user.
_NOT_A_REQUEST_BEFORE_RE: Final = re.compile(
    r"\b(?:do|did|does|you|i|we|can'?t|cannot|couldn'?t|don'?t|not|never|to)\s+$"
)
_NOT_A_REQUEST_AFTER_RE: Final = re.compile(
    r"^\s*(?:to\s+\w|when\b|how\b|where\b|what\b|why\b|who\b|if\b|whether\b|me\b)"
)
_SENTENCE_END_RE: Final = re.compile(r"[.!?\n]+")
_COMMAND_ONLY_VERBS: Final = frozenset({"note", "save", "store"})
"""Requests only in command position ("Save that I …"), not in "I want to save money"."""
# "remember this for next time, thanks": words around a request that point at nothing.
_FILLER: Final = frozenset(
    {"pleas", "thank", "thx", "ok", "okay", "later", "next", "tim", "futur", "forever", "going"}
    | {"forward", "again", "everyth", "right", "now", "you", "ai", "cairn"}
)


@dataclass(frozen=True)
class Request:
    """What the user's own message explicitly asks to remember."""

    scope: tuple[str, ...]
    """The user's words each request points at: the rest of its sentence, or, for a bare
    "remember that." / "please remember!", what they wrote before it."""


def remember_request(message: str) -> Request | None:
    """The explicit "remember …" requests in the user's latest message, or None if it has none."""
    text = _APOSTROPHES_RE.sub("'", fold(message))
    scopes: list[str] = []
    for match in _REQUEST_RE.finditer(text):
        before, rest = text[: match.start()], text[match.end() :]
        polite = match.group("polite") is not None
        if (not polite and _NOT_A_REQUEST_BEFORE_RE.search(before)) or (
            _NOT_A_REQUEST_AFTER_RE.match(rest)
        ):
            continue
        if match.group("verb") in _COMMAND_ONLY_VERBS and not (polite or _commands(before)):
            continue
        tail = _SENTENCE_END_RE.split(rest, maxsplit=1)[0]
        scope = tail if content_words(tail) - _FILLER else before
        if content_words(scope) - _FILLER:
            scopes.append(scope)
    return Request(scope=tuple(scopes)) if scopes else None


def _commands(before: str) -> bool:
    before = before.rstrip()
    return not before or before[-1] in ".!?,;:\n" or before.endswith(("and", "also"))


# --- requests to forget -----------------------------------------------------------------------

_FORGET_RE: Final = re.compile(
    r"\b(?:forget\w*|forgot|delete|remove|erase|wipe|unlearn|clear|drop|discard"
    r"|stop\s+remembering|no\s+longer|any\s?more|not\s+true|wrong|outdated)\b"
)


def asks_to_forget(message: str) -> bool:
    """The user's latest message speaks of forgetting, removing or a fact no longer holding:
    the least a forget must rest on. Generous on purpose: a forget the user wanted is not
    refused for its wording, while a model forgetting on its own, in reply to "hello", is."""
    return _FORGET_RE.search(fold(message)) is not None
