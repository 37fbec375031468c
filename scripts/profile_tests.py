"""Each test module's seconds in a pytest JUnit report, as tests/conftest.py's parallel schedule reads them.

    bash scripts/test.sh --junitxml=/tmp/tests.xml        # a whole run (its times: setup, call and teardown)
    .venv/bin/python scripts/profile_tests.py /tmp/tests.xml

writes tests/data/durations.json (module -> seconds, longest first) and prints the table. The schedule sends the
longest module groups to the workers first; a stale profile only makes the order worse, never the run wrong.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "durations.json"


def module_seconds(report: Path) -> dict[str, float]:
    """Seconds per module (``tests.test_x``) of the JUnit ``report``, longest first."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        classname = case.get("classname", "")
        parts = classname.split(".")
        module = ".".join(
            parts[: next((i + 1 for i, part in enumerate(parts) if part.startswith("test_")), len(parts))]
        )
        seconds[module] += float(case.get("time", "0") or 0)
    return dict(sorted(((name, round(value, 1)) for name, value in seconds.items()), key=lambda pair: -pair[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a pytest --junitxml report")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    seconds = module_seconds(args.report)
    args.out.write_text(json.dumps(seconds, indent=1) + "\n")
    for module, value in seconds.items():
        print(f"{value:8.1f} s  {module}")
    print(f"{sum(seconds.values()):8.1f} s  in all; written to {args.out}")


if __name__ == "__main__":
    main()
