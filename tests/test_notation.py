"""The notation page (issue 50 item 6): each symbol appears, in math, in the chapter its row names; a symbol's first
row (its first meaning) names the first chapter that has it, a later row ("also: ...") a later meaning's chapter."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
PAGE = BOOK / "notation.md"
ROW = re.compile(r"^\| (.+?) \| (.+) \| \[chapter (\d+)\]\((\S+?)\) \|$", re.M)
MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$]+?)\$|\\\((.+?)\\\)", re.S)


def rows() -> list[tuple[list[str], int, str, bool]]:
    """(the row's symbols' LaTeX, chapter number, page, whether it is a later meaning) for every table row."""
    return [([s.strip() for s in re.findall(r"\$([^$]+)\$", m.group(1))], int(m.group(3)), m.group(4),
             m.group(2).startswith("also:")) for m in ROW.finditer(PAGE.read_text())]


def chapter_math(page: str) -> str:
    """The math of a chapter's markdown cells, segments joined by newlines."""
    nb = json.loads((BOOK / page).read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return "\n".join(next(g for g in m.groups() if g) for m in MATH.finditer(text))


def has(math: str, symbol: str) -> bool:
    """Whether `symbol` (LaTeX) occurs as a token: not inside a longer command or name (\\alpha is not \\alphabet,
    L is not L_t when L_t is asked for, and the other way round)."""
    sub = "" if "_" in symbol or "^" in symbol else r"(?![_^])"
    return re.search(rf"(?<![A-Za-z\\]){re.escape(symbol)}(?![A-Za-z]){sub}", math) is not None


CHAPTERS = sorted(p.name for p in BOOK.glob("[0-9][0-9]_*.ipynb"))


def test_the_page_has_the_core_symbols_and_is_in_the_toc():
    symbols = {s for syms, *_ in rows() for s in syms}
    assert {"L", "L_t", "N", "T", r"\alpha", r"\alpha_i", "d", "n", r"\tilde d", "E", r"N_s/N", r"\beta(H)"} <= symbols
    assert "file: book/notation" in (BOOK.parent / "_toc.yml").read_text()


def test_a_later_meaning_follows_a_first_one():
    first: dict[str, int] = {}
    for syms, chapter, _, also in rows():
        for sym in syms:
            assert also == (sym in first), f"${sym}$: 'also:' marks exactly the rows after its first meaning's"
            assert chapter >= first.setdefault(sym, chapter)


@pytest.mark.parametrize("syms,chapter,page,also", rows())
def test_each_symbol_first_appears_where_the_page_says(syms, chapter, page, also):
    assert page in CHAPTERS and int(page[:2]) == chapter, f"{page}: not chapter {chapter}"
    for sym in syms:
        assert has(chapter_math(page), sym), f"${sym}$ is not in chapter {chapter}'s math"
        earlier = [p for p in CHAPTERS if p < page and has(chapter_math(p), sym)]
        assert also or not earlier, f"${sym}$ appears before chapter {chapter}, in {earlier}"
