"""``python -m flows.cli``: the ``privzo`` command."""
import sys

from flows.cli import main

sys.exit(main())
