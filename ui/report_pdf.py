"""The research report as a PDF: headings, claims with their quoted excerpts, each source a live link."""

from __future__ import annotations

import re
import unicodedata

from fpdf import FPDF
from fpdf.enums import WrapMode

from graphs.research.citations import CITATION

_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*)$")
_ASCII = str.maketrans(
    {
        "‘": "'",
        "’": "'",
        "“": '"',
        "”": '"',
        "–": "-",
        "—": "-",
        "−": "-",
        "…": "...",
        "\u00a0": " ",
    }
)
_SIZES = {1: 16, 2: 13, 3: 12}


def latin1(text: str) -> str:
    """The PDF core fonts speak Latin-1: typography folded, anything else approximated."""
    text = unicodedata.normalize("NFKC", text).translate(_ASCII)
    return text.encode("latin-1", errors="replace").decode("latin-1")


def report_pdf(markdown: str, *, title: str = "Research report") -> bytes:
    pdf = FPDF()
    pdf.set_title(latin1(title))
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    for line in markdown.splitlines():
        if not line.strip():
            pdf.ln(2)
            continue
        if heading := _HEADING.match(line):
            pdf.set_font("Helvetica", "B", _SIZES.get(len(heading[1]), 11))
            _block(pdf, heading[2], height=8)
            continue
        _claim(pdf, line)
    return bytes(pdf.output())


def _claim(pdf: FPDF, line: str) -> None:
    sources = [m["url"] for m in CITATION.finditer(line)]
    text = CITATION.sub(lambda m: f'"{m["quote"]}" [{sources.index(m["url"]) + 1}]', line)
    pdf.set_font("Helvetica", size=10)
    _block(pdf, re.sub(r"^\s*[-*+]\s+", "- ", text), height=5)
    pdf.set_font("Helvetica", "U", 8)
    pdf.set_text_color(30, 70, 160)
    for i, url in enumerate(dict.fromkeys(sources), 1):
        _block(pdf, f"[{i}] {url}", height=4, link=url)
    pdf.set_text_color(0, 0, 0)


def _block(pdf: FPDF, text: str, *, height: float, link: str = "") -> None:
    pdf.multi_cell(
        0, height, latin1(text), new_x="LMARGIN", new_y="NEXT", wrapmode=WrapMode.CHAR, link=link
    )
