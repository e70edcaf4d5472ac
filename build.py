#!/usr/bin/env python3
"""trainbase: build and prove Docker base images for distributed GPU training.

    python build.py --list [--json] [--profile local] [--select KEY=VALUE]
    python build.py --render | --check | --lock | --lint | --explain NAME
    python build.py --matrix [--profile local] [-j N] [--push --registry HOST/NS]

Everything lives in the `trainbase` package; this file only hands over the command line.
"""
import sys

from trainbase.cli import main

if __name__ == "__main__":
    sys.exit(main())
