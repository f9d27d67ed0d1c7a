"""Write the README's table of the ATTNLAB_* environment variables from `attnlab.core.settings` (between the marker
comments).

    python scripts/settings_table.py           # rewrite it
    python scripts/settings_table.py --check   # exit 1 when it differs from what the module gives

tests/test_settings.py runs the same comparison, so a stale table fails `make test`.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- settings-table:begin (scripts/settings_table.py writes this) -->", "<!-- settings-table:end -->"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: "Running offline: the data directory" -> "running-offline-the-data-directory"."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(readme: str) -> dict[str, tuple[str, str]]:
    """{anchor: (heading, text up to the next heading of its level or above)} of the README's ## sections."""
    parts = re.split(r"^## (.+)$", readme, flags=re.M)
    return {slug(heading): (heading, body) for heading, body in zip(parts[1::2], parts[2::2])}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;")


def table_markdown(settings, readme: str) -> str:
    """The table: variable, default (or what unset means), meaning, where it is explained (a README section or a
    file, as links)."""
    headings = sections(readme)
    lines = ["| variable | default | what it does | more in |", "|---|---|---|---|"]
    for s in settings:
        default = f"`{s.default}`" if s.default is not None else _cell(s.unset)
        if s.documented.startswith("README.md#"):
            anchor = s.documented.split("#", 1)[1]
            more = f"[{headings[anchor][0]}](#{anchor})"
        else:
            more = f"[`{s.documented}`]({s.documented})"
        lines.append(f"| `{s.name}` | {default} | {_cell(s.meaning)} | {more} |")
    return "\n".join(lines) + "\n"


def readme_with(table: str, readme: str) -> str:
    """The README text with `table` between the markers (ValueError when they are missing)."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README.md: the markers {BEGIN!r} and {END!r} are missing")
    before, rest = readme.split(BEGIN, 1)
    return before + BEGIN + "\n" + table + END + rest.split(END, 1)[1]


def expected() -> str:
    """What README.md must hold."""
    sys.path.insert(0, str(ROOT))
    from attnlab.core import settings

    readme = README.read_text()
    return readme_with(table_markdown(settings.ALL, readme), readme)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the table is stale; write nothing")
    args = parser.parse_args(argv)
    text = expected()
    if text == README.read_text():
        print("the table is current")
        return 0
    if args.check:
        print("stale: README.md; run python scripts/settings_table.py")
        return 1
    README.write_text(text)
    print("rewrote README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
