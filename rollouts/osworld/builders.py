"""The bytes of every file the OSWorld-format tasks use, per task (its slug in gen_tasks.py) and file name:
the files a task downloads and the gold files its evaluator compares with. Built with the libraries OSWorld's
metrics read them with (openpyxl, python-docx, python-pptx, Pillow), every date fixed."""

from __future__ import annotations

import datetime
import io
from collections.abc import Callable

import openpyxl

FIXED = datetime.datetime(2024, 1, 1)
Builder = Callable[[], bytes]


def xlsx(rows: list[list[object]], sheet: str = "Sheet1") -> Builder:
    def build() -> bytes:
        book = openpyxl.Workbook()
        ws = book.active
        ws.title = sheet
        for row in rows:
            ws.append(row)
        book.properties.created = book.properties.modified = FIXED
        book.properties.creator = "pytest-retrace"
        out = io.BytesIO()
        book.save(out)
        return out.getvalue()
    return build


SALES = [["Item", "Qty"], ["apple", 3], ["pear", 5], ["plum", 9]]

FILES: dict[str, dict[str, Builder]] = {
    "calc-total": {"sales.xlsx": xlsx(SALES), "sales_gold.xlsx": xlsx(SALES + [["Total", 17]])},
}
