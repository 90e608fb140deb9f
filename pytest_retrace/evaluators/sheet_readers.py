"""Read cell values from spreadsheet bytes: CSV/TSV, XLSX (openpyxl, imported lazily) and Gnumeric.

Every reader returns ``{(row, col): value}`` with 0-based coordinates, values being str, float/int,
bool, datetime or None. Corrupt input raises (zipfile.BadZipFile, ParseError, ...): the engine turns
that into a failed check, since a broken file written by the agent is a task failure.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from typing import Any

from .base import CheckFailed

Cell = tuple[int, int]
Reader = Callable[[bytes, str | None, Iterable[Cell]], dict[Cell, Any]]

_GZIP_MAGIC = b"\x1f\x8b"
_REF = re.compile(r"\$?([A-Za-z]{1,3})\$?([1-9][0-9]*)")


def parse_ref(ref: str) -> Cell:
    """``"B3"`` / ``"$B$3"`` -> (2, 1). Raises ValueError for anything else."""
    match = _REF.fullmatch(ref.strip())
    if not match:
        raise ValueError(f"not a cell reference: {ref!r}")
    col = 0
    for letter in match.group(1).upper():
        col = col * 26 + (ord(letter) - ord("A") + 1)
    return int(match.group(2)) - 1, col - 1


def _read_delimited(data: bytes, delimiter: str) -> dict[Cell, Any]:
    text = data.decode("utf-8-sig")  # LibreOffice can be told to write a BOM; it is not data
    rows = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    return {(r, c): value for r, row in enumerate(rows) for c, value in enumerate(row)}


def read_csv(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, Any]:
    return _read_delimited(data, ",")  # a CSV has one sheet: `sheet` does not apply


def read_tsv(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, Any]:
    return _read_delimited(data, "\t")


def read_xlsx(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, Any]:
    """Cached values (data_only): what the user saw when the file was saved."""
    import openpyxl  # lazy: importing the evaluators must stay cheap for case loading

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # openpyxl warns about unsupported extensions; irrelevant here
        book = openpyxl.load_workbook(io.BytesIO(data), data_only=True)
    try:
        if sheet is None:
            worksheet = book.worksheets[0]
        elif sheet in book.sheetnames:
            worksheet = book[sheet]
        else:
            raise CheckFailed(f"no sheet {sheet!r} (sheets: {', '.join(book.sheetnames)})")
        return {(r, c): worksheet.cell(row=r + 1, column=c + 1).value for r, c in cells}
    finally:
        book.close()


def _gnumeric_value(cell: ET.Element) -> Any:
    """A ``<gnm:Cell>``'s value by its ValueType (10 empty, 20 bool, 40 number, 60 string).

    Gnumeric stores formulas (``=A1*2``, no ValueType) without a computed value, so such a cell's
    value is its formula text; check computed results via ``ssconvert`` in a command instead.
    """
    text = cell.text or ""
    value_type = cell.get("ValueType")
    if value_type == "10":
        return None
    if value_type == "20":
        return text.strip().upper() == "TRUE"
    if value_type == "40":
        return float(text)
    return text


def _gnumeric_sheet(root: ET.Element, ns: dict[str, str], name: str | None) -> ET.Element:
    sheets = root.findall("gnm:Sheets/gnm:Sheet", ns)
    by_name = {sheet.findtext("gnm:Name", "", ns): sheet for sheet in sheets}  # direct child only
    if name is None:
        # The tab order is SheetNameIndex's; <gnm:Sheets> is normally in the same order.
        first = root.findtext("gnm:SheetNameIndex/gnm:SheetName", None, ns)
        if first in by_name:
            return by_name[first]
        if not sheets:
            raise CheckFailed("workbook has no sheets")
        return sheets[0]
    if name not in by_name:
        raise CheckFailed(f"no sheet {name!r} (sheets: {', '.join(by_name)})")
    return by_name[name]


def read_gnumeric(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, Any]:
    """Gnumeric's XML (``http://www.gnumeric.org/v10.dtd``), gzip-compressed unless saved with level 0."""
    xml = gzip.decompress(data) if data.startswith(_GZIP_MAGIC) else data
    root = ET.fromstring(xml)
    # Take the namespace from the root: older Gnumeric versions wrote v7/v8/v9 .dtd namespaces.
    namespace, _, local = root.tag[1:].partition("}") if root.tag.startswith("{") else ("", "", root.tag)
    if local != "Workbook" or "gnumeric" not in namespace:
        raise CheckFailed(f"not a Gnumeric workbook (root element {root.tag!r})")
    ns = {"gnm": namespace}
    found = _gnumeric_sheet(root, ns, sheet)
    return {
        (int(cell.get("Row", "-1")), int(cell.get("Col", "-1"))): _gnumeric_value(cell)
        for cell in found.iterfind("gnm:Cells/gnm:Cell", ns)
    }


READERS: dict[str, Reader] = {
    "csv": read_csv,
    "tsv": read_tsv,
    "xlsx": read_xlsx,
    "xlsm": read_xlsx,
    "gnumeric": read_gnumeric,
}
