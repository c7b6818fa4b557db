"""`python -m gpu2tpu`."""

import sys

from .cli import main

sys.exit(main())
