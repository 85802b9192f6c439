"""`python -m envbisect`."""

from __future__ import annotations

from envbisect.cli import main

if __name__ == "__main__":
    main()
