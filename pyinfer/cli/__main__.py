"""`python -m pyinfer.cli`: the same as the `pyinfer` command."""
import sys

from . import main

sys.exit(main())
