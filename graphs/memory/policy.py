"""Write policy for long-term memory: code checks every operation a model proposes before a write."""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Final, Literal, get_args

from pydantic import BaseModel, Field, field_validator
from stdnum import iban, luhn
from stdnum.in_ import aadhaar, pan
from stdnum.us import ssn

from graphs.core.text import has_controls, without_controls
from graphs.memory.grounding import fold, ungrounded_words

Category = Literal[
    "profile",
    "preference",
    "fact",
    "relationship",
    "work",
    "health",
    "religion",
    "politics",
    "sexuality",
    "finance_sensitive",
    "other",
]
CATEGORIES: Final[frozenset[str]] = frozenset(get_args(Category))
SENSITIVE_CATEGORIES: Final[frozenset[str]] = frozenset(
    {"health", "religion", "politics", "sexuality", "finance_sensitive"}
)
"""Storable only for a user who opted into that category."""

MAX_CHARS: Final = 300

PROFILE_SLOTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "name": "the user's full name",
        "preferred_name": "what the user likes to be called",
        "pronouns": "the user's pronouns",
        "language": "the language the user wants replies in",
        "home_city": "the city the user lives in",
        "country": "the country the user lives in",
        "timezone": "the user's time zone",
        "occupation": "the user's job or role",
        "employer": "the organisation the user works for",
        "manager": "who the user reports to",
        "diet": "what the user eats or avoids eating",
        "units": "metric or imperial",
    }
)
"""Canonical keys for pinned core facts, so a changed fact overwrites the old one."""

Reason = Literal[
    "ok",
    "noop",
    "empty",
    "too_long",
    "secret",
    "instruction",
    "other_person",
    "disallowed_category",
    "unknown_key",
    "tombstoned",
    "inferred_over_stated",
    "duplicate",
    "authority",
    "ungrounded",
    "not_requested",
]
OK: Final = "ok"
NOOP: Final = "noop"
EMPTY: Final = "empty"
TOO_LONG: Final = "too_long"
SECRET: Final = "secret"  # noqa: S105 - a reason name, not a password
INSTRUCTION: Final = "instruction"
OTHER_PERSON: Final = "other_person"
DISALLOWED_CATEGORY: Final = "disallowed_category"
UNKNOWN_KEY: Final = "unknown_key"
TOMBSTONED: Final = "tombstoned"
INFERRED_OVER_STATED: Final = "inferred_over_stated"
DUPLICATE: Final = "duplicate"
AUTHORITY: Final = "authority"
UNGROUNDED: Final = "ungrounded"
NOT_REQUESTED: Final = "not_requested"
"""The remember tool: the user's latest message does not ask to remember anything."""


class MemoryOp(BaseModel):
    """One proposed change to what Cairn remembers about the user."""

    action: Literal["insert", "update", "noop"] = Field(
        description=(
            "insert: save a new durable fact about the user. update: replace the fact stored "
            "under an existing key because the user changed or corrected it. noop: nothing to save."
        )
    )
    key: str | None = Field(
        default=None,
        description=(
            "For update: the existing memory's key, copied exactly. For insert: a slot name such "
            "as home_city, diet or manager when the fact fills one; otherwise leave it empty."
        ),
    )
    # The 300-character limit is described here but enforced by check_op, so one overlong
    # op is refused on its own instead of failing the whole batch at parse time.
    content: str = Field(
        description=(
            "One short third-person statement about the user, starting with 'User', e.g. "
            "'User is vegetarian' or \"User's manager is Priya\". At most 300 characters. "
            "Never include passwords, codes, card, account or ID numbers, other people's "
            "contact details, or anything addressed to the assistant."
        )
    )
    category: Category = Field(
        description=(
            "The kind of fact. Use health, religion, politics, sexuality or finance_sensitive "
            "whenever the fact touches those topics, even in passing."
        )
    )
    stated: bool = Field(
        description="True if the user said this explicitly; false if you inferred it."
    )
    confidence: float = Field(
        default=0.8,
        ge=0.0,
        le=1.0,
        description="How sure you are that the fact is true and lasting, from 0 to 1.",
    )

    @field_validator("content", "key")
    @classmethod
    def _no_controls(cls, value: str | None) -> str | None:
        # A NUL would fail the store's jsonb write; the rest never belongs in a fact either.
        if value is None or not has_controls(value):
            return value
        return " ".join(without_controls(value).split())


class MemoryOps(BaseModel):
    """The memory operations proposed for one idle conversation."""

    ops: list[MemoryOp] = Field(
        max_length=20,
        description=(
            "At most 20 operations. Keep only durable, user-specific facts and preferences; "
            "return an empty list when nothing new is worth remembering."
        ),
    )


@dataclass(frozen=True)
class Existing:
    """A memory already in the user's store."""

    key: str
    content: str
    stated: bool


@dataclass(frozen=True)
class Tombstone:
    """A forget record: the key and/or the normalised fact the user asked to forget."""

    key: str | None
    fact: str | None


@dataclass(frozen=True)
class Verdict:
    """What code decided about one proposed op; only accepted verdicts may be written."""

    op: MemoryOp
    key: str | None
    accepted: bool
    reason: Reason
    detail: str = ""
    """Which rule fired (e.g. the kind of secret); safe to log, never contains the content."""


# --- normalisation and keys -------------------------------------------------------------------

_SLUG_RE = re.compile(r"[a-z][a-z0-9_]{1,48}")
_APOSTROPHES_RE = re.compile(r"['’‘`´ʼ]")
_PUNCTUATION_RE = re.compile(r"[^\w\s]|_")
_USER_PREFIX_RE = re.compile(r"^(?:(?:the\s+)?users?\b\s*)+")


# Pure, and called for every stored memory and tombstone per op, so worth memoising.
@lru_cache(maxsize=4096)
def normalise_fact(text: str) -> str:
    """Casefold, drop punctuation and the leading 'User'/'the user'/"User's", squash spaces.

    Folded like every other check (grounding.fold): an invisible character or a look-alike
    letter cannot make a forgotten fact look new.
    """
    text = fold(text)
    text = _APOSTROPHES_RE.sub("", text)
    text = " ".join(_PUNCTUATION_RE.sub(" ", text).split())
    return _USER_PREFIX_RE.sub("", text)


def fact_key(content: str) -> str:
    """The stable key of a fact that fills no slot: a hash of its normalised text."""
    digest = hashlib.sha256(normalise_fact(content).encode()).hexdigest()
    return f"fact_{digest[:16]}"


def canonical_key(op: MemoryOp) -> str:
    """The op's key if it is a known slot or a valid slug, else the fact's hash key."""
    if op.key is not None and (op.key in PROFILE_SLOTS or _SLUG_RE.fullmatch(op.key)):
        return op.key
    return fact_key(op.content)


# --- secrets ----------------------------------------------------------------------------------

_I = re.IGNORECASE
_KEYWORD_SECRETS: Final = (
    ("private_key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----", _I)),
    (
        "password",
        re.compile(
            r"\b(?:pass(?:word|wd|code|phrase)|pwd)s?\b(?:\s+(?:for|to|of|on)\s+[^:=\n]{1,40}?)?"
            r"\s*(?:is|was|[:=]|->)\s*\S",
            _I,
        ),
    ),
    (
        "pin",
        re.compile(
            r"\b(?:(?:atm|upi|card|debit|credit|phone|sim)\s+|m)?pin\b(?!\s*-?\s*code)"
            r"(?:\s+(?:number|no\.?))?\s*(?:is|was|[:=])?\s*[0-9]{4,8}\b",
            _I,
        ),
    ),
    (
        "one_time_code",
        re.compile(
            r"\b(?:otp|one[\s-]?time\s+(?:password|pass\s?code|code|pin)|(?:verification|security"
            r"|authentication|auth|login|sign[\s-]?in|confirmation|2fa|mfa|access)\s+code"
            r"|cvv2?|cvc2?)\b[^0-9]{0,20}?[0-9]{3,8}\b",
            _I,
        ),
    ),
    (
        "account_recovery",
        re.compile(
            r"\b(?:(?:security|secret)\s+(?:question|answer)|mother['’]?s\s+maiden\s+name"
            r"|(?:seed|recovery|mnemonic)\s+phrase|recovery\s+(?:code|key)s?|backup\s+codes?)\b",
            _I,
        ),
    ),
    ("api_key", re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}")),
    ("api_key", re.compile(r"(?<![A-Za-z0-9])(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{10,}")),
    ("api_key", re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_|github_pat_)[A-Za-z0-9_]{20,}")),
    ("api_key", re.compile(r"(?<![A-Za-z0-9])(?:glpat-|xox[abprs]-)[A-Za-z0-9_-]{10,}")),
    ("api_key", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])")),
    ("api_key", re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}")),
    (
        "api_key",
        re.compile(
            r"\b(?:api[\s_-]?(?:key|token)|access[\s_-]?(?:token|key)|auth(?:entication)?[\s_-]?"
            r"token|refresh[\s_-]?token|secret[\s_-]?key|client[\s_-]?secret|private[\s_-]?key"
            r"|token)\s*(?:is|was|[:=])\s*(?=[A-Za-z0-9._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{8,}",
            _I,
        ),
    ),
    ("bearer_token", re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=-]{20,}", _I)),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")),
    # An ID number named as such is refused even when its checksum fails: a mistyped
    # real number still gives most of it away.
    (
        "payment_card",
        re.compile(
            r"\b(?:credit\s+|debit\s+)?card\s*(?:number|no\.?|num|#)\s*(?:is|was|[:=])?\s*"
            r"[0-9][0-9 -]{10,}[0-9]",
            _I,
        ),
    ),
    (
        "ssn",
        re.compile(
            r"\b(?:ssn|social\s+security(?:\s+number)?)\b[^0-9]{0,20}[0-9]{3}[ -]?[0-9]{2}[ -]?[0-9]{4}\b",
            _I,
        ),
    ),
    (
        "aadhaar",
        re.compile(
            r"\b(?:aadhaar|aadhar|uidai?)\b[^0-9]{0,25}[0-9]{4}[ -]?[0-9]{4}[ -]?[0-9]{4}\b", _I
        ),
    ),
)
_DIGIT_RUN_RE = re.compile(r"(?<![0-9])[0-9](?:[ -]?[0-9])*(?![0-9])")
_SSN_SHAPE_RE = re.compile(r"[0-9]{3}([ -])[0-9]{2}\1[0-9]{4}")
_ACCOUNT_RE = re.compile(
    r"\b(?:(?:bank\s+)?(?:account|acct)\s*(?:number|no\.?|num|#)|a/c(?:\s*(?:number|no\.?|#))?)"
    r"\s*(?:is|was|[:=-])?\s*([0-9][0-9 -]{6,}[0-9])",
    _I,
)
_IFSC_RE = re.compile(r"\b[A-Z]{4}0[A-Z0-9]{6}\b")
_IBAN_CANDIDATE_RE = re.compile(r"\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,32}", _I)
_PAN_CANDIDATE_RE = re.compile(r"\b[A-Z]{5}[0-9]{4}[A-Z]\b", _I)
_TOKEN_RE = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
_HEX_RE = re.compile(r"[0-9a-f]+|[0-9A-F]+")


def detect_secret(text: str) -> str | None:
    """Why the text holds a credential or an identity/payment number, or None if it does not."""
    for kind, pattern in _KEYWORD_SECRETS:
        if pattern.search(text):
            return kind
    return _bank_secret(text) or _number_secret(text) or _token_secret(text)


def _digits(run: str) -> str:
    return run.replace(" ", "").replace("-", "")


def _number_secret(text: str) -> str | None:
    for match in _DIGIT_RUN_RE.finditer(text):
        if text[: match.start()].endswith("+"):
            continue  # an international phone number, which can be 12-15 digits long
        run = match.group()
        digits = _digits(run)
        if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
            return "payment_card"
        if len(digits) == 12 and aadhaar.is_valid(digits):
            return "aadhaar"
        if _SSN_SHAPE_RE.fullmatch(run) and ssn.is_valid(run.replace(" ", "-")):
            return "ssn"
    if any(pan.is_valid(m.group().upper()) for m in _PAN_CANDIDATE_RE.finditer(text)):
        return "pan"
    return None


def _bank_secret(text: str) -> str | None:
    for match in _IBAN_CANDIDATE_RE.finditer(text):
        compact = match.group().replace(" ", "").upper()
        # The candidate may run into following words; an IBAN is 15 to 34 characters.
        if any(iban.is_valid(compact[:size]) for size in range(min(len(compact), 34), 14, -1)):
            return "iban"
    for match in _ACCOUNT_RE.finditer(text):
        if 8 <= len(_digits(match.group(1))) <= 18:
            return "bank_account"
    if _IFSC_RE.search(text) and any(
        len(_digits(run.group())) >= 8 for run in _DIGIT_RUN_RE.finditer(text)
    ):
        return "bank_account"
    return None


def _token_secret(text: str) -> str | None:
    for match in _TOKEN_RE.finditer(text):
        token = match.group().rstrip("=")
        if _HEX_RE.fullmatch(token):
            if any(c.isdigit() for c in token) and any(c.isalpha() for c in token):
                return "high_entropy_string"
            continue
        mixed = (
            any(c.isupper() for c in token)
            and any(c.islower() for c in token)
            and any(c.isdigit() for c in token)
        )
        if mixed and _entropy_bits(token) >= 3.5:
            return "high_entropy_string"
    return None


def _entropy_bits(token: str) -> float:
    counts = Counter(token).values()
    return -sum(n / len(token) * math.log2(n / len(token)) for n in counts)


# --- instruction-shaped text ------------------------------------------------------------------

_INSTRUCTION_PATTERNS: Final = tuple(
    re.compile(pattern, _I | re.MULTILINE)
    for pattern in (
        r"\bignore\s+(?:(?:all|any|the|your|my|previous|prior|above|earlier|preceding|former"
        r"|system|these|those|other)\s+){0,3}(?:instructions?|prompts?|system\s+messages?)\b",
        r"\bignore\s+(?:(?:all|any|the|your|previous|prior|above|earlier|preceding)\s+)+"
        r"(?:rules?|guidelines?|directions?|messages?|context|constraints?)\b",
        r"\b(?:disregard|forget)\s+(?:(?:all|any|the|your|my|previous|prior|above|earlier"
        r"|everything|what)\s+)*(?:instructions?|prompts?|rules?|guidelines?|directions?|context"
        r"|you\s+(?:were|have\s+been)\s+told)\b",
        r"\byou\s+are\s+now\b|\byou['’]re\s+now\b|\byou\s+will\s+now\b",
        r"\byou\s+(?:must|should|shall|have\s+to|need\s+to|are\s+required\s+to)\b",
        r"\b(?:the\s+)?(?:assistant|ai|model|bot|chatbot|llm|cairn)\s+(?:must|should|shall"
        r"|has\s+to|needs\s+to|is\s+required\s+to|will\s+always|will\s+never)\b",
        r"\bsystem\s+(?:prompt|message)s?\b|\bdeveloper\s+(?:mode|message)\b|\bjailbreak",
        r"\b(?:new|updated|hidden|secret)\s+instructions?\b",
        r"\b(?:act|behave)\s+as\s+(?:if\s+)?(?:you|an?\s+(?:ai|assistant|different|unrestricted"
        r"|new)\b|dan\b|the\s+(?:system|assistant|admin|developer))",
        r"\bpretend\s+(?:to\s+be|you\s+are|you['’]re|that\s+you)\b",
        r"\bfrom\s+now\s+on\s*,?\s*(?:you|always|never|only|respond|answer|reply|speak|use"
        r"|call|do|don['’]?t|ignore)\b",
        r"\breveal\s+(?:(?:your|the|any|all)\s+)?(?:(?:system|hidden|secret|internal|confidential"
        r"|original|initial)\s+)?(?:prompts?|instructions?|rules?|secrets?|passwords?|keys?"
        r"|configuration|memories|data)\b",
        r"\b(?:do\s+not|don['’]?t)\s+tell\b",
        r"\boverride\s+(?:(?:your|the|all|any|previous|prior)\s+)*(?:instructions?|rules?"
        r"|safety|guidelines?|system|settings)\b",
        # Role markers and chat-template tokens.
        r"<\|[^|>]{0,40}\|>|\[/?(?:INST|SYS)\]|<</?SYS>>",
        r"###\s*(?:instruction|system|assistant|user|response|input)s?\b",
        r"</?\s*(?:system|assistant|instructions?|prompt)\s*>",
        r"\b(?:system|assistant|developer)\s*:",
        r"^\s*(?:user|human|ai)\s*:",
    )
)
_SENTENCE_SPLIT_RE = re.compile(r"[.!?;:\n\"“”]+")
# fmt: off
_IMPERATIVE_VERBS: Final = frozenset({
    "ignore", "disregard", "forget", "pretend", "act", "respond", "answer", "reply", "say",
    "tell", "output", "print", "repeat", "reveal", "show", "call", "send", "forward", "delete",
    "remove", "include", "mention", "execute", "run", "obey", "follow", "stop", "remember",
    "treat", "assume", "switch", "override", "bypass", "disable", "enable", "use", "write",
    "speak", "talk", "address", "refer", "avoid", "translate", "summarize", "summarise",
    "recommend", "suggest", "ask", "greet", "sign", "format", "start", "begin", "end", "add",
    "share", "disclose", "do", "don't", "dont", "please", "you", "your",
})
# fmt: on
_ADVERBS: Final = frozenset({"always", "never", "only"})


def has_injection_marker(text: str) -> bool:
    """True if the text holds prompt-injection markers ("ignore previous instructions", role
    tokens, "you must ..."). Unlike looks_like_instruction it accepts plain imperatives, so it
    is the check for text that is imperative by nature: plan steps, research task descriptions."""
    return any(pattern.search(text) for pattern in _INSTRUCTION_PATTERNS)


def looks_like_instruction(text: str) -> bool:
    """True if the text reads as orders to the assistant rather than a fact about the user."""
    if has_injection_marker(text):
        return True
    return any(_is_imperative(sentence) for sentence in _SENTENCE_SPLIT_RE.split(text))


def _is_imperative(sentence: str) -> bool:
    words = re.sub(r"^[^A-Za-z]+", "", sentence).casefold().replace("’", "'").split()
    if not words:
        return False
    if words[0] in _ADVERBS:
        return len(words) > 1 and words[1] in _IMPERATIVE_VERBS
    return words[0] in _IMPERATIVE_VERBS


# --- claims of authority ----------------------------------------------------------------------

_AUTHORITY_PATTERNS: Final = tuple(
    re.compile(pattern)
    for pattern in (
        r"\b(?:admin\w*|superusers?|super[\s-]users?|sysadmins?|sudoers?|sudo|moderators?"
        r"|root\s+(?:access|users?|rights|privileges?|accounts?))\b",
        r"\b(?:full|unrestricted|unlimited|elevated|special|privileged|complete|total|extra"
        r"|higher|all)\s+(?:access|rights|permissions?|privileges?|control|clearance|powers?)\b",
        r"\b(?:permissions?|privileges?|privileged|clearance|authori[sz]\w*|entitled|exempt"
        r"|whitelisted|allowlisted|jailbroken|unrestricted)\b",
        r"\b(?:allowed|permitted|approved|cleared|able)\s+to\s+(?:access|see|read|view|change"
        r"|override|bypass|use|run|ignore|skip|do|get|make|have|know)\b|\bis\s+allowed\b",
        r"\b(?:has|have|had|with|granted|given|gets?|holds?)\s+(?:\w+\s+){0,2}access\b"
        r"|\bcan\s+access\b|\baccess\s+(?:to|level|rights)\b",
        r"\b(?:obey\w*|comply|complies|bypass\w*|override\w*|overrule\w*)\b",
        r"\b(?:(?:always|must|should)\s+(?:always\s+)?be|(?:is|are)\s+to\s+be)\s+"
        r"(?:trusted|believed|obeyed|followed|agreed\s+with|answered\s+fully)\b"
        r"|\bwhat(?:ever)?\s+(?:the\s+)?user\s+says\s+goes\b|\bdoes\s+whatever\b",
        r"\b(?:trusted|verified|vip|official|internal)\s+(?:users?|accounts?|identity|operators?"
        r"|staff|testers?|developers?|members?)\b",
        r"\b(?:owner|operator|developer|creator|maintainer)s?\s+of\s+(?:this|the|cairn)\b",
        r"\bsystem\s+(?:prompts?|messages?|instructions?|rules?|access)\b",
        r"\b(?:no|without|free\s+of)\s+(?:restrictions?|limits?|limitations?|filters?|rules?"
        r"|guardrails?|safety)\b",
    )
)


def claims_authority(text: str) -> bool:
    """True if the text grants a role, a permission, access or a standing order.

    Memory records facts about the user; it never grants rights, whatever the source (the
    model, the background job, or the user's own edit), because every memory is replayed into
    later prompts where such a line would read as an entitlement. Look-alike letters and
    invisible characters are folded first ("аdmin" with a Cyrillic "а" is "admin").
    """
    folded = fold(text).replace("’", "'")
    return any(pattern.search(folded) for pattern in _AUTHORITY_PATTERNS)


# --- whose fact is it -------------------------------------------------------------------------

_USER_SUBJECT_RE = re.compile(r"^\s*(?:the\s+)?user(?:['’]s)?\s+\S", _I)
_CHAIN_RE = re.compile(
    r"^\s*(?:the\s+)?user['’]s\s+((?:[\w-]+\s+){0,2}[\w-]+)['’]s?\s+([\w-]+)", _I
)
_CHAIN_VERBS: Final = frozenset(
    {"is", "was", "are", "were", "has", "had", "have", "lives", "works"}
)
# "User's mother's name is Asha" names a relation; anything else chained is about them.
_CHAIN_ALLOWED: Final = frozenset({"name", "names", "nickname", "birthday", "anniversary"})
_RELATIONS = (
    r"mother|mom|mum|father|dad|parents?|sisters?|brothers?|siblings?|wife|husband|spouse"
    r"|partner|girlfriend|boyfriend|fianc[ée]e?|sons?|daughters?|child|children|kids?|baby"
    r"|friends?|colleagues?|co-?workers?|boss|manager|neighbou?rs?|room-?mates?|flatmates?"
    r"|cousins?|uncles?|aunts?|grand(?:mother|father|ma|pa|parents?|sons?|daughters?|child)"
    r"|nieces?|nephews?|[\w]+-in-law|ex|teammates?|mentor|clients?|landlord|tenants?|doctor"
    r"|therapist|employees?|reports?|teachers?|students?|family"
)
_PERSONAL_PREDICATES = (
    r"has|had|suffers|suffered|takes|took|earns|owes|votes|believes|underwent"
    r"|(?:is|was)\s+(?:diagnosed|allergic|pregnant|sick|ill|gay|lesbian|bisexual|trans"
    r"|being\s+treated|undergoing|on\s+medication|in\s+(?:hospital|rehab|therapy|debt)"
    r"|getting\s+divorced)"
)
_RELATION_ATTRIBUTE_RE = re.compile(
    rf"^\s*(?:the\s+)?user['’]s\s+(?:[\w-]+\s+){{0,2}}?(?:{_RELATIONS})\s+(?:\w+\s+)?"
    rf"(?:{_PERSONAL_PREDICATES})\b",
    _I,
)
_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_INTL_PHONE_RE = re.compile(r"(?<![\w+])\+[0-9][0-9 ().-]{5,}[0-9]")
_PHONE_CONTEXT_RE = re.compile(
    r"\b(?:phone|mobile|cell|telephone|tel|whatsapp|landline|contact)\b[^0-9+]{0,25}"
    r"(\+?[0-9][0-9 ().-]{5,}[0-9])",
    _I,
)
_OWN_CONTACT_PREFIX_RE = re.compile(
    r"\s*(?:the\s+)?user(?:['’]s\s+(?:(?:personal|work|primary|main|preferred|home|office"
    r"|business|private|new|current)\s+)?(?:e-?mail(?:\s+address)?|phone(?:\s+number)?"
    r"|mobile(?:\s+(?:phone|number))?|cell(?:\s+(?:phone|number))?|telephone(?:\s+number)?"
    r"|whatsapp(?:\s+number)?|contact(?:\s+(?:number|e-?mail))?|landline)\s+is"
    r"|\s+(?:can\s+be\s+reached|is\s+reachable)\s+(?:at|on|via))\s+",
    _I,
)


def about_other_person(content: str) -> bool:
    """True if the content is not a fact about the user in canonical 'User …' form."""
    if not _USER_SUBJECT_RE.match(content):
        return True
    if _RELATION_ATTRIBUTE_RE.match(content) or _has_foreign_contact(content):
        return True
    chain = _CHAIN_RE.match(content)
    if chain is None or _CHAIN_VERBS.intersection(chain.group(1).casefold().split()):
        return False
    return chain.group(2).casefold() not in _CHAIN_ALLOWED


def _has_foreign_contact(content: str) -> bool:
    """Contact details are allowed only as "User's email is …": one, and the user's own."""
    spans = _contact_spans(content)
    if not spans:
        return False
    if len(spans) > 1:
        return True
    start, end = spans[0]
    own = _OWN_CONTACT_PREFIX_RE.fullmatch(content[:start])
    return not (own and content[end:].strip(" .") == "")


def _contact_spans(content: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in _EMAIL_RE.finditer(content)]
    spans += [m.span() for m in _INTL_PHONE_RE.finditer(content) if _is_phone(m.group())]
    spans += [m.span(1) for m in _PHONE_CONTEXT_RE.finditer(content) if _is_phone(m.group(1))]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _is_phone(text: str) -> bool:
    return 7 <= sum(c.isdigit() for c in text) <= 15


# --- the checks -------------------------------------------------------------------------------


def is_tombstoned(*, key: str, content: str, tombstones: Iterable[Tombstone]) -> bool:
    """True if a forget record matches the key, the fact's hash key, or the fact itself.

    The fact matches when the normalised texts are equal or one contains the other as whole
    words ("prefers window seats" forbids "prefers window seats as usual"): a forgotten fact
    restated with a few extra words is still the forgotten fact.
    """
    fact = normalise_fact(content)
    keys = {key, fact_key(content)}
    return any(
        (t.key is not None and t.key in keys)
        or (t.fact is not None and _same_fact(normalise_fact(t.fact), fact))
        for t in tombstones
    )


def _same_fact(forgotten: str, candidate: str) -> bool:
    if forgotten == candidate:
        return True
    shorter, longer = sorted((forgotten, candidate), key=len)
    # Too short to stand for a fact on its own ("is", "likes"): only exact matches count.
    if len(shorter.split()) < 2:
        return False
    return f" {shorter} " in f" {longer} "


_SENSITIVE_TERMS: Final[dict[str, re.Pattern[str]]] = {
    "health": re.compile(
        r"\b(diabet\w*|asthma\w*|cancer|tumou?r|depress\w*|anxiety|adhd|autis\w*|hiv|"
        r"pregnan\w*|medication|diagnos\w*|therap\w*|chemo\w*|disabilit\w*|migraines?|"
        r"epilep\w*|bipolar|schizophren\w*|rehab)\b",
        re.I,
    ),
    "religion": re.compile(
        r"\b(pray\w*|mosque|church|temple|synagogue|gurdwara|muslim|christian|hindu|jewish|"
        r"sikh|buddhist|atheist|ramadan|bible|quran|torah|religio\w*)\b",
        re.I,
    ),
    "politics": re.compile(
        r"\b(vot(e|es|ed|ing) for|political|democrat\w*|republican\w*|bjp|"
        r"labour party|conservative party|socialist|communist)\b",
        re.I,
    ),
    "sexuality": re.compile(
        r"\b(gay|lesbian|bisexual|transgender|queer|asexual|sexual orientation)\b", re.I
    ),
    "finance_sensitive": re.compile(
        r"\b(salary|income|debts?|loans?|credit score|bankrupt\w*|net worth)\b", re.I
    ),
}


def sensitive_topic(content: str) -> str | None:
    """The sensitive category a fact touches, whatever category the model gave it."""
    for category, pattern in _SENSITIVE_TERMS.items():
        if pattern.search(content):
            return category
    return None


def check_op(
    op: MemoryOp,
    *,
    existing: Mapping[str, Existing],
    tombstones: Collection[Tombstone],
    opted_in: frozenset[str] = frozenset(),
    max_chars: int = MAX_CHARS,
    evidence: Collection[str] | None = None,
    keep_polarity: bool = False,
) -> Verdict:
    """Decide whether one proposed op may be written, and under which key.

    evidence: what the user wrote (their own messages, never the assistant's or a tool's).
    Given, every meaningful word of the fact must come from it, so a model cannot add a claim
    the user never made. None only where the user typed the fact themselves (memory page).
    keep_polarity: the evidence is one request, so a fact that drops its "not" is refused.
    """
    topic = sensitive_topic(op.content)
    if topic is not None and op.category not in SENSITIVE_CATEGORIES:
        # The model's label is not trusted: a fact about prayers is a religion fact.
        op = op.model_copy(update={"category": topic})
    if op.action == "noop":
        return Verdict(op, op.key, accepted=False, reason=NOOP)
    problem = _content_problem(op, opted_in=opted_in, max_chars=max_chars)
    if problem is not None:
        return Verdict(op, None, accepted=False, reason=problem[0], detail=problem[1])
    key = _target_key(op, existing)
    if key is None:
        return Verdict(op, op.key, accepted=False, reason=UNKNOWN_KEY)
    if is_tombstoned(key=key, content=op.content, tombstones=tombstones):
        return Verdict(op, key, accepted=False, reason=TOMBSTONED)
    if evidence is not None and (
        missing := ungrounded_words(op.content, evidence, keep_polarity=keep_polarity)
    ):
        detail = f"{len(missing)} word(s) the user did not write"
        return Verdict(op, key, accepted=False, reason=UNGROUNDED, detail=detail)
    current = existing.get(key)
    if current is not None:
        if current.stated and not op.stated:
            return Verdict(op, key, accepted=False, reason=INFERRED_OVER_STATED)
        same = normalise_fact(current.content) == normalise_fact(op.content)
        # Restating an inferred fact explicitly is a write: it makes the fact stated.
        if same and (current.stated or not op.stated):
            return Verdict(op, key, accepted=False, reason=DUPLICATE)
    return Verdict(op, key, accepted=True, reason=OK)


def _content_problem(
    op: MemoryOp, *, opted_in: frozenset[str], max_chars: int
) -> tuple[Reason, str] | None:
    content = op.content.strip()
    if not content or not normalise_fact(content):
        return EMPTY, ""
    if len(content) > max_chars:
        return TOO_LONG, f"{len(content)} > {max_chars} characters"
    secret = detect_secret(content)
    if secret is not None:
        return SECRET, secret
    if looks_like_instruction(content):
        return INSTRUCTION, ""
    if claims_authority(content):
        return AUTHORITY, ""
    if about_other_person(content):
        return OTHER_PERSON, ""
    if op.category not in CATEGORIES or (
        op.category in SENSITIVE_CATEGORIES and op.category not in opted_in
    ):
        return DISALLOWED_CATEGORY, str(op.category)
    return None


def _target_key(op: MemoryOp, existing: Mapping[str, Existing]) -> str | None:
    """The key the op writes: an update names an existing key; an insert may land on one."""
    if op.action == "update":
        return op.key if op.key is not None and op.key in existing else None
    key = canonical_key(op)
    if key in existing:
        return key
    fact = normalise_fact(op.content)
    # The same fact already stored under another key is that key, not a second copy.
    for other, memory in existing.items():
        if normalise_fact(memory.content) == fact:
            return other
    return key


def check_ops(
    ops: MemoryOps,
    *,
    existing: Mapping[str, Existing],
    tombstones: Collection[Tombstone],
    opted_in: frozenset[str] = frozenset(),
    max_chars: int = MAX_CHARS,
    evidence: Collection[str] | None = None,
) -> list[Verdict]:
    """Check a batch in order; each accepted op is seen by the later ones, one write per key.

    When two accepted ops target the same key the later wins and the earlier is marked
    duplicate. The later one is checked against the earlier as if it were stored, so an
    inferred op cannot displace a fact stated earlier in the same batch.
    """
    view = dict(existing)
    verdicts: list[Verdict] = []
    writer_of: dict[str, int] = {}
    for op in ops.ops:
        verdict = check_op(
            op,
            existing=view,
            tombstones=tombstones,
            opted_in=opted_in,
            max_chars=max_chars,
            evidence=evidence,
        )
        if verdict.accepted and verdict.key is not None:
            earlier = writer_of.get(verdict.key)
            if earlier is not None:
                superseded = replace(
                    verdicts[earlier], accepted=False, reason=DUPLICATE, detail="superseded"
                )
                verdicts[earlier] = superseded
            writer_of[verdict.key] = len(verdicts)
            view[verdict.key] = Existing(key=verdict.key, content=op.content, stated=op.stated)
        verdicts.append(verdict)
    return verdicts
