"""The report's PDF copy keeps every claim, quote and source link."""

from __future__ import annotations

import io

from pypdf import PdfReader

from ui.report_pdf import latin1, report_pdf

SOURCE = "http://localhost:8000/research/corpus/sample/seed-vault-overview.md"


def test_pdf_has_the_claims_quotes_and_clickable_sources():
    report = (
        "# Seed vault\n\n## Opening\n\n"
        f"- It opened in 2008 [“The Svalbard Global Seed Vault opened on 26 February 2008”]({SOURCE})\n"
    )
    reader = PdfReader(io.BytesIO(report_pdf(report, title="Seed vault")))
    text = reader.pages[0].extract_text()
    assert "Seed vault" in text
    assert '"The Svalbard Global Seed Vault opened on 26 February 2008" [1]' in text
    links = [a.get_object()["/A"]["/URI"] for a in reader.pages[0]["/Annots"]]
    assert links == [SOURCE]
    assert reader.metadata.title == "Seed vault"


def test_text_outside_latin1_is_approximated_not_an_error():
    assert latin1("“quote” — 18 °C … 日本") == '"quote" - 18 °C ... ??'
