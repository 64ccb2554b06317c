"""``python -m forge``: the same as the ``forge`` console script."""

import sys

from forge.cli import main

if __name__ == "__main__":
    sys.exit(main())
