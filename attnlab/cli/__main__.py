"""`python -m attnlab.cli ...` = `attnlab ...`."""
import sys

from attnlab.cli import main

sys.exit(main())
