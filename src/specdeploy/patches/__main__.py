"""`python -m specdeploy.patches ACTION ...`: the patch commands without the controller's
dependencies (Ansible, Docker SDK), as the engine images run them at build time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.patches import commands


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.patches")
    commands.add_arguments(parser)
    args = parser.parse_args()
    try:
        return commands.run(args.action, args.engine, Path(args.site_packages), args)
    except SpecdeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
