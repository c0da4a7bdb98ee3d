"""A thin wrapper for people who expect a script: `python scripts/run_mlm.py ARGS` = `jaxbert train-mlm ARGS`."""

import sys

from jaxbert.cli import main

if __name__ == "__main__":
    sys.exit(main(["train-mlm", *sys.argv[1:]]))
