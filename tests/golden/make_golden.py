"""Regenerate tests/golden/expected/ from the current code (see tests/golden/README.md).

    python tests/golden/make_golden.py

Needs ../shared/data beside the checkout. Only run it for an intended output change, and say
why in the commit message."""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from golden import EXPECTED, FILES, SHARED_DATA, collect, dump_jsonl, run  # noqa: E402


def main() -> int:
    if not SHARED_DATA.is_dir():
        print(f"make_golden: needs the shared data at {SHARED_DATA}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gage-golden-") as tmp:
        work = Path(tmp)
        outputs = collect(run(SHARED_DATA, work), SHARED_DATA, work)
    if EXPECTED.exists():
        shutil.rmtree(EXPECTED)
    total = 0
    for task, entry in outputs.items():
        folder = EXPECTED / task
        folder.mkdir(parents=True)
        for kind in FILES:
            (folder / f"{kind}.jsonl").write_text(dump_jsonl(entry[kind]), encoding="utf-8")
        (folder / "summary.json").write_text(json.dumps(entry["summary"], ensure_ascii=False, indent=1) + "\n",
                                             encoding="utf-8")
        size = sum(p.stat().st_size for p in folder.iterdir())
        total += size
        print(f"{task}: {len(entry['samples'])} samples, {size / 1024:.1f} KB")
    print(f"wrote {EXPECTED} ({total / 1024:.1f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
