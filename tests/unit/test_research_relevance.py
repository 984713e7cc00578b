"""Research's relevance check: per-claim verdicts bounded and matched in code, the honest not-answered report."""

from __future__ import annotations

from typing import Any

from deepagents.backends.utils import create_file_data
from langchain_core.exceptions import OutputParserException
from langchain_core.runnables import RunnableLambda
from langgraph.runtime import Runtime

from graphs.core.context import Context
from graphs.core.settings import Settings
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research.citations import (
    NOT_ANSWERED,
    RELEVANCE_UNCHECKED,
    check_report,
    claim_lines,
)
from graphs.research.files import REPORT_PATH
from graphs.research.graph import (
    Critique,
    Models,
    ResearchDeps,
    ResearchTools,
    check_citations,
    finalize,
)
from graphs.research.offline import relevance_verdicts
from graphs.research.relevance import (
    CONFLICTING,
    MAX_VERDICTS,
    NO_VERDICT,
    NOT_PASSING,
    UNCHECKED,
    Verdict,
    check_summary,
    judge,
)
from graphs.tools.fetch import Fetcher
from graphs.tools.fetchlog import MemoryFetchLog, new_record
from graphs.tools.search import LocalCorpus
from tests.fakes import ScriptedChatModel

LISBON = "What is the best way to get from Lisbon airport to the city centre?"
BEES = "https://example.org/pollinators"
BEES_PAGE = (
    "Managed honeybees are the best-known pollinators, but wild bees, flies, butterflies, "
    "beetles and birds also pollinate crops."
)
BEES_CLAIM = (
    '- Honeybees are the best-known pollinators ["Managed honeybees are the best-known '
    f'pollinators"]({BEES})'
)
TRAIN = "https://example.org/lisbon-metro"
TRAIN_PAGE = "The red metro line runs from Lisbon airport to the city centre in about 20 minutes."
TRAIN_CLAIM = (
    '- The metro takes about 20 minutes ["The red metro line runs from Lisbon airport to the city '
    f'centre in about 20 minutes"]({TRAIN})'
)
INVENTED = (
    '- The airport has a tram ["a tram leaves the airport every minute"](https://never.example/)'
)


async def fetched_log() -> MemoryFetchLog:
    log = MemoryFetchLog()
    for url, title, page in (
        (BEES, "Why pollinators matter", BEES_PAGE),
        (TRAIN, "Lisbon metro", TRAIN_PAGE),
    ):
        record = new_record(
            thread_id="t1", url=url, final_url=url, status=200, title=title, content=page
        )
        await log.record(record)
    return log


def deps_for(critic: ScriptedChatModel, log: MemoryFetchLog) -> ResearchDeps:
    corpus = LocalCorpus(SAMPLE_CORPUS_DIR)
    tools = ResearchTools(search=corpus, fetcher=Fetcher(log=log, openers={}))
    return ResearchDeps.of(Models(critic, critic, critic, critic), tools, Settings())


def draft(*claims: str) -> dict[str, Any]:
    report = "# Getting into Lisbon\n\n" + "\n".join(claims) + "\n"
    return {
        "question": LISBON,
        "todos": [{"content": "Lisbon airport to city centre", "status": "completed"}],
        "files": {REPORT_PATH: dict(create_file_data(report))},
        "critique_round": 0,
    }


def runtime() -> Runtime[Context]:
    return Runtime(context=Context(user_id="alice", thread_id="t1", memory=False), store=None)


class GarbledCritic(ScriptedChatModel):
    """A critic whose structured answer never parses."""

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
        def garbled(_input: Any) -> Any:
            raise OutputParserException("Invalid json output: {{{")

        return RunnableLambda(garbled)


async def check_and_finalize(
    state: dict[str, Any], critique: Critique | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    log = await fetched_log()
    critic = GarbledCritic() if critique is None else ScriptedChatModel(structured=[critique])
    deps = deps_for(critic, log)
    checked = await check_citations(state, runtime(), deps=deps)
    done = await finalize({**state, **checked}, runtime(), deps=deps)
    return checked, done


async def test_a_quote_that_exists_but_answers_another_question_is_not_an_answer() -> None:
    off_topic = Verdict(claim=1, answers_question=False, reason="about pollinators")
    checked, done = await check_and_finalize(draft(BEES_CLAIM), Critique(verdicts=[off_topic]))

    [verification] = checked["verifications"]
    assert (verification["citations"], verification["passing"]) == (1, 1)
    assert verification["relevant_passing"] == 0
    assert check_summary(verification)[:2] == [
        "Round 0: 1 of 1 citations pass the check.",
        "0 of the 1 passing citations cite a passage that answers the question.",
    ]
    assert any("off-topic: about pollinators" in u for u in checked["unsupported"])

    report = done["report"]
    body = [ln for ln in report.splitlines() if ln.strip() and not ln.startswith("#")]
    assert body[0] == NOT_ANSWERED  # said first, plainly
    assert "## Sources searched" in report
    assert "- Searched the sample corpus for: Lisbon airport to city centre" in report
    assert f"- Read: Why pollinators matter (`{BEES}`)" in report
    assert "best-known pollinators" not in report
    assert done["answered"] is False
    assert done["metrics"]["answered"] is False
    assert [item.split(" — ")[1] for item in done["off_topic"]] == ["off-topic: about pollinators"]
    assert done["not_verified"] == []
    assert claim_lines(report) == []  # the notice and the searched list are no claims
    assert check_report(report, await (await fetched_log()).for_thread("t1")).ok


async def test_a_report_keeps_the_claims_that_answer_and_drops_the_rest() -> None:
    verdicts = [
        Verdict(claim=1, answers_question=True),
        Verdict(claim=2, answers_question=False, reason="about bees"),
    ]
    state = draft(
        TRAIN_CLAIM, BEES_CLAIM, NOT_ANSWERED
    )  # a notice the writer had no business writing
    checked, done = await check_and_finalize(state, Critique(verdicts=verdicts))

    assert checked["verifications"][0]["relevant_passing"] == 1
    assert done["answered"] is True
    assert "20 minutes" in done["report"]
    assert "pollinators" not in done["report"]
    assert NOT_ANSWERED not in done["report"]
    assert len(done["off_topic"]) == 1


async def test_verdicts_for_claims_that_do_not_exist_conflict_or_are_missing_count_for_nothing() -> (
    None
):
    result = check_report(
        f"# R\n\n{TRAIN_CLAIM}\n{BEES_CLAIM}\n{INVENTED}\n",
        await (await fetched_log()).for_thread("t1"),
    )
    verdicts = [
        Verdict(claim=0, answers_question=True),
        Verdict(claim=4, answers_question=True),
        Verdict(claim=99, answers_question=True),
        Verdict(claim=1, answers_question=True),
        Verdict(claim=1, answers_question=False),
        Verdict(claim=3, answers_question=True),  # the invented claim
    ]

    judged = judge(result.claims, verdicts)

    assert [(r["relevant"], r["reason"]) for r in judged] == [
        (False, CONFLICTING),
        (False, NO_VERDICT),
        (False, NOT_PASSING),
    ]


async def test_a_flood_of_verdicts_is_cut_before_it_is_read() -> None:
    result = check_report(
        f"# R\n\n{TRAIN_CLAIM}\n{BEES_CLAIM}\n", await (await fetched_log()).for_thread("t1")
    )
    flood = [Verdict(claim=1, answers_question=True)] * MAX_VERDICTS
    judged = judge(result.claims, [*flood, Verdict(claim=2, answers_question=True)])
    assert [r["relevant"] for r in judged] == [True, False]


async def test_an_unusable_critic_counts_no_claim_as_an_answer_and_says_it_could_not_check() -> (
    None
):
    checked, done = await check_and_finalize(draft(TRAIN_CLAIM), None)

    [verification] = checked["verifications"]
    assert verification["relevance_checked"] is False
    assert verification["relevance"][0]["reason"] == UNCHECKED
    assert checked["unsupported"] == []  # a failed reading sends no claim back to be redone
    assert "could not be checked" in check_summary(verification)[1]
    assert RELEVANCE_UNCHECKED in done["report"]
    assert "20 minutes" not in done["report"]
    assert done["answered"] is False


async def test_no_draft_means_no_report_not_a_claim_that_the_sources_miss_the_question() -> None:
    state = {**draft(), "files": {}}
    _checked, done = await check_and_finalize(state, Critique())
    assert done["report"] == ""
    assert "could not verify" in done["messages"][-1].text


def claims_message(question: str, topics: list[str], claims: list[str]) -> str:
    listing = "\n".join(f"- {t}" for t in topics)
    numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(claims, 1))
    return (
        f"<question>\n{question}\n</question>\n\n<topics>\n{listing}\n</topics>\n\n"
        f"<claims>\n{numbered}\n</claims>"
    )


def test_the_offline_critic_judges_relevance_by_the_question_and_topic_words() -> None:
    question = "When did the seed vault open and how do honeybees share the location of food?"
    topics = ["When did the seed vault open", "how do honeybees share the location of food"]
    claims = [
        'According to The Svalbard Global Seed Vault, it opened in 2008 "The Svalbard Global '
        'Seed Vault opened on 26 February 2008"',
        "According to How honeybees share the location of food, the waggle run points the way",
        'According to Why pollinators matter to farming, honeybees are the best-known pollinators "x"',
    ]
    verdicts = relevance_verdicts(claims_message(question, topics, claims), 0.5)
    assert [(v["claim"], v["answers_question"]) for v in verdicts] == [
        (1, True),
        (2, True),
        (3, False),
    ]

    lisbon = relevance_verdicts(claims_message(LISBON, [LISBON], claims[2:]), 0.5)
    assert [v["answers_question"] for v in lisbon] == [False]
