"""``python -m agents.native``: build the native ops now (the Docker image does this at build time)."""

import sys

from agents.native import main

sys.exit(main())
