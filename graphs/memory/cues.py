"""A fact's "when this matters" cue: the situations it bears on, embedded beside the fact itself.

Why (measured with `make eval`, MiniLM, tuning split): a request rarely shares words or meaning
with the fact that should shape the answer. "Give me a recipe for brownies" scores about 0.1
against "User has coeliac disease"; "Plan my long run" against "User had Achilles tendon pain"
much the same. No threshold separates those from noise, and a lexical (full-text or trigram)
score cannot either: the two texts share no word. What links them is the situation: a food
constraint matters whenever food is prepared, ordered or bought; an injury whenever exercise
is planned; a child whenever a gift or an outing is. So each fact is stored with a cue naming
those situations, and recall scores a fact by the closer of its two vectors (content, cue).

The cue is derived by code from the fact's own words, at write time, for every writer (the
memory job, the remember tool, the memory page): a fixed table of situations, never model text,
so it adds no claim about the user and needs no checking beyond the fact's own. A fact no rule
matches gets its content as cue (the same vector: scores as before).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CUE = 400
"""Characters: one short sentence of situations per matching rule, at most a few rules."""


@dataclass(frozen=True)
class Situation:
    """Words in a fact that mark it as mattering in these situations."""

    name: str
    pattern: re.Pattern[str]
    when: str


def _words(*words: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(words) + r")\b", re.IGNORECASE)


SITUATIONS: tuple[Situation, ...] = (
    Situation(
        "food constraint",
        _words(
            "allerg\\w*",
            "intoleran\\w*",
            "coeliac",
            "celiac",
            "gluten",
            "lactose",
            "dairy",
            "peanut",
            "nut-free",
            "nuts",
            "shellfish",
            "seafood",
            "fish",
            "eggs",
            "vegan",
            "vegetarian",
            "pescatarian",
            "diabet\\w*",
            "sugar",
            "spicy",
            "cilantro",
            "cannot eat",
            "can't eat",
            "avoids",
            "dislikes",
        ),
        "Matters for recipes, cooking, baking, meals, breakfast, lunch, dinner, snacks, "
        "desserts, restaurants, ordering food and buying groceries.",
    ),
    Situation(
        "injury",
        _words(
            "injur\\w*",
            "pain",
            "sprain",
            "splints",
            "tendon",
            "knee",
            "ankle",
            "back pain",
            "wrist",
            "surgery",
            "recovering",
        ),
        "Matters for exercise, running, long runs, workouts, training, sport, lifting, "
        "physical activity and ergonomics.",
    ),
    Situation(
        "child",
        _words(
            "son",
            "sons",
            "daughter",
            "daughters",
            "kid",
            "kids",
            "child",
            "children",
            "niece",
            "nephew",
            "twins?",
        ),
        "Matters for gifts, presents, toys, birthdays, parties, family outings and activities "
        "with children.",
    ),
    Situation(
        "partner",
        _words("partner", "wife", "husband", "girlfriend", "boyfriend", "spouse"),
        "Matters for date nights, anniversaries, gifts and evenings together as a couple.",
    ),
    Situation(
        "relative",
        _words("mother", "father", "mum", "mom", "dad", "parents", "sister", "brother"),
        "Matters for family visits, calls, travel to see family and gifts for relatives.",
    ),
    Situation(
        "race",
        _words("marathon", "race", "10k", "running", "runner"),
        "Matters for planning runs, weekly running distance, training plans and race day.",
    ),
    Situation(
        "flying",
        _words("flights?", "seats?", "aisle", "window seat"),
        "Matters for booking flights and planning trips.",
    ),
    Situation(
        "getting around",
        _words(
            "commut\\w*",
            "bus",
            "tram",
            "metro",
            "train",
            "cycles",
            "bike",
            "drives",
            "driving",
            "car",
            "does not drive",
        ),
        "Matters for getting around, directions, journeys, commuting, transport strikes and "
        "weather on the way.",
    ),
    Situation(
        "schedule",
        _words("mornings?", "meetings?", "calls", "stand-up", "on call", "bed early", "shifts"),
        "Matters for scheduling meetings, calls and appointments.",
    ),
    Situation(
        "pet",
        _words("dog", "cat", "cats", "pet", "puppy", "kitten"),
        "Matters for pet care, feeding, walks, vets and the pet's behaviour.",
    ),
    Situation(
        "trip",
        _words("trip", "holiday", "vacation", "conference", "moving to", "travel"),
        "Matters for packing, booking travel and accommodation, documents and planning the trip.",
    ),
    Situation(
        "language",
        _words("learning \\w+ish", "learning \\w+ese", "learning \\w+an\\b", "lessons", "speaks"),
        "Matters for practising, translating, phrases, homework and conversations in that "
        "language.",
    ),
    Situation(
        "drink",
        _words("coffee", "tea", "chai", "espresso", "beer", "wine", "ipa"),
        "Matters for recommending drinks, cafés and bars.",
    ),
    Situation(
        "fan",
        _words("supports", "fan of"),
        "Matters for matches, games, the derby, scores and the league.",
    ),
)


def situations_for(content: str) -> list[Situation]:
    """The situations whose words appear in the fact, in table order."""
    return [s for s in SITUATIONS if s.pattern.search(content)]


def cue_for(content: str) -> str:
    """The text embedded beside the fact: its situations, or the fact itself if none match."""
    whens = [s.when for s in situations_for(content)]
    cue = " ".join(whens)[:MAX_CUE].strip()
    return cue or content
