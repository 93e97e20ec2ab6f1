"""``python -m blockc.cli``, as the ``blockc`` program."""
import sys

from .app import main

sys.exit(main())
