import sys

from qkernels.cli import main

sys.exit(main())
