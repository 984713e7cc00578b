"""What a fact is for: the situations a request asks about, and the words that mark a fact as bearing on them.

Why (measured with `make eval`, MiniLM, tuning split; figures in graphs.memory.recall): a request
rarely shares words or meaning with the fact that should shape the answer. "Give me a recipe for
brownies" scores about 0.1 against "User has coeliac disease", "Plan my long run" against "User
had Achilles tendon pain" about the same, and no threshold separates those from noise. A lexical
score (full-text or trigram) cannot either: the two texts share no word. What links them is the
situation: a food constraint matters whenever food is cooked, ordered or bought; an injury
whenever exercise is planned; a child whenever a gift or an outing is.

So recall finds the situations a message asks about (its words, below), and in the same query
(graphs.core.store) every fact whose words mark it for one of them scores a fixed boost more.
The facts' side is matched in Postgres at recall time, not stored at write time: nothing to
backfill, no second vector per fact, and a change to this table applies to every stored fact.

Tried and measured against this (tuning split, best point of each with no "nothing relevant"
query answered): a "when this matters" sentence per situation embedded beside each fact as a
second vector, scored by the closer vector: precision 0.81 / recall 0.76; that sentence plus
this boost: 0.84 / 0.85; this boost alone: 0.86 / 0.86, with one vector per fact.

Both sides are fixed tables, never model text, so nothing here adds a claim about the user. The
table was grown from the tuning split's misses: read the held-out split's figures, not the
tuning split's, for what it does on new users.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Situation:
    """Words in a fact that make it matter, and words in a request that call for it."""

    name: str
    fact: str
    """Whole words or phrases, as alternatives of a regular expression that Python and Postgres
    read alike (no `\\b`: Postgres spells a word boundary `\\y`)."""
    request: str
    """The same, in a message."""

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
        fact=(r"son|sons|daughter|daughters|kid|kids|child|children|niece|nephew|twins?"),
        request=(
            r"gifts?|presents?|birthday|toys?|party|kid|kids|child|children|boy|boys|girl|girls|"
            r"son|daughter|nine year old|family"
        ),
    ),
    Situation(
        "partner",
        fact=(r"partner|wife|husband|girlfriend|boyfriend|spouse"),
        request=(r"date|anniversary|romantic|together|couple|partner|wife|husband"),
    ),
    Situation(
        "relative",
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
)


def situations_for(content: str) -> list[Situation]:
    """The situations a fact's words mark it as bearing on, in table order."""
    return [s for s in SITUATIONS if s.in_fact(content)]


def request_situations(text: str) -> list[Situation]:
    """The situations a message asks about."""
    return [s for s in SITUATIONS if s.in_request(text)]


def fact_pattern(situations: list[Situation]) -> str | None:
    """One case-insensitive regular expression (Postgres `~*`) for facts bearing on any of them.

    `\\y` is Postgres's word boundary (its `\\b` is a backspace); the words are written so that
    Python's and Postgres's regular expressions read them alike."""
    words = "|".join(s.fact for s in situations)
    return r"\y(?:" + words + r")\y" if words else None
