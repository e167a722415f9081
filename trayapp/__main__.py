import sys

from trayapp.cli import main

sys.exit(main())
