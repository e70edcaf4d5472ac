#!/usr/bin/env python3
"""trainbase: build and prove Docker base images for distributed GPU training.

    python build.py list [--json] [--profile local] [--select KEY=VALUE]
    python build.py render | check | lock | lint | explain NAME
    python build.py build [--profile local] [-j N] [--push --registry HOST/NS]
    python build.py --matrix ...          (the same as `build.py build ...`)
    python build.py COMMAND --help        (the options COMMAND reads)

Everything lives in the `trainbase` package (the command line: trainbase/cli/); this file only
hands over the command line.
"""

import sys

from trainbase.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
