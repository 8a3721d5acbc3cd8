"""``python -m oscar_kernels``: the ``oscar-kv`` command line (:mod:`oscar_kernels.cli`)."""

import sys

from .cli import main

sys.exit(main())
