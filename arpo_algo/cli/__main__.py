"""``python -m arpo_algo.cli``: the ``arpo`` command, for environments whose scripts folder is not on the PATH."""

import sys

from arpo_algo.cli.main import main

sys.exit(main())
