"""Exercises a learner answers on the page: a number within a tolerance, or one reading among several.

The chapter computes the answer (the same variable its solution prints) and hands it to `number` or `choice`;
the page gets a small HTML block, ``<div class="attnlab-check" data-attnlab-check="number|choice">``, whose
JSON (the answer, its tolerance, why) book/_assets/site/attnlab-check.js reads to say right or wrong, with the
hint above the box. In Jupyter and Colab the same answer data drives an ipywidgets form (`CheckBox`).

    book.check_number("1.1", share, tol=0.05, prompt="Share of rows above 0.5 at tau = 0.25",
                      hint="...", why="...")
    book.check_choice("4.1", ["T = 0.1", "T = 2"], right=0, prompt="Which keeps more?", hint="...", why="...")
"""
from __future__ import annotations

import html
import json
import math
from typing import Sequence

import ipywidgets as widgets

KINDS = ("number", "choice")


def verdict(spec: dict, given) -> tuple[bool, str]:
    """(right?, the sentence the page shows) for an answer `given` (text for a number, an index for a choice):
    the same rule as attnlab-check.js."""
    if spec["kind"] == "number":
        try:
            x = float(str(given).strip().replace(",", "").rstrip("%"))
        except ValueError:
            return False, "Type a number (e.g. 0.25)."
        ok = math.isfinite(x) and abs(x - spec["answer"]) <= spec["tol"]
    else:
        ok = given == spec["answer"]
    return ok, ("Right. " if ok else "Not quite. ") + (spec["why"] if ok else spec["wrong"])


def _spec(exercise: str, kind: str, answer, prompt: str, hint: str, why: str, wrong: str, **extra) -> dict:
    if kind not in KINDS:
        raise ValueError(f"check {exercise}: kind {kind!r} is not one of {KINDS}")
    if not (prompt and hint and why and wrong):
        raise ValueError(f"check {exercise}: prompt, hint, why and wrong must all say something")
    return dict(exercise=exercise, kind=kind, answer=answer, prompt=prompt, hint=hint, why=why, wrong=wrong, **extra)


def number(exercise: str, value: float, tol: float, *, prompt: str, hint: str, why: str, wrong: str,
           unit: str = "") -> "CheckBox":
    """A number to type, right within +-`tol` of the computed `value` (finite; `tol` > 0)."""
    value = float(value)
    if not math.isfinite(value) or not tol > 0:
        raise ValueError(f"check {exercise}: the answer {value} must be finite and the tolerance {tol} positive")
    return CheckBox(_spec(exercise, "number", value, prompt, hint, why, wrong, tol=float(tol), unit=unit))


def choice(exercise: str, options: Sequence[str], right: int, *, prompt: str, hint: str, why: str,
           wrong: str) -> "CheckBox":
    """One of `options` to pick; `right` is the index the chapter's numbers select."""
    right = int(right)
    if len(options) < 2 or not 0 <= right < len(options):
        raise ValueError(f"check {exercise}: need two or more options and a right index in range, got {right}")
    return CheckBox(_spec(exercise, "choice", right, prompt, hint, why, wrong, options=[str(o) for o in options]))


def check_html(spec: dict) -> str:
    """The page's block: hint, labelled input (text box or radio group), a Check button and a live verdict.
    Prompt, hint and options are typeset (`markup.rendered`); the verdict is plain text (the script sets it)."""
    from attnlab.book.markup import rendered

    def e(text):                     # escaped, with the checker's plain notation (d~, N_s/N, ...) typeset
        return rendered(html.escape(str(text).replace("<=", "≤").replace(">=", "≥"), quote=False))

    uid = "attnlab-check-" + "".join(c if c.isalnum() else "-" for c in spec["exercise"])
    if spec["kind"] == "number":
        unit = f' <span class="attnlab-check-unit">{e(spec["unit"])}</span>' if spec["unit"] else ""
        field = (f'<label for="{uid}-in">{e(spec["prompt"])}</label> '
                 f'<input id="{uid}-in" type="text" inputmode="decimal" autocomplete="off">{unit}')
    else:
        opts = "".join(f'<label><input type="radio" name="{uid}-in" value="{i}"> {e(o)}</label>'
                       for i, o in enumerate(spec["options"]))
        field = f'<fieldset><legend>{e(spec["prompt"])}</legend>{opts}</fieldset>'
    data = json.dumps(spec).replace("</", "<\\/")
    return (f'<div class="attnlab-check mathjax_process" id="{uid}" data-attnlab-check="{spec["kind"]}">'
            f'<p class="attnlab-check-title"><strong>Check your answer to Exercise {e(spec["exercise"])}</strong></p>'
            f'<p class="attnlab-check-hint"><strong>Hint.</strong> {e(spec["hint"])}</p>'
            f'<form class="attnlab-check-form" onsubmit="return false">{field} '
            f'<button type="submit">Check</button></form>'
            f'<p class="attnlab-check-verdict" role="status" aria-live="polite"></p>'
            f'<script type="application/json">{data}</script></div>')


class CheckBox(widgets.VBox):
    """The check in Jupyter and Colab (hint, input, Check button, verdict); ``text/html`` is the page's block,
    which the site's JavaScript runs with no kernel. `spec` holds the computed answer both read."""

    def __init__(self, spec: dict):
        self.spec = spec
        if spec["kind"] == "number":
            self.field = widgets.Text(description="", placeholder="a number")
        else:
            self.field = widgets.RadioButtons(options=[(o, i) for i, o in enumerate(spec["options"])], value=None)
        button, self.out = widgets.Button(description="Check"), widgets.HTML()
        button.on_click(lambda _: self._check())
        super().__init__([widgets.HTML(f"<b>Check your answer to Exercise {html.escape(spec['exercise'])}</b>"
                                       f"<br><b>Hint.</b> {html.escape(spec['hint'])}"),
                          widgets.Label(spec["prompt"]), self.field, button, self.out])

    def _check(self) -> None:
        ok, text = verdict(self.spec, self.field.value)
        self.out.value = html.escape(text)

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data is not None:
            data["text/html"] = check_html(self.spec)
        return data
