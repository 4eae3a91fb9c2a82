"""``python -m memflow.cli``: the ``memflow`` command without installing its entry point."""
from . import main

raise SystemExit(main())
