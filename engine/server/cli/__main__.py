"""``python -m jetwake.engine.server.cli``: the ``jetwake`` command."""

import sys

from jetwake.engine.server.cli.main import main

sys.exit(main())
