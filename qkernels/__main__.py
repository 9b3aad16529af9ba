import sys

from qkernels.cli import main

if __name__ == "__main__":
    sys.exit(main())
