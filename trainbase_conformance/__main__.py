"""python -m trainbase_conformance: the same as the trainbase-conformance command."""

import sys

from .cli import main

sys.exit(main())
