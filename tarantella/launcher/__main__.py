"""`python -m tarantella.launcher [options] [--] program [args]`: the `tarantella` command."""
import sys

from .cli import main

sys.exit(main())
