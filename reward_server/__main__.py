import sys

from reward_server.cli import main

sys.exit(main())
