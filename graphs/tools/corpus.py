"""The local corpus's search index in the store: shared, app-owned documents, never user data.

Its namespace starts with a fixed root instead of a user id; nothing a user or model sends
names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore, SearchItem

CORPUS_NAMESPACE = "research_corpus"


class CorpusIndex:
    def __init__(self, store: BaseStore, corpus: str) -> None:
        self._store = store
        self._namespace = (CORPUS_NAMESPACE, corpus)

    @property
    def searchable(self) -> bool:
        return getattr(self._store, "index_config", None) is not None

    async def search(self, query: str, *, limit: int) -> list[SearchItem]:
        return await self._store.asearch(self._namespace, query=query, limit=limit)

    async def put(self, doc_id: str, value: dict[str, Any]) -> None:
        await self._store.aput(self._namespace, doc_id, value)
