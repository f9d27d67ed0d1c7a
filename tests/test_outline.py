"""The course outline (issue 50 item 6): chapters' times read from their Time lines, summed, never typed."""
from pathlib import Path

import pytest

from attnlab.book import outline

INTRO = Path(outline.BOOK) / "intro.md"


def test_a_time_line_parses_into_its_parts():
    t = outline.parse_time("about 20 minutes; the folded section for researchers about 10 more; the exercises "
                           "about 25.")
    assert t == {"reading": 20, "folded for researchers": 10, "exercises": 25, "other": 0}
    assert outline.parse_time("about 15 minutes; running the report on your own model about 10 more.")["other"] == 10


def test_a_time_line_without_a_number_is_one_clear_error():
    with pytest.raises(ValueError, match="no 'about N'"):
        outline.parse_time("about 15 minutes; the exercises take a while", "07_beyond_softmax")


def test_every_chapter_states_its_time_and_the_sum_is_the_rows():
    rows = outline.chapter_times()
    assert len(rows) == 10 and all(t["reading"] > 0 for *_, t in rows)
    total = sum(sum(t.values()) for *_, t in rows)
    assert 5 * 60 <= total <= 10 * 60          # the issue: about 7.5 h in all
    html = outline.course_outline().data
    assert outline.hours(total) in html and html.count("<tr>") == len(rows) + 2   # head, chapters, the sum


def test_the_landing_page_computes_the_outline_and_types_no_total():
    text = INTRO.read_text()
    assert "book.course_outline()" in text
    assert outline.hours(sum(sum(t.values()) for *_, t in outline.chapter_times())) not in text
