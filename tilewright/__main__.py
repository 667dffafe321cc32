import sys

from tilewright.cli.main import main

sys.exit(main())
