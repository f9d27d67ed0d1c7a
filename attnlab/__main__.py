"""`python -m attnlab ...` = `attnlab ...` (the console script `attnlab.cli:main`; usage and errors say "attnlab")."""
import sys

from attnlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
