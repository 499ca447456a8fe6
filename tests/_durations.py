"""Write tests/data/durations.json (tests/conftest.py orders the collection by it) from a suite run's junit XML:

    .venv/bin/python -m pytest -n 2 --dist loadgroup --junitxml=/tmp/suite.xml tests
    .venv/bin/python tests/_durations.py /tmp/suite.xml

Seconds per test (setup + call + teardown), ≥ 1 s only (the rest weigh 0), rounded to 0.1 s. The figures are
relative weights for the order, taken on whatever machine ran the suite; no test reads them as a limit."""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "durations.json"


def durations(junit: Path) -> dict[str, float]:
    got: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        module = next((p for p in parts if p.startswith("test_")), None)
        name = (case.get("name") or "").split("@")[0]          # loadgroup's "@group" suffix
        if module and name:
            key = f"{module}.py::{name}"
            got[key] = got.get(key, 0.0) + float(case.get("time") or 0.0)
    return {k: round(v, 1) for k, v in sorted(got.items()) if v >= 1.0}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python tests/_durations.py JUNIT.xml", file=sys.stderr)
        return 2
    d = durations(Path(argv[0]))
    OUT.write_text(json.dumps(d, indent=1, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(d)} tests, {sum(d.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
