"""Rewrite the architecture table in README.md from the registry."""

import re
from pathlib import Path

from arch_table import table

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- arch-table:start -->", "<!-- arch-table:end -->"

if __name__ == "__main__":
    text = README.read_text(encoding="utf-8")
    new = re.sub(f"{START}.*?{END}", f"{START}\n{table()}\n{END}", text, flags=re.S)
    README.write_text(new, encoding="utf-8")
