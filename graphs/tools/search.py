"""Search providers behind one interface: the local corpus (offline default), DuckDuckGo, Tavily, SearxNG."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx
from langchain_core.tools import BaseTool, tool

from graphs.core.ratelimit import Bucket
from graphs.tools.corpus import CorpusIndex
from graphs.tools.ratelimit import RateLimited, bucket_for, call_limited

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore

    from graphs.core.settings import Settings

log = logging.getLogger("cairn.search")

CORPUS_SCHEME = "corpus"
CORPUS_SUFFIXES = (".md", ".txt", ".html", ".htm", ".pdf")
WORD_RE = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "how",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "does",
        "do",
        "did",
        "there",
        "many",
        "much",
    ]
)


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    snippet: str


class SearchError(RuntimeError):
    """Search failed; the text is shown to the model so it records a gap."""


class SearchProvider(Protocol):
    name: str

    async def search(self, query: str, *, max_results: int) -> list[SearchResult]: ...


@dataclass(frozen=True)
class CorpusDocument:
    doc_id: str
    title: str
    text: str
    url: str


class LocalCorpus:
    """A folder of Markdown/text/HTML documents, searchable and served as `corpus://<name>/<file>`.

    Documents are reached only through this provider (never by opening a private address),
    so a corpus page goes through the same fetch tool, fetch log and citation check as the web.
    """

    name: str

    def __init__(self, folder: Path, *, name: str = "sample", store: BaseStore | None = None):
        self.name = name
        self.folder = folder
        self._store = store
        self._docs = {doc.url: doc for doc in _load(folder, name)}
        self._indexed = False
        self._index_lock = asyncio.Lock()

    @property
    def documents(self) -> list[CorpusDocument]:
        return list(self._docs.values())

    async def open(self, url: str) -> tuple[str, str]:
        """Title and text of one corpus document; unknown URLs are an error, not a file lookup."""
        doc = self._docs.get(url.strip())
        if doc is None:
            msg = f"no such document in the {self.name} corpus: {url}"
            raise LookupError(msg)
        return doc.title, doc.text

    async def search(self, query: str, *, max_results: int = 5) -> list[SearchResult]:
        ranked = await self._vector_rank(query, max_results)
        if ranked is None:
            ranked = self._lexical_rank(query)[:max_results]
        return [SearchResult(d.title, d.url, _snippet(d.text, query)) for d in ranked]

    async def _vector_rank(self, query: str, limit: int) -> list[CorpusDocument] | None:
        """pgvector ranking through the store's index; None when the store has no index."""
        if self._store is None:
            return None
        index = CorpusIndex(self._store, self.name)
        if not index.searchable:
            return None
        await self._ensure_indexed(index)
        items = await index.search(query, limit=limit)
        docs = [self._docs[i.value["url"]] for i in items if i.value.get("url") in self._docs]
        # Documents sharing no word with the query are noise, however close their vectors are.
        words = _terms(query)
        return [d for d in docs if words & _terms(d.text)]

    async def _ensure_indexed(self, index: CorpusIndex) -> None:
        async with self._index_lock:
            if self._indexed:
                return
            for doc in self._docs.values():
                value = {"content": f"{doc.title}\n{doc.text[:2000]}", "url": doc.url}
                await index.put(doc.doc_id, value)
            self._indexed = True

    def _lexical_rank(self, query: str) -> list[CorpusDocument]:
        words = _terms(query)
        n = len(self._docs) or 1
        df = Counter(w for d in self._docs.values() for w in _terms(d.text) & words)
        scored = []
        for doc in self._docs.values():
            counts = Counter(
                t for w in WORD_RE.findall(f"{doc.title} {doc.text}".lower()) for t in _terms(w)
            )
            score = sum(
                (1 + math.log(counts[w])) * math.log(1 + n / df[w]) for w in words if counts[w]
            )
            if score > 0:
                scored.append((score, doc.doc_id, doc))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [doc for _, _, doc in scored]


def _terms(text: str) -> set[str]:
    """Content words, crudely stemmed so "bee" meets "bees" and "open" meets "opened"."""
    words = (w for w in WORD_RE.findall(text.lower()) if w not in STOPWORDS and len(w) > 2)
    return {re.sub(r"(?:ing|ed|es|s)$", "", w) if len(w) > 4 else w.rstrip("s") for w in words}


def _snippet(text: str, query: str, width: int = 240) -> str:
    words = _terms(query)
    body = " ".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    for sentence in re.split(r"(?<=[.!?])\s+", " ".join(body.split())):
        if words & _terms(sentence):
            return sentence[:width]
    return " ".join(body.split())[:width]


def _load(folder: Path, name: str) -> list[CorpusDocument]:
    docs = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.suffix.lower() not in CORPUS_SUFFIXES or not path.is_file():
            continue
        from graphs.tools.fetch import extract_text

        if path.suffix.lower() == ".pdf":
            title, text = extract_text(path.read_bytes(), "application/pdf")
            docs.append(CorpusDocument(path.stem, title or path.stem, text, _url(name, path)))
            continue
        raw = path.read_text(encoding="utf-8")
        if path.suffix.lower() in (".html", ".htm"):
            title, text = extract_text(raw.encode(), "text/html; charset=utf-8")
        else:
            text = raw
            title = next((ln.lstrip("# ").strip() for ln in raw.splitlines() if ln.strip()), "")
        docs.append(CorpusDocument(path.stem, title or path.stem, text, _url(name, path)))
    return docs


def _url(name: str, path: Path) -> str:
    return f"{CORPUS_SCHEME}://{name}/{path.name}"


class TavilySearch:
    name = "tavily"

    def __init__(self, api_key: str, *, transport: httpx.AsyncBaseTransport | None = None):
        self._key = api_key
        self._transport = transport

    async def search(self, query: str, *, max_results: int = 5) -> list[SearchResult]:
        async with httpx.AsyncClient(transport=self._transport, timeout=20) as client:
            response = await client.post(
                "https://api.tavily.com/search",
                json={"query": query, "max_results": max_results},
                headers={"Authorization": f"Bearer {self._key}"},
            )
        data = _json_or_raise(response)
        return [
            SearchResult(r.get("title", ""), r.get("url", ""), r.get("content", "")[:300])
            for r in data.get("results", [])
        ]


class SearxngSearch:
    name = "searxng"

    def __init__(self, base_url: str, *, transport: httpx.AsyncBaseTransport | None = None):
        self._base = base_url.rstrip("/")
        self._transport = transport

    async def search(self, query: str, *, max_results: int = 5) -> list[SearchResult]:
        async with httpx.AsyncClient(transport=self._transport, timeout=20) as client:
            response = await client.get(
                f"{self._base}/search", params={"q": query, "format": "json"}
            )
        data = _json_or_raise(response)
        return [
            SearchResult(r.get("title", ""), r.get("url", ""), r.get("content", "")[:300])
            for r in data.get("results", [])[:max_results]
        ]


class DdgsSearch:
    """DuckDuckGo through the `ddgs` package (optional; install it to use this provider)."""

    name = "ddgs"

    async def search(self, query: str, *, max_results: int = 5) -> list[SearchResult]:
        try:
            from ddgs import DDGS  # type: ignore[import-not-found]
            from ddgs.exceptions import RatelimitException  # type: ignore[import-not-found]
        except ImportError:
            msg = "the ddgs provider needs the `ddgs` package (pip install ddgs)"
            raise SearchError(msg) from None

        def run() -> list[dict[str, Any]]:
            try:
                return list(DDGS().text(query, max_results=max_results))
            except RatelimitException as exc:
                raise RateLimited(str(exc)) from None

        rows = await asyncio.to_thread(run)
        return [
            SearchResult(r.get("title", ""), r.get("href", ""), r.get("body", "")[:300])
            for r in rows
        ]


def _json_or_raise(response: httpx.Response) -> dict[str, Any]:
    if response.status_code == 429:
        msg = "the search provider is rate limiting us"
        raise RateLimited(msg)
    if response.status_code >= 400:
        msg = f"the search provider answered HTTP {response.status_code}"
        raise SearchError(msg)
    data = response.json()
    if not isinstance(data, dict):
        msg = "the search provider sent an unexpected answer"
        raise SearchError(msg)
    return data


def provider_from_settings(settings: Settings, corpus: LocalCorpus) -> SearchProvider:
    """The configured web provider; the local corpus unless another one is set up."""
    choice = settings.research_search_provider
    if choice == "tavily":
        if settings.tavily_api_key is None:
            msg = "CAIRN_RESEARCH_SEARCH_PROVIDER=tavily needs CAIRN_TAVILY_API_KEY"
            raise ValueError(msg)
        return TavilySearch(settings.tavily_api_key.get_secret_value())
    if choice == "searxng":
        if not settings.searxng_url:
            msg = "CAIRN_RESEARCH_SEARCH_PROVIDER=searxng needs CAIRN_SEARXNG_URL"
            raise ValueError(msg)
        return SearxngSearch(settings.searxng_url)
    if choice == "ddgs":
        return DdgsSearch()
    return corpus


def format_results(results: list[SearchResult]) -> str:
    if not results:
        return "No results. Try other words, or record the topic as a gap."
    lines = []
    for i, r in enumerate(results, 1):
        host = urlsplit(r.url).netloc or r.url
        lines.append(f"{i}. {r.title} ({host})\n   url: {r.url}\n   {r.snippet}")
    return "\n".join(lines)


def search_rate(provider: SearchProvider) -> float:
    """Searches per second a provider is sent (the local sample corpus costs nothing)."""
    return 5.0 if provider.name == "sample" else 1.0


def make_search_tool(provider: SearchProvider, bucket: Bucket | None = None) -> BaseTool:
    """The `web_search` tool over one provider, rate limited by that provider's bucket (shared
    by every worker when it is the Postgres one)."""
    limiter = bucket or bucket_for(provider.name, rate=search_rate(provider))

    @tool
    async def web_search(query: str, max_results: int = 5) -> str:
        """Search for sources on a topic. Returns titles, URLs and short snippets; fetch a URL
        with fetch_url before quoting it.

        Args:
            query: A few keywords describing what you need.
            max_results: How many results to return (1-8).
        """
        query = query.strip()[:300]
        if not query:
            return "Error: the search query is empty."
        count = max(1, min(int(max_results), 8))
        try:
            results = await call_limited(limiter, lambda: provider.search(query, max_results=count))
        except (RateLimited, SearchError, httpx.HTTPError) as exc:
            log.warning("search failed (%s): %s", provider.name, exc)
            return f"Error: search failed ({exc}). Record this as a gap; do not invent sources."
        return format_results(results)

    return web_search
