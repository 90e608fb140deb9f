"""Read cell values from spreadsheet bytes: CSV/TSV, XLSX (openpyxl, imported lazily), Gnumeric and
OpenDocument (.ods).

Every reader returns ``{(row, col): value}`` with 0-based coordinates, values being str, float/int,
bool, datetime/time or None: the value *as the application computes it*, so a formula cell reads as its
result (as OSWorld's checks compare them), never as its formula text. Corrupt input raises
(zipfile.BadZipFile, ParseError, ...): the engine turns that into a failed check, since a broken file
written by the agent is a task failure.

Where formulas come from:
- XLSX and ODS store each formula's last computed value next to it (``data_only`` / ``office:value``);
- Gnumeric's XML stores a formula without any value, so the values are computed by Gnumeric itself:
  ``ssconvert --recalc`` converts a temporary copy to XLSX on the host that runs the evaluator, sandboxed
  (evaluators/ssconvert.py). A conversion that fails or hangs is a failed check; only a host without
  ``ssconvert`` is an error of the run.

``FORMULA_READERS`` give the formula text of formula cells (``=SUM(B2:B3)``), for expectations that name
a formula instead of a value.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import re
import warnings
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterable
from typing import Any

from pytest_retrace.evaluators.base import CheckFailed
from pytest_retrace.evaluators.ssconvert import ConversionFailed, ssconvert

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


def _load_xlsx(data: bytes, data_only: bool) -> Any:
    import openpyxl  # lazy: importing the evaluators must stay cheap for case loading

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # openpyxl warns about unsupported extensions; irrelevant here
        return openpyxl.load_workbook(io.BytesIO(data), data_only=data_only)


def _xlsx_sheet(book: Any, sheet: str | None) -> Any:
    if sheet is None:
        return book.worksheets[0]
    if sheet in book.sheetnames:
        return book[sheet]
    raise CheckFailed(f"no sheet {sheet!r} (sheets: {', '.join(book.sheetnames)})")


def read_xlsx(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, Any]:
    """Cached values (data_only): what the application computed when it saved the file."""
    book = _load_xlsx(data, data_only=True)
    try:
        worksheet = _xlsx_sheet(book, sheet)
        return {(r, c): worksheet.cell(row=r + 1, column=c + 1).value for r, c in cells}
    finally:
        book.close()


def read_xlsx_formulas(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, str]:
    book = _load_xlsx(data, data_only=False)
    try:
        worksheet = _xlsx_sheet(book, sheet)
        found = {(r, c): worksheet.cell(row=r + 1, column=c + 1).value for r, c in cells}
        return {at: value for at, value in found.items() if isinstance(value, str) and value.startswith("=")}
    finally:
        book.close()


def _gnumeric_value(cell: ET.Element) -> Any:
    """A literal ``<gnm:Cell>``'s value by its ValueType (10 empty, 20 bool, 40 number, 60 string, 50 error).

    A formula cell (no ValueType; ``=A1*2``, or only an ``ExprID`` for a shared formula) has no stored
    value: :func:`read_gnumeric` computes those with ssconvert.
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


def _is_formula(cell: ET.Element) -> bool:
    return cell.get("ValueType") is None


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


def _parse_gnumeric(data: bytes, sheet: str | None) -> tuple[ET.Element, dict[str, str], ET.Element]:
    """(root, namespaces, the chosen sheet) of Gnumeric's XML, gzip-compressed unless saved with level 0."""
    xml = gzip.decompress(data) if data.startswith(_GZIP_MAGIC) else data
    root = ET.fromstring(xml)
    # Take the namespace from the root: older Gnumeric versions wrote v7/v8/v9 .dtd namespaces.
    namespace, _, local = root.tag[1:].partition("}") if root.tag.startswith("{") else ("", "", root.tag)
    if local != "Workbook" or "gnumeric" not in namespace:
        raise CheckFailed(f"not a Gnumeric workbook (root element {root.tag!r})")
    ns = {"gnm": namespace}
    return root, ns, _gnumeric_sheet(root, ns, sheet)


def read_gnumeric(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, Any]:
    """Gnumeric's XML (``http://www.gnumeric.org/v10.dtd``): literal cells from the XML, and, when the
    sheet holds formulas, the requested cells that are formulas (or not written at all, e.g. inside an
    array formula) as Gnumeric computes them (ssconvert --recalc, see the module doc)."""
    wanted = list(cells)
    root, ns, found = _parse_gnumeric(data, sheet)
    values: dict[Cell, Any] = {}
    formulas: set[Cell] = set()
    for cell in found.iterfind("gnm:Cells/gnm:Cell", ns):
        at = (int(cell.get("Row", "-1")), int(cell.get("Col", "-1")))
        if _is_formula(cell):
            formulas.add(at)
        else:
            values[at] = _gnumeric_value(cell)
    compute = [at for at in wanted if at in formulas or (formulas and at not in values)]
    if compute:
        names = [e.text or "" for e in root.iterfind("gnm:SheetNameIndex/gnm:SheetName", ns)] or [
            s.findtext("gnm:Name", "", ns) for s in root.iterfind("gnm:Sheets/gnm:Sheet", ns)
        ]
        name = found.findtext("gnm:Name", "", ns)
        index = names.index(name) if name in names else 0
        values.update(_computed_by_gnumeric(data, name, index, compute))
    return values


def read_gnumeric_formulas(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, str]:
    """Formula text as Gnumeric saved it (``=sum(B2:B3)``); a shared formula's later cells are left out."""
    _, ns, found = _parse_gnumeric(data, sheet)
    return {
        (int(cell.get("Row", "-1")), int(cell.get("Col", "-1"))): cell.text or ""
        for cell in found.iterfind("gnm:Cells/gnm:Cell", ns)
        if _is_formula(cell) and (cell.text or "").startswith("=")
    }


def _computed_by_gnumeric(data: bytes, name: str, index: int, cells: list[Cell]) -> dict[Cell, Any]:
    """The cells' values after Gnumeric recalculates the workbook; dates as Gnumeric stores them (serial
    numbers, as its literal date cells read), so a formula and a typed value read alike."""
    from openpyxl.utils.datetime import to_excel

    xlsx = ssconvert(data, ".gnumeric", ".xlsx")
    book = _load_xlsx(xlsx, data_only=True)
    try:
        # xlsx limits sheet names to 31 characters; ssconvert keeps the order, so fall back to the position.
        if name in book.sheetnames:
            worksheet = book[name]
        elif index < len(book.worksheets):
            worksheet = book.worksheets[index]
        else:
            raise ConversionFailed(f"ssconvert's output lacks sheet {name!r}")
        out: dict[Cell, Any] = {}
        for r, c in cells:
            value = worksheet.cell(row=r + 1, column=c + 1).value
            if isinstance(value, (dt.datetime, dt.date, dt.time, dt.timedelta)):
                value = float(to_excel(value))
            out[(r, c)] = value
        return out
    finally:
        book.close()


# --- OpenDocument spreadsheets (.ods) ------------------------------------------------------------------

_ODS_MAX_XML = 16 << 20  # bytes of content.xml parsed into a tree (a real task's file is a few KiB)
MAX_ROWS, MAX_COLS = 1 << 20, 1 << 14  # LibreOffice's limits: repeats beyond them are ignored
_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_CALCEXT = "urn:org:documentfoundation:names:experimental:calc:xmlns:calcext:1.0"
_ROW_GROUPS = {f"{{{_TABLE}}}{name}" for name in ("table-header-rows", "table-rows", "table-row-group")}
_CELLS = {f"{{{_TABLE}}}table-cell", f"{{{_TABLE}}}covered-table-cell"}
_MAX_SPACES = 1 << 16  # text:s c="1000000000" must not allocate a gigabyte
_DURATION = re.compile(r"-?P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?")


def _ods_content(data: bytes) -> ET.Element:
    with zipfile.ZipFile(io.BytesIO(data)) as book:
        try:
            info = book.getinfo("content.xml")
        except KeyError:
            raise CheckFailed("not an OpenDocument spreadsheet (no content.xml)") from None
        if info.file_size > _ODS_MAX_XML:
            raise CheckFailed(f"content.xml is {info.file_size} bytes, more than {_ODS_MAX_XML}")
        with book.open(info) as fh:
            xml = fh.read(_ODS_MAX_XML + 1)  # the header's size may lie
    if len(xml) > _ODS_MAX_XML:
        raise CheckFailed(f"content.xml is more than {_ODS_MAX_XML} bytes")
    return ET.fromstring(xml)


def _ods_table(data: bytes, sheet: str | None) -> ET.Element:
    root = _ods_content(data)
    if root.tag != f"{{{_OFFICE}}}document-content":
        raise CheckFailed(f"not an OpenDocument spreadsheet (root element {root.tag!r})")
    tables = root.findall(f"{{{_OFFICE}}}body/{{{_OFFICE}}}spreadsheet/{{{_TABLE}}}table")
    names = [t.get(f"{{{_TABLE}}}name", "") for t in tables]
    if sheet is None:
        if not tables:
            raise CheckFailed("workbook has no sheets")
        return tables[0]
    if sheet not in names:
        raise CheckFailed(f"no sheet {sheet!r} (sheets: {', '.join(names)})")
    return tables[names.index(sheet)]


def _repeat(element: ET.Element, attribute: str) -> int:
    count = int(element.get(f"{{{_TABLE}}}{attribute}", "1"))
    if count < 1:
        raise ValueError(f"table:{attribute}={count}")
    return count


def _ods_cells(table: ET.Element, wanted: Iterable[Cell]) -> Iterable[tuple[Cell, ET.Element]]:
    """The wanted cells' elements. Repeats are walked arithmetically, never expanded, and only the wanted
    cells are kept: a file repeating a row a billion times costs nothing."""
    rows_wanted: dict[int, set[int]] = {}
    for r, c in wanted:
        rows_wanted.setdefault(r, set()).add(c)
    row = 0

    def walk(parent: ET.Element) -> Iterable[tuple[Cell, ET.Element]]:
        nonlocal row
        for child in parent:
            if row >= MAX_ROWS:
                return
            if child.tag in _ROW_GROUPS:
                yield from walk(child)
            elif child.tag == f"{{{_TABLE}}}table-row":
                count = min(_repeat(child, "number-rows-repeated"), MAX_ROWS - row)
                hit = [r for r in rows_wanted if row <= r < row + count]
                if hit:
                    col = 0
                    for cell in child:
                        if cell.tag not in _CELLS or col >= MAX_COLS:
                            continue
                        span = min(_repeat(cell, "number-columns-repeated"), MAX_COLS - col)
                        for r in hit:
                            for c in rows_wanted[r]:
                                if col <= c < col + span:
                                    yield (r, c), cell
                        col += span
                row += count

    yield from walk(table)


def _ods_text(cell: ET.Element) -> str:
    """The text of a cell's paragraphs: text:s spaces, tabs and line breaks included, paragraphs by newline."""

    def inline(node: ET.Element) -> str:
        parts = [node.text or ""]
        for child in node:
            if child.tag == f"{{{_TEXT}}}s":
                parts.append(" " * min(int(child.get(f"{{{_TEXT}}}c", "1")), _MAX_SPACES))
            elif child.tag == f"{{{_TEXT}}}tab":
                parts.append("\t")
            elif child.tag == f"{{{_TEXT}}}line-break":
                parts.append("\n")
            elif child.tag != f"{{{_OFFICE}}}annotation":  # a comment is not the cell's text
                parts.append(inline(child))
            parts.append(child.tail or "")
        return "".join(parts)

    return "\n".join(inline(p) for p in cell.iterfind(f"{{{_TEXT}}}p"))


def _ods_value(cell: ET.Element) -> Any:
    """A cell's value by office:value-type: numbers (float, percentage, currency), booleans, dates
    (datetime), times (time of day), strings; a formula cell's computed result is stored the same way."""
    kind = cell.get(f"{{{_OFFICE}}}value-type")
    if cell.get(f"{{{_CALCEXT}}}value-type") == "error":
        return _ods_text(cell)  # LibreOffice stores a formula's error as an empty string plus its text, #DIV/0!
    if kind in ("float", "percentage", "currency"):
        return float(cell.get(f"{{{_OFFICE}}}value", "nan"))
    if kind == "boolean":
        return cell.get(f"{{{_OFFICE}}}boolean-value", "").strip().lower() == "true"
    if kind == "date":
        return dt.datetime.fromisoformat(cell.get(f"{{{_OFFICE}}}date-value", ""))
    if kind == "time":
        raw = cell.get(f"{{{_OFFICE}}}time-value", "")
        match = _DURATION.fullmatch(raw)
        if not match or raw.startswith("-"):
            return raw
        days, hours, minutes, seconds = (float(g or 0) for g in match.groups())
        total = dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if total >= dt.timedelta(days=1):
            return raw  # a duration, not a time of day
        return (dt.datetime.min + total).time()
    if kind == "string":
        string = cell.get(f"{{{_OFFICE}}}string-value")
        return string if string is not None else _ods_text(cell)
    text = _ods_text(cell)  # no value type: empty, or an error a formula produced (#DIV/0!)
    return text or None


def read_ods(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, Any]:
    """OpenDocument spreadsheet (LibreOffice Calc's format): each wanted cell's value as Calc computed it."""
    table = _ods_table(data, sheet)
    return {at: _ods_value(cell) for at, cell in _ods_cells(table, list(cells))}


_ODS_REF = re.compile(r"\[\$?'?([^\]]*?)'?\]")


def read_ods_formulas(data: bytes, sheet: str | None, cells: Iterable[Cell]) -> dict[Cell, str]:
    """Formulas in spreadsheet notation: ``of:=SUM([.B2:.B3])`` reads ``=SUM(B2:B3)``."""
    table = _ods_table(data, sheet)
    out: dict[Cell, str] = {}
    for at, cell in _ods_cells(table, list(cells)):
        formula = cell.get(f"{{{_TABLE}}}formula")
        if formula:
            formula = formula.split(":", 1)[1] if re.match(r"[a-z]+:=", formula) else formula
            refs = _ODS_REF.sub(lambda m: m.group(1).lstrip(".").replace(":.", ":"), formula)
            out[at] = refs.replace(";", ",")
    return out


READERS: dict[str, Reader] = {
    "csv": read_csv,
    "tsv": read_tsv,
    "xlsx": read_xlsx,
    "xlsm": read_xlsx,
    "gnumeric": read_gnumeric,
    "ods": read_ods,
}

FORMULA_READERS: dict[str, Reader] = {
    "xlsx": read_xlsx_formulas,
    "xlsm": read_xlsx_formulas,
    "gnumeric": read_gnumeric_formulas,
    "ods": read_ods_formulas,
}
