"""`python -m jaxbert` runs the command line."""

import sys

from jaxbert.cli import main

sys.exit(main())
