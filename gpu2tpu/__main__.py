"""`python -m gpu2tpu`."""

import sys

try:
    from .cli import entry
except KeyboardInterrupt:  # Ctrl-C while the command loads: nothing was read or written
    print("interrupted: 0 files written, every file untouched", file=sys.stderr)
    sys.exit(130)

entry()
