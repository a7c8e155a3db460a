"""The console script tutti-run: runs the launcher binary shipped in the package."""

import os
import sys


def main() -> None:
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tutti-run")
    os.execv(binary, [binary] + sys.argv[1:])


if __name__ == "__main__":
    main()
