"""graphs.core.store on a real Postgres: exact reads give the library store's own answers."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from langgraph.store.base import GetOp, PutOp, SearchOp
from langgraph.store.postgres.aio import AsyncPostgresStore

from graphs.core.persistence import Persistence
from graphs.core.store import PipelinedStore

pytestmark = pytest.mark.integration

FACTS = {
    "diet": "User is vegetarian",
    "city": "User lives in Bengaluru",
    "manager": "User's manager is Priya",
    "sport": "User plays badminton on weekends",
    "pet": "User has a dog named Kofi",
}


@pytest.fixture(scope="module")
async def seeded(persistence: Persistence) -> Persistence:
    store = persistence.store
    for user in ("st-ann", "st-ann%2Ex", "st-bob"):
        for key, content in FACTS.items():
            await store.aput(("memories", user, "facts"), key, {"content": f"{content} ({user})"})
        await store.aput(("memories", user, "profile"), "name", {"content": f"Name {user}"})
        await store.aput(("memories", user, "settings"), "prefs", {"enabled": True}, index=False)
    # Beneath ann's facts namespace: the store's prefix search finds it, an exact read must not.
    await store.aput(("memories", "st-ann", "facts", "deeper"), "x", {"content": "User is vegan"})
    return persistence


def reads(user: str, query: str) -> list[Any]:
    return [
        GetOp(("memories", user, "settings"), "prefs", refresh_ttl=False),
        GetOp(("memories", user, "settings"), "missing", refresh_ttl=False),
        SearchOp(("memories", user, "profile"), limit=20, refresh_ttl=False),
        SearchOp(("memories", user, "facts"), query=query, limit=3, refresh_ttl=False),
    ]


def plain_store(persistence: Persistence) -> AsyncPostgresStore:
    """The library's store on the same tables, as the reference for every answer."""
    reference = AsyncPostgresStore(
        persistence.pool,  # type: ignore[arg-type]
        ttl={"refresh_on_read": False},
        index=persistence.store.index_config,  # type: ignore[arg-type]
    )
    reference.embeddings = persistence.store.embeddings
    return reference


def summary(results: list[Any]) -> list[Any]:
    out: list[Any] = []
    for result in results:
        if isinstance(result, list):
            out.append([(i.namespace, i.key, i.value, round(i.score or 0.0, 5)) for i in result])
        else:
            out.append(None if result is None else (result.namespace, result.key, result.value))
    return out


async def test_exact_reads_answer_as_the_library_store_for_leaf_namespaces(
    seeded: Persistence,
) -> None:
    store = seeded.store
    assert isinstance(store, PipelinedStore)
    for user in ("st-ann%2Ex", "st-bob"):
        for query in ("what should I cook tonight?", "who do I report to", "weekend plans"):
            ops = reads(user, query)
            got = await store.aread_exact(ops)
            expected = await plain_store(seeded).abatch(ops)
            assert summary(got) == summary(expected), (user, query)


async def test_exact_reads_stay_inside_the_users_own_namespace(seeded: Persistence) -> None:
    store = seeded.store
    assert isinstance(store, PipelinedStore)
    got = await store.aread_exact(reads("st-ann", "is the user vegan or vegetarian?"))

    profile, facts = got[2], got[3]
    namespaces = {item.namespace for item in [*profile, *facts]}
    assert namespaces <= {("memories", "st-ann", "profile"), ("memories", "st-ann", "facts")}
    assert all("(st-ann)" in item.value["content"] for item in facts)
    # The library's prefix search would also have matched the child namespace.
    loose = await store.asearch(("memories", "st-ann", "facts"), query="User is vegan", limit=10)
    assert ("memories", "st-ann", "facts", "deeper") in {item.namespace for item in loose}


async def test_exact_reads_refuse_filters(seeded: Persistence) -> None:
    store = seeded.store
    assert isinstance(store, PipelinedStore)
    with pytest.raises(ValueError, match="filters"):
        await store.aread_exact([SearchOp(("memories", "st-bob", "facts"), filter={"a": 1})])


async def test_a_batch_that_writes_takes_the_library_path(seeded: Persistence) -> None:
    store = seeded.store
    namespace = ("memories", "st-writer", "facts")
    results = await store.abatch(
        [
            PutOp(namespace, "k", {"content": "User is left-handed"}),
            GetOp(namespace, "k", refresh_ttl=False),
        ]
    )
    assert results[0] is None
    found = await store.aread_exact([GetOp(namespace, "k", refresh_ttl=False)])
    assert found[0] is not None
    assert found[0].value["content"] == "User is left-handed"


class PlainLists(Embeddings):
    """Vectors as plain lists of floats, as an OpenAI-compatible embedding client returns."""

    def __init__(self, inner: Embeddings) -> None:
        self.inner = inner

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in v] for v in self.inner.embed_documents(texts)]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


async def test_exact_search_takes_plain_float_vectors(seeded: Persistence) -> None:
    index = dict(seeded.store.index_config or {})
    store = PipelinedStore(
        seeded.pool,  # type: ignore[arg-type]
        ttl={"refresh_on_read": False},
        index={
            "dims": index["dims"],
            "embed": PlainLists(seeded.store.embeddings),  # type: ignore[arg-type]
            "fields": ["content"],
            "distance_type": "cosine",
        },
    )
    ops = reads("st-bob", "what should I cook tonight?")

    got = await store.aread_exact(ops)

    assert summary(got) == summary(await plain_store(seeded).abatch(ops))
    assert got[3][0].key == "diet"


async def test_each_boost_adds_exactly_its_share_and_words_outrank_category(
    persistence: Persistence,
) -> None:
    store = persistence.store
    assert isinstance(store, PipelinedStore)
    namespace = ("memories", "st-boosts", "facts")
    facts = {
        # The situation pattern matches its words; its category matches too, but words win.
        "words": ("User cannot eat gluten", "health"),
        # Only the category matches the pattern's situation.
        "category": ("User has Crohn's disease", "health"),
        # Shares the stem "lesson" with the message, nothing else.
        "lexical": ("User takes violin lessons", "preference"),
        "none": ("User lives in Oslo", "fact"),
    }
    for key, (content, category) in facts.items():
        await store.aput(namespace, key, {"content": content, "category": category})
    message = "Plan dinner after my lesson"
    search = [SearchOp(namespace, query=message, limit=10, refresh_ttl=False)]

    def scores(results: list[Any]) -> dict[str, float]:
        return {item.key: item.score for item in results[0]}

    plain = scores(await store.aread_exact(search))
    boosted = scores(
        await store.aread_exact(
            search,
            boost_pattern=r"\y(?:gluten)\y",
            boost=0.25,
            boost_categories=["health"],
            category_boost=0.15,
            lexical_boost=0.05,
        )
    )

    added = {key: round(boosted[key] - plain[key], 6) for key in facts}
    assert added == {"words": 0.25, "category": 0.15, "lexical": 0.05, "none": 0.0}


async def test_a_message_of_stop_words_only_boosts_nothing_lexically(
    persistence: Persistence,
) -> None:
    store = persistence.store
    assert isinstance(store, PipelinedStore)
    namespace = ("memories", "st-stopwords", "facts")
    await store.aput(namespace, "k", {"content": "User is what they are", "category": "fact"})
    search = [SearchOp(namespace, query="what are they", limit=10, refresh_ttl=False)]

    plain = await store.aread_exact(search)
    lexical = await store.aread_exact(search, lexical_boost=0.05)

    assert plain[0][0].score == pytest.approx(lexical[0][0].score)


async def test_a_short_page_is_the_head_of_the_long_one_with_every_boost(
    persistence: Persistence,
) -> None:
    # The lexical boost is computed only for facts it could lift into the page: any page must
    # still be the head of the full ranking.
    store = persistence.store
    assert isinstance(store, PipelinedStore)
    namespace = ("memories", "st-pages", "facts")
    contents = [
        "User cannot eat gluten",
        "User bakes bread at the weekend",
        "User has a dinner club on Fridays",
        "User takes violin lessons",
        "User's lesson plans are due on Monday",
        "User lives in Oslo",
        "User cooks dinner for two",
        "User is learning to cook Thai food",
    ]
    for i, content in enumerate(contents):
        await store.aput(namespace, f"k{i}", {"content": content, "category": "preference"})
    boosts: dict[str, Any] = {
        "boost_pattern": r"\y(?:gluten|bakes)\y",
        "boost": 0.25,
        "boost_categories": ["preference"],
        "category_boost": 0.0,
        "lexical_boost": 0.05,
    }

    for message in ("Plan dinner after my lesson", "bread for a dinner club", "cook"):
        whole = await store.aread_exact(
            [SearchOp(namespace, query=message, limit=20, refresh_ttl=False)], **boosts
        )
        ranking = [(i.key, round(i.score or 0.0, 6)) for i in whole[0]]
        for limit in range(1, len(contents) + 1):
            for offset in (0, 2):
                page = await store.aread_exact(
                    [
                        SearchOp(
                            namespace, query=message, limit=limit, offset=offset, refresh_ttl=False
                        )
                    ],
                    **boosts,
                )
                got = [(i.key, round(i.score or 0.0, 6)) for i in page[0]]
                assert got == ranking[offset : offset + limit], (message, limit, offset)


async def test_a_fenced_one_row_put_writes_as_the_library_does_with_or_without_a_ttl(
    seeded: Persistence,
) -> None:
    """One row without vectors carries the wipe's check in its statement (fence.fenced_insert):
    what lands is what the library's own put would store, expiry included, and a second put
    of the key updates it."""
    from graphs.core import fence

    store = seeded.store
    namespace = ("memories", "fenced-put-user", "markers")
    with fence.acting_for(fence.Fence.now("fenced-put-user")):
        await store.aput(namespace, "plain", {"due_at": 1.0}, index=False)
        await store.aput(namespace, "plain", {"due_at": 2.0}, index=False)
        await store.aput(namespace, "expiring", {"due_at": 3.0}, index=False, ttl=5.0)
    async with seeded.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT key, value, expires_at IS NOT NULL AS expires, ttl_minutes FROM store "
            "WHERE prefix = %s ORDER BY key",
            (".".join(namespace),),
        )
        rows = await cur.fetchall()
    assert [(r["key"], r["value"], r["expires"], r["ttl_minutes"]) for r in rows] == [
        ("expiring", {"due_at": 3.0}, True, 5.0),
        ("plain", {"due_at": 2.0}, False, None),
    ]
