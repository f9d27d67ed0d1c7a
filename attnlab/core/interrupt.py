"""Whether Ctrl-C was pressed in this process (the CLI's handler records it), for loops that must stop even where
the KeyboardInterrupt the handler raised was swallowed on its way (a finalizer, a library's callback).

No torch here: the CLI's handler imports it before any library.
"""
from __future__ import annotations

import threading

#: set by the CLI's Ctrl-C handlers (`cli._stop_once`, `cli.interrupts_held`); cleared as `cli.main` starts
PRESSED = threading.Event()


def check() -> None:
    """Raise KeyboardInterrupt when Ctrl-C was pressed (the handler's own may have been swallowed)."""
    if PRESSED.is_set():
        raise KeyboardInterrupt
