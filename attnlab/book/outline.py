"""The course outline (issue 50 item 6): each chapter's time, read from the "**Time** about ..." line the chapter
opens with, summed on the landing page (never typed there)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

BOOK = Path(__file__).resolve().parents[2] / "book"
TIME_LINE = re.compile(r"\*\*Time\*\*\s+(.+)")
MINUTES = re.compile(r"about (\d+)(?: minutes)?")
#: the parts a Time line names, by a word of its clause; the first clause is the reading itself
PARTS = (("researchers", "folded for researchers"), ("exercise", "exercises"))     # "exercise" or "exercises"


def time_line(page: Path) -> str:
    """The text after "**Time**" in a chapter (an .ipynb's markdown cells or a .md file)."""
    text = page.read_text()
    if page.suffix == ".ipynb":
        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "markdown")
    m = TIME_LINE.search(text)
    if m is None:
        raise ValueError(f"{page.name}: no '**Time** about N minutes; ...' line to read the chapter's time from")
    return m.group(1).strip()


def parse_time(line: str, where: str = "the Time line") -> dict[str, int]:
    """Minutes per part of one Time line: {"reading": .., "folded for researchers": .., "exercises": ..,
    "other": ..} (a part the line does not name is 0). "about 15 minutes; the exercises about 20 more." ->
    reading 15, exercises 20."""
    out = {"reading": 0, **{label: 0 for _, label in PARTS}, "other": 0}
    for i, clause in enumerate(c for c in line.rstrip(".").split(";") if c.strip()):
        m = MINUTES.search(clause)
        if m is None:
            raise ValueError(f"{where}: no 'about N' in {clause.strip()!r}")
        part = "reading" if i == 0 else next((label for word, label in PARTS if word in clause), "other")
        out[part] += int(m.group(1))
    return out


def chapter_times(book_dir: Optional[Path] = None) -> list[tuple[str, str, dict[str, int]]]:
    """(number, title, minutes per part) for every chapter of the chapter map that states a time."""
    from attnlab.book.chapters import CHAPTER_CLAIMS

    book_dir = book_dir or BOOK
    return [(num, title, parse_time(time_line(book_dir / f"{page}.ipynb"), page))
            for num, title, page, _ in CHAPTER_CLAIMS]


def hours(minutes: int) -> str:
    """460 -> '7 h 40 min'."""
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def course_outline(book_dir: Optional[Path] = None):
    """HTML table: each chapter's minutes (reading, the folded sections for researchers, the exercises, other
    work), each row's total and the course's, summed from the chapters' own Time lines."""
    from attnlab.book.markup import table

    rows = chapter_times(book_dir)
    parts = ["reading", "folded for researchers", "exercises", "other"]
    sums = {p: sum(t[p] for _, _, t in rows) for p in parts}
    body = [[num, title, *[t[p] or "" for p in parts], hours(sum(t.values()))] for num, title, t in rows]
    body.append(["", "<b>all chapters</b>", *[sums[p] for p in parts], f"<b>{hours(sum(sums.values()))}</b>"])
    return table(["chapter", "title", "reading (min)", "folded, for researchers (min)", "exercises (min)",
                  "other work (min)", "in all"], body,
                 caption="Minutes per chapter, read from the Time line each chapter opens with; the last row "
                         "sums them.")
