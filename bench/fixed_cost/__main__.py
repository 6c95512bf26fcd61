import sys

from bench.fixed_cost.run import main

sys.exit(main())
