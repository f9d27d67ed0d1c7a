"""The reader's own theme (issue 50): a first visit follows the system's colour scheme (prefers-color-scheme), and
the theme button's choice is remembered across reloads and pages. _config.yml sets the theme's default_mode to
"auto"; "light" there once kept a reader whose system prefers dark on the light theme."""
from __future__ import annotations

import pytest

_THEME = "() => document.documentElement.dataset.theme"
_BUTTON = ".theme-switch-button:visible"


def _click_until(page, theme: str) -> None:
    """Clicks the visible theme button (the theme cycles auto -> light/dark -> dark/light) until the page shows
    `theme`: at most three clicks."""
    for _ in range(3):
        if page.evaluate(_THEME) == theme:
            return
        page.locator(_BUTTON).first.click()
        page.wait_for_timeout(100)
    assert page.evaluate(_THEME) == theme, f"three clicks of the theme button did not reach {theme}"


@pytest.mark.parametrize("phone", [False, True], ids=["1280px", "390px"])
@pytest.mark.parametrize("system", ["dark", "light"])
def test_a_first_visit_follows_the_system_and_the_choice_is_remembered(system, phone, site, server, new_page):
    page = new_page(phone=phone, color_scheme=system)      # no stored mode: a first visit
    page.goto(f"{server}/book/intro.html", wait_until="load")
    page.wait_for_function(f"() => document.documentElement.dataset.theme === '{system}'", timeout=5_000)
    other = "light" if system == "dark" else "dark"
    assert page.locator(_BUTTON).count(), "no visible theme button"
    _click_until(page, other)
    page.reload(wait_until="load")
    assert page.evaluate(_THEME) == other, f"{system} system: the chosen {other} theme was not kept on reload"
    page.goto(f"{server}/book/01_vanishing.html", wait_until="load")
    assert page.evaluate(_THEME) == other, f"{system} system: the chosen {other} theme was not kept on the next page"
