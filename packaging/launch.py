"""The bundle's entry point: `snug` as installed by pip (app.entry.main)."""

import sys

from app.entry import main

if __name__ == "__main__":
    sys.exit(main())
