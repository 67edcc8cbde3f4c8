import sys

from .cli import main

if __name__ == "__main__":      # not in a spawned worker (precompile.py), which imports this
    sys.exit(main())
