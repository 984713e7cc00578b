"""fetch_url's SSRF guard, its fetch log in Postgres and the local corpus scheme."""

from __future__ import annotations

import httpx
import pytest

from graphs.research import SAMPLE_CORPUS_DIR
from graphs.tools.fetch import Fetcher, FetchError
from graphs.tools.fetchlog import PostgresFetchLog
from graphs.tools.netguard import BlockedAddress, parse_ip_literal
from graphs.tools.search import LocalCorpus

pytestmark = pytest.mark.integration

PUBLIC_IP = "93.184.216.34"
DNS = {
    "localhost": ["127.0.0.1"],
    "public.example": [PUBLIC_IP],
    "internal.example": ["10.0.0.5"],
    "mixed.example": [PUBLIC_IP, "192.168.1.10"],
    "metadata.example": ["169.254.169.254"],
}


async def stub_resolver(host: str) -> list[str]:
    if host not in DNS:
        raise OSError("NXDOMAIN")
    return DNS[host]


class Recorder:
    """A transport standing in for the internet: records which address each request went to."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.text_page = ""
        """What /plain serves as text/plain."""

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/to-private":
            return httpx.Response(302, headers={"location": "http://internal.example/secret"})
        if path == "/to-loopback":
            return httpx.Response(301, headers={"location": "http://127.0.0.1:8080/admin"})
        if path == "/to-file":
            return httpx.Response(302, headers={"location": "file:///etc/passwd"})
        if path == "/loop":
            return httpx.Response(302, headers={"location": "/loop"})
        if path == "/paper.pdf":
            body = (SAMPLE_CORPUS_DIR / "wild-bees.pdf").read_bytes()
            return httpx.Response(200, content=body, headers={"content-type": "application/pdf"})
        if path == "/broken.pdf":
            return httpx.Response(
                200, content=b"%PDF-1.4 garbage", headers={"content-type": "application/pdf"}
            )
        if path == "/binary":
            return httpx.Response(200, content=b"\x00\x01", headers={"content-type": "image/png"})
        if path == "/plain":
            return httpx.Response(200, text=self.text_page, headers={"content-type": "text/plain"})
        if path == "/big":
            return httpx.Response(200, text="x " * 10_000, headers={"content-type": "text/plain"})
        html = (
            "<html><head><title>Public page</title></head><body><article>"
            "<p>The quick brown fox jumps over the lazy dog near the public river bank.</p>"
            "</article></body></html>"
        )
        return httpx.Response(200, text=html, headers={"content-type": "text/html; charset=utf-8"})


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def fetcher(persistence, recorder) -> Fetcher:
    corpus = LocalCorpus(SAMPLE_CORPUS_DIR)
    return Fetcher(
        log=PostgresFetchLog(persistence.pool),
        resolver=stub_resolver,
        transport=httpx.MockTransport(recorder.handler),
        openers={"corpus": corpus.open},
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost:8000/",
        "http://169.254.169.254/latest/meta-data/",
        "http://metadata.example/",
        "http://0x7f000001/",
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://internal.example/",
        "http://mixed.example/",
        "file:///etc/passwd",
        "ftp://public.example/x",
        "gopher://public.example/",
        "http://public.example/to-private",
        "http://public.example/to-loopback",
        "http://public.example/to-file",
        "http://public.example/loop",
    ],
)
async def test_non_public_targets_are_refused_and_logged(fetcher, recorder, url, persistence):
    with pytest.raises(BlockedAddress):
        await fetcher.fetch(url, thread_id="t-ssrf")
    # No request ever reached a non-public address.
    for request in recorder.requests:
        assert request.url.host == PUBLIC_IP
    records = await fetcher.log.for_thread("t-ssrf")
    assert records[-1].status == 0
    assert records[-1].error
    assert "refused" in records[-1].error


def test_numeric_host_forms_decode_to_the_address_a_resolver_would_use():
    assert str(parse_ip_literal("0x7f000001")) == "127.0.0.1"
    assert str(parse_ip_literal("2130706433")) == "127.0.0.1"
    assert str(parse_ip_literal("0177.0.0.1")) == "127.0.0.1"
    assert str(parse_ip_literal("127.1")) == "127.0.0.1"
    assert parse_ip_literal("public.example") is None


async def test_public_page_is_fetched_pinned_extracted_and_logged(fetcher, recorder):
    record = await fetcher.fetch("http://Public.Example/page#frag", thread_id="t-ok")
    request = recorder.requests[-1]
    assert request.url.host == PUBLIC_IP  # connected to the vetted address ...
    assert request.headers["host"] == "public.example"  # ... for the name that was asked
    assert record.ok
    assert record.id > 0
    assert record.url == "http://public.example/page"
    assert "quick brown fox" in record.content
    assert record.title == "Public page"
    stored = await fetcher.log.for_thread("t-ok")
    assert [r.id for r in stored] == [record.id]
    assert stored[0].content == record.content
    assert stored[0].content_hash == record.content_hash
    assert await fetcher.log.for_thread("someone-elses-thread") == []


async def test_cache_reuses_a_recent_fetch_but_still_logs_it_for_each_thread(fetcher, recorder):
    await fetcher.fetch("http://public.example/cached", thread_id="t-a")
    before = len(recorder.requests)
    again = await fetcher.fetch("http://PUBLIC.example/cached", thread_id="t-b")
    assert len(recorder.requests) == before
    assert [r.id for r in await fetcher.log.for_thread("t-b")] == [again.id]


async def test_response_size_is_capped(fetcher):
    fetcher.max_bytes = 1000
    record = await fetcher.fetch("http://public.example/big", thread_id="t-big")
    assert len(record.content) <= 1000


async def test_unknown_host_is_a_clear_error(fetcher):
    with pytest.raises(BlockedAddress, match="could not resolve"):
        await fetcher.fetch("http://nowhere.example/", thread_id="t-x")


async def test_corpus_documents_are_served_by_the_provider_and_logged(fetcher):
    record = await fetcher.fetch("corpus://sample/seed-vault-overview.md", thread_id="t-c")
    assert record.ok
    assert "26 February 2008" in record.content
    with pytest.raises(FetchError):
        await fetcher.fetch("corpus://sample/../../etc/passwd", thread_id="t-c")


async def test_pdfs_are_read_as_text_and_other_types_refused(fetcher):
    record = await fetcher.fetch("https://public.example/paper.pdf", thread_id="t-pdf")
    assert record.title == "Wild bees beyond the honeybee"
    assert "20,000 known species of bees" in record.content
    with pytest.raises(FetchError, match="PDF"):
        await fetcher.fetch("https://public.example/broken.pdf", thread_id="t-pdf")
    with pytest.raises(FetchError, match="unsupported content type"):
        await fetcher.fetch("https://public.example/binary", thread_id="t-pdf")


@pytest.mark.parametrize(
    "url", ["http://public.example/a\x00b", "http://pub\x00lic.example/", "corpus://sample/\x00"]
)
async def test_a_url_with_control_characters_is_refused_and_logged(fetcher, recorder, url):
    with pytest.raises(BlockedAddress, match="control characters"):
        await fetcher.fetch(url, thread_id="t-nul")
    logged = (await fetcher.log.for_thread("t-nul"))[-1]
    assert logged.error == "refused: the URL holds control characters"
    assert "\x00" not in logged.url
    assert recorder.requests == []


async def test_a_page_with_control_characters_is_logged_without_them(fetcher, recorder):
    recorder.text_page = "The vault\x00 opened in 2008 \x1b[0m on Svalbard island for seeds."
    record = await fetcher.fetch("http://public.example/plain", thread_id="t-nul-page")
    assert "\x00" not in record.content
    assert "opened in 2008" in record.content
