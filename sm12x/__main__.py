import sys

from sm12x.cli import main

sys.exit(main())
