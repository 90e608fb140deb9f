"""Spreadsheet cell metrics: ``compare_cells`` (alias ``compare_cell``) over CSV/TSV, XLSX, Gnumeric and ODS.

Cells are compared by value as the application computes it (a formula cell by its result: see
sheet_readers). An expected string starting with ``=`` instead names a formula: it matches a cell holding
that formula (case and spaces ignored; in CSV/TSV, which have no formulas, the cell's text).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import PurePosixPath
from typing import Any

from pytest_retrace.evaluators.base import NOT_LITERAL, CheckSpec, EvaluatorError, Score, register_metric
from pytest_retrace.evaluators.sheet_readers import FORMULA_READERS, READERS, parse_ref
from pytest_retrace.evaluators.ssconvert import ConversionFailed
from pytest_retrace.evaluators.values import as_text, mapping_or_error, short

_SCALARS = (str, int, float, bool, type(None))


def _wanted_cells(expected: Any) -> dict[str, Any]:
    """``{cells: {"A1": v, ...}}`` or ``{cell: "A1", value: v}`` as ``{"A1": v}`` (refs validated)."""
    spec = mapping_or_error(expected)
    if set(spec) == {"cell", "value"}:
        cells = {spec["cell"]: spec["value"]}
    elif set(spec) == {"cells"}:
        cells = dict(mapping_or_error(spec["cells"], "expected.cells"))
    else:
        raise EvaluatorError(
            f"expected must be {{cells: {{A1: value}}}} or {{cell, value}}, got keys {sorted(spec)}"
        )
    if not cells:
        raise EvaluatorError("expected.cells must not be empty")
    for ref, value in cells.items():
        try:
            parse_ref(str(ref))
        except ValueError as exc:
            raise EvaluatorError(f"expected.cells: {exc}") from None
        if not isinstance(value, _SCALARS):
            raise EvaluatorError(f"expected.cells[{ref!r}] must be a string, number, boolean or null")
    return cells


def resolve_format(fmt: str | None, path: str | None) -> str:
    """The reader to use: the ``format`` option, else the result path's extension."""
    if fmt is not None and not isinstance(fmt, str):
        raise EvaluatorError(f"options.format must be a string, got {short(fmt)}")
    if fmt is None and path is not None:
        fmt = PurePosixPath(path).suffix.lstrip(".")
    if not fmt:
        raise EvaluatorError(
            "cannot tell the spreadsheet format: set options.format or use a path with an extension"
        )
    if fmt.lower() not in READERS:
        raise EvaluatorError(f"unsupported spreadsheet format {fmt!r} (known: {', '.join(READERS)})")
    return fmt.lower()


def _check_cells(spec: CheckSpec) -> None:
    path = spec.result.get("path")
    resolve_format(spec.options.get("format"), path if isinstance(path, str) else None)
    if not isinstance(spec.options.get("sheet"), (str, type(None))):
        raise EvaluatorError("options.sheet must be a sheet name (string)")
    if spec.expected is not NOT_LITERAL:
        _wanted_cells(spec.expected)


def _as_number(value: Any) -> float | None:
    """A cell value as a number; numeric-looking text counts (CSV has no types)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"  # how spreadsheets display booleans
    if isinstance(value, dt.datetime) and value.time() == dt.time(0):
        return value.date().isoformat()  # xlsx stores plain dates as midnight datetimes
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    return str(value)


class _Formula(str):
    """A cell's formula text, for an expected value naming a formula."""


class _NoFormula:
    """A cell without a formula where the case expects one: matches no formula; shows its value."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _names_formula(wanted: Any) -> bool:
    return isinstance(wanted, str) and wanted.startswith("=")


def _formula_key(text: str) -> str:
    return "".join(text.split()).upper()


def cell_matches(actual: Any, wanted: Any, abs_tol: float) -> bool:
    """Numbers numerically (within abs_tol), booleans by truth, None as empty, other strings exactly;
    formulas (read for an expected ``=...``) by their text, ignoring case and spaces."""
    if isinstance(actual, _NoFormula):
        return False
    if isinstance(actual, _Formula):
        return _names_formula(wanted) and _formula_key(actual) == _formula_key(wanted)
    if wanted is None:
        return actual is None or actual == ""
    if isinstance(wanted, bool):
        return (
            actual is wanted
            if isinstance(actual, bool)
            else _cell_text(actual).strip().upper() == _cell_text(wanted)
        )
    numeric_cell = isinstance(actual, (int, float)) and not isinstance(actual, bool)
    if isinstance(wanted, (int, float)) or numeric_cell:
        # "42" in a case file must match a numeric 42.0 cell; 42 must match CSV text "42".
        got, want = _as_number(actual), _as_number(wanted)
        if got is not None and want is not None:
            return math.isclose(got, want, rel_tol=0.0, abs_tol=abs_tol)
        if isinstance(wanted, (int, float)):
            return False
    return _cell_text(actual) == str(wanted)


def _show(actual: Any) -> str:
    if isinstance(actual, _NoFormula):
        return f"{_show(actual.value)} (no formula)"
    if isinstance(actual, _Formula):
        return f"formula {short(str(actual), 24)}"
    return "<empty>" if actual is None or actual == "" else short(actual, 24)


def _spreadsheet_bytes(result: Any) -> bytes:
    if isinstance(result, bytes):
        return result
    return as_text(result).encode("utf-8")  # CSV text from a command; None -> "file does not exist"


@register_metric("compare_cells", check=_check_cells)
def compare_cells(
    result: Any,
    expected: Any,
    *,
    format: str | None = None,
    sheet: str | None = None,
    abs_tol: float = 1e-9,
    _path: str | None = None,
) -> Score:
    """Cells of the spreadsheet (first sheet unless ``sheet``) hold the expected values."""
    fmt = resolve_format(format, _path)
    wanted = _wanted_cells(expected)
    coords = {ref: parse_ref(str(ref)) for ref in wanted}
    data = _spreadsheet_bytes(result)
    try:
        values = READERS[fmt](data, sheet, coords.values())
        formula_refs = [ref for ref, want in wanted.items() if _names_formula(want)]
        if formula_refs and fmt in FORMULA_READERS:
            formulas = FORMULA_READERS[fmt](data, sheet, [coords[ref] for ref in formula_refs])
            for ref in formula_refs:  # such a cell is compared by its formula, not its value
                values[coords[ref]] = _Formula(formulas[coords[ref]]) if coords[ref] in formulas else _NoFormula(
                    values.get(coords[ref]))
    except ConversionFailed as exc:
        raise ConversionFailed(f"{_path or 'the spreadsheet'}: {exc}") from None
    mismatches = [
        f"{ref}: {_show(values.get(coords[ref]))} != {short(want, 24)}"
        for ref, want in wanted.items()
        if not cell_matches(values.get(coords[ref]), want, abs_tol)
    ]
    if mismatches:
        return Score.fail(
            "; ".join(mismatches[:3]) + (f"; +{len(mismatches) - 3} more" if len(mismatches) > 3 else "")
        )
    return Score.ok(f"{len(wanted)} cell(s) match")


register_metric("compare_cell", check=_check_cells)(compare_cells)
