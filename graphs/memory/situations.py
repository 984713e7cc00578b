"""What a fact is for: the situations a request asks about, and the words that mark a fact as bearing on them.

Why (measured with `make eval`, MiniLM, tuning split; figures in graphs.memory.recall): a request
rarely shares words or meaning with the fact that should shape the answer. "Give me a recipe for
brownies" scores about 0.1 against "User has coeliac disease", "Plan my long run" against "User
had Achilles tendon pain" about the same, and no threshold separates those from noise. A lexical
score (full-text or trigram) cannot either: the two texts share no word. What links them is the
situation: a food constraint matters whenever food is cooked, ordered or bought; an injury
whenever exercise is planned; a child whenever a gift or an outing is.

So recall finds the situations a message asks about (its words, below), and in the same query
(graphs.core.store) every fact whose words mark it for one of them scores a fixed boost more;
a fact whose words the table lacks but whose stored category bears on the situation (a health
fact on food, a relationship fact on a gift: `Situation.categories`) scores a smaller boost.
The facts' side is matched in Postgres at recall time, not stored at write time: nothing to
backfill, no second vector per fact, and a change to this table applies to every stored fact.

Why categories (measured, tuning + held-out v1 splits, graphs.memory.recall): with the words in
the table they change nothing (the words already match), but with the fact-side words of the
food, injury, family and work situations blanked out, as for a new user whose facts use words
nobody listed ("takes warfarin"), the category alone keeps min(precision, recall) at 0.85
instead of 0.77. The writer sets the category and code checks it, so it is never model text
that becomes a pattern.

Tried and measured against this (tuning split, best point of each with no "nothing relevant"
query answered): a "when this matters" sentence per situation embedded beside each fact as a
second vector, scored by the closer vector: precision 0.81 / recall 0.76; that sentence plus
this boost: 0.84 / 0.85; this boost alone: 0.86 / 0.86, with one vector per fact. Issue 15,
second pass (tuning + held-out v1 together): a much broader table written from a taxonomy of
life areas (15 areas, hundreds of words, including weather/outdoor and appliance words on the
request side) scored 0.74 / 0.74: with one flat boost, broad request words boost most of a
user's facts at once and cosine is left to sort them; the same happened with a "weather" area
(0.84 -> 0.81), so it was dropped. What was kept is six narrow areas (medicine, money, work,
learning, listening, power) that scored 0.84 / 0.85 against 0.83 / 0.81 without them.

Both sides are fixed tables, never model text, so nothing here adds a claim about the user. The
first table was grown from the tuning split's misses, the six later areas from domain knowledge
checked on the tuning and held-out v1 splits: read the held-out v2 split's figures, not those,
for what it does on new users.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Boosts:
    """What a fact scores on top of its cosine similarity to the message (zero: plain cosine).

    The defaults, and why, are in graphs.memory.recall (DEFAULT_BOOSTS)."""

    situation: float = 0.0
    """The fact's words bear on a situation the message asks about."""
    category: float = 0.0
    """Else: the fact's stored category does (Situation.categories)."""
    lexical: float = 0.0
    """The fact and the message share a word stem (Postgres full-text lexemes)."""


@dataclass(frozen=True)
class Situation:
    """Words in a fact that make it matter, and words in a request that call for it."""

    name: str
    fact: str
    """Whole words or phrases, as alternatives of a regular expression that Python and Postgres
    read alike (no `\\b`: Postgres spells a word boundary `\\y`)."""
    request: str
    """The same, in a message."""
    categories: tuple[str, ...] = ()
    """Stored categories (graphs.memory.policy.Category, set by the memory writer and checked by
    code) whose facts bear on the situation whatever their words: a health fact on food, a
    relationship fact on a gift. They score the smaller category boost, so a fact the words
    match still ranks first."""

    def in_fact(self, content: str) -> bool:
        return _matches(self.fact, content)

    def in_request(self, text: str) -> bool:
        return _matches(self.request, text)


@cache
def _compiled(alternatives: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + alternatives + r")\b", re.IGNORECASE)


def _matches(alternatives: str, text: str) -> bool:
    return _compiled(alternatives).search(text) is not None


SITUATIONS: tuple[Situation, ...] = (
    Situation(
        "food",
        categories=("health", "religion"),
        fact=(
            r"allerg\w*|intoleran\w*|coeliac|celiac|gluten|lactose|dairy|peanuts?|nut-free|nuts|"
            r"shellfish|seafood|fish|eggs|vegan|vegetarian|pescatarian|diabet\w*|spicy|cilantro|"
            r"cannot eat|can't eat"
        ),
        request=(
            r"recipes?|cook\w*|bak\w*|dinner|lunch|breakfast|brunch|dessert|snacks?|meals?|"
            r"restaurants?|menu|dish|eat|food|groceries|supermarket|pasta|pizza|cake|pancakes|"
            r"sauce|order"
        ),
    ),
    Situation(
        "injury",
        categories=("health",),
        fact=(
            r"injur\w*|pain|sprain\w*|splints|tendon|knee|ankle|back pain|wrist|surgery|"
            r"recovering"
        ),
        request=(
            r"run|runs|running|jog\w*|workout|exercise|gym|training|train|sport|squats?|lift\w*|"
            r"hike|hiking|basketball|football|km|keyboard|typing|furniture|carry"
        ),
    ),
    Situation(
        "child",
        categories=("relationship",),
        fact=(r"son|sons|daughter|daughters|kid|kids|child|children|niece|nephew|twins?"),
        request=(
            r"gifts?|presents?|birthday|toys?|party|kid|kids|child|children|boy|boys|girl|girls|"
            r"son|daughter|nine year old|family"
        ),
    ),
    Situation(
        "partner",
        categories=("relationship",),
        fact=(r"partner|wife|husband|girlfriend|boyfriend|spouse"),
        request=(r"date|anniversary|romantic|together|couple|partner|wife|husband"),
    ),
    Situation(
        "relative",
        categories=("relationship",),
        fact=(r"mother|father|mum|mom|dad|parents|sister|brother"),
        request=(r"mother|father|mum|mom|dad|parents|sister|brother|family|visit"),
    ),
    Situation(
        "race",
        fact=(r"marathon|race|10k|half marathon"),
        request=(r"run|runs|running|km|kilometres|miles|training plan|race|taper"),
    ),
    Situation(
        "flying",
        fact=(r"flights?|aisle|window seats?"),
        request=(r"flight|flights|flying|fly|plane|airport|book me"),
    ),
    Situation(
        "getting around",
        fact=(r"commut\w*|bus|tram|metro|train|cycles|bike|drives|driving|car|does not drive"),
        request=(r"get to|commute|ride|drive|journey|strike|traffic|airport|station|way to"),
    ),
    Situation(
        "schedule",
        fact=(r"mornings?|meetings?|calls|stand-up|on call|bed early|night shifts?"),
        request=(r"meeting|schedule|call|sync|appointment|calendar|move my|evening|tomorrow at"),
    ),
    Situation(
        "pet",
        fact=(
            r"dog|cat|cats|pet|puppy|kitten|beagle|shiba|greyhound|terrier|labrador|retriever|"
            r"poodle|spaniel|collie|husky"
        ),
        request=(r"dog|cat|pet|puppy|kitten|vet|walk"),
    ),
    Situation(
        "drink",
        fact=(r"coffee|tea|chai|espresso|beer|wine|ipa|caffeine"),
        request=(r"drink|drinks|coffee|tea|café|cafe|bar|pub|wine|beer|bottle"),
    ),
    Situation(
        "trip",
        fact=(r"trip|holiday|vacation|conference|moving to"),
        request=(r"pack|trip|travel|holiday|hotel|flight|visa|documents"),
    ),
    Situation(
        "music",
        fact=(r"guitar|piano|saxophone|violin|drums|choir|sings|band|instrument"),
        request=(
            r"songs?|chords|practi[sc]e|sight reading|concert|harmon\w*|music|gig|band|"
            r"sheet music|scales"
        ),
    ),
    Situation(
        "reading",
        fact=(r"novels?|books?|book club|reads"),
        request=(r"novel|book|books|read|reading|author"),
    ),
    Situation(
        "code",
        fact=(
            r"rust|python|kotlin|sql|javascript|typescript|java|backend|frontend|software|"
            r"developer|programm\w*|apps"
        ),
        request=(
            r"code|coding|errors?|bug|compile\w*|function|operator|query|crash\w*|debug\w*|"
            r"coroutine|script|api"
        ),
    ),
    Situation(
        "design",
        fact=(r"figma|typeface|fonts?|designs?|designing|revit|architect\w*"),
        request=(r"layout|components?|fonts?|typeface|design|floor plan|mockup|prototype"),
    ),
    Situation(
        "garden",
        fact=(r"garden\w*|plants?|succulents|grows|balcony"),
        request=(r"plants?|leaves|watering|overwatering|garden|soil|seeds|pots?"),
    ),
    Situation(
        "baking",
        fact=(r"sourdough|bakes|bread|baking"),
        request=(r"starter|dough|bread|bake|baking|flour|oven"),
    ),
    Situation(
        "board game",
        fact=(r"chess|plays go|go online"),
        request=(r"opening|board|strategy|chess|checkmate|19x19"),
    ),
    Situation(
        "car",
        fact=(r"drives an?|car"),
        request=(r"car|brakes?|engine|tyres?|tires?|mechanic|charge|charging|petrol|fuel"),
    ),
    # Everyday areas added from domain knowledge, not from a miss: each is a kind of request
    # and the kind of fact that changes its answer.
    Situation(
        "medicine",
        categories=("health",),
        fact=(r"allerg\w*|takes|medication|diabet\w*|asthma|pregnan\w*|blood pressure"),
        request=(
            r"medicines?|medication|pills?|tablets?|painkillers?|antibiotics?|prescri\w*|"
            r"pharmacy|doctor|dentist|vaccin\w*|symptoms?|headache|fever|flu|cough|sore throat"
        ),
    ),
    Situation(
        "money",
        categories=("finance_sensitive",),
        fact=(r"sav\w*|budget|pension|loan|debt|mortgage|afford"),
        request=(
            r"buy|buying|afford|budget|cheap\w*|expensive|price|cost|spend\w*|saving|"
            r"invest\w*|loan|mortgage|money|worth it"
        ),
    ),
    Situation(
        "work",
        categories=("work",),
        fact=(
            r"startup|company|founded|employees|team|clients?|investors?|project|colleagues|"
            r"manager|job|works? (?:as|at|on)"
        ),
        request=(
            r"draft|email|report|presentation|slides|pitch|deck|proposal|client|colleague|boss|"
            r"hire|hiring|interview|salary|investors?|vc|meeting notes|status update|"
            r"release notes|deadline"
        ),
    ),
    Situation(
        "learning",
        fact=(r"learning|lessons?|classes|course|studying|student|exam"),
        request=(
            r"homework|class|lesson|course|exam|test|study|studying|translat\w*|vocabulary|"
            r"grammar|pronounc\w*|phrases?|how do I say"
        ),
    ),
    Situation(
        "listening",
        fact=(
            r"music|songs?|singers?|bands?|jazz|blues|vinyl|records|k-pop|pop|hip-hop|rap|rock|"
            r"metal|punk|classical|opera|folk|reggae|afrobeats?|salsa|techno|fado"
        ),
        request=(r"playlist|listen\w*|music|songs?|concert|gig|album|radio|dj|dance|party"),
    ),
    Situation(
        "power",
        fact=(r"power cuts?|generator|solar|off-grid"),
        request=(
            r"fridge|freezer|inverter|appliances?|electricity|power|battery|batteries|solar|"
            r"generator"
        ),
    ),
)


def situations_for(content: str) -> list[Situation]:
    """The situations a fact's words mark it as bearing on, in table order."""
    return [s for s in SITUATIONS if s.in_fact(content)]


def request_situations(text: str) -> list[Situation]:
    """The situations a message asks about."""
    return [s for s in SITUATIONS if s.in_request(text)]


def fact_categories(situations: list[Situation]) -> list[str]:
    """The stored categories whose facts bear on any of them, sorted."""
    return sorted({c for s in situations for c in s.categories})


def fact_pattern(situations: list[Situation]) -> str | None:
    """One case-insensitive regular expression (Postgres `~*`) for facts bearing on any of them.

    `\\y` is Postgres's word boundary (its `\\b` is a backspace); the words are written so that
    Python's and Postgres's regular expressions read them alike."""
    words = "|".join(s.fact for s in situations)
    return r"\y(?:" + words + r")\y" if words else None
