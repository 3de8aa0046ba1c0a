"""``python -m launcher.failures LOG [--json] [--platform vertex]``: the classifier without the CLI.

For debugging a rule against a log; ``launch explain`` is the command users run.
"""

from __future__ import annotations

import argparse
import json
import sys

from launcher.failures import explain_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.failures", description=__doc__)
    parser.add_argument("log", help="log file, or - for standard input")
    parser.add_argument("--json", action="store_true", help="print the explain --json object")
    parser.add_argument("--platform", default=None, help="local, vertex or sagemaker")
    args = parser.parse_args(argv)
    try:
        diagnosis = explain_file(args.log, platform=args.platform)
    except OSError as err:
        print(f"cannot read {args.log}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(json.dumps(diagnosis.to_dict(), indent=2) if args.json else diagnosis.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
