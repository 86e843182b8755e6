"""Write docs/conformance.md from the tables, or check them (see conformance/__init__.py).

    python -m conformance            # rewrite docs/conformance.md
    python -m conformance --check    # exit 1 with the problems if a table disagrees with its run or the study's
                                     # words, a procedure names no test, or the file is stale
"""

from __future__ import annotations

import argparse
import sys

from conformance import (DOC, ROOT, STUDY, TABLES, TableError, citation_problems, effective, problems,
                         procedure_problems, render, tables)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        DOC.write_text(text)
        print(f"wrote {DOC}", file=sys.stderr)
        return 0
    found = [] if DOC.exists() and DOC.read_text() == text else [f"{DOC}: out of date: run python -m conformance"]
    for table in tables():
        try:
            found += problems(table, *effective(table))
        except TableError as err:
            found.append(str(err))
        found += citation_problems(table, STUDY.read_text()) if STUDY.exists() else []
    found += procedure_problems((TABLES / "procedures.md").read_text(), lambda path: (ROOT / path).read_text())
    print("\n".join(found) or "conformance: every table agrees with its run", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
