"""``python -m bench``: lists every suite and probe; ``python -m bench NAME --help`` says what one takes."""

import sys

from bench.harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
