"""Rewrite the architecture table in docs/models.md from the registry."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's registry, whatever copy pip installed

from arch_table import table  # noqa: E402

MODELS = ROOT / "docs" / "models.md"
START, END = "<!-- arch-table:start -->", "<!-- arch-table:end -->"

if __name__ == "__main__":
    text = MODELS.read_text(encoding="utf-8")
    new = re.sub(f"{START}.*?{END}", f"{START}\n{table()}\n{END}", text, flags=re.S)
    MODELS.write_text(new, encoding="utf-8")
