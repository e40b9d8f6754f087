"""`python -m typedlm.cli`: the `typedlm` command."""

import sys

from typedlm.cli import main

sys.exit(main())
