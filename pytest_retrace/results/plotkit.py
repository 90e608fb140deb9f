"""What every figure of a run shares (results.plots: the recovery rates; results.paper_figures: the paper's
Figures 3, 7 and 8): the formats, the size, the deterministic style, and writing a set of figures where one that
fails is reported by its file and the others are still written.

matplotlib is imported only when a figure is drawn, and never through pyplot: a ``Figure`` rendered by Agg
needs no display and does not switch the backend of a process that imported this module. The figures are
deterministic for the same data and matplotlib version: matplotlib's default style rather than the user's
matplotlibrc, fixed sizes and dpi, no "Software" / "Creator" / date metadata, and a fixed salt for the SVG's
element ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS: tuple[str, ...] = (".png", ".pdf", ".svg")  # every figure in each; a figure is named by its PNG
_METADATA: dict[str, dict[str, Any]] = {  # what would make two drawings of the same data differ
    ".png": {"Software": None}, ".pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    ".svg": {"Creator": None, "Date": None},
}
DPI = 120
HEIGHT = 4.8  # inches; widths grow with the number of bars, within bounds


class PlotError(RuntimeError):
    """A figure could not be written; the message names the file."""


def remove(files: list[Path]) -> None:
    for file in files:
        if file.is_file():
            file.unlink()


@contextlib.contextmanager
def style() -> Iterator[None]:
    import matplotlib.style

    # not the user's matplotlibrc: the same data, the same files (the SVG's ids are salted hashes)
    with matplotlib.style.context("default"), matplotlib.rc_context({"svg.hashsalt": "pytest-retrace"}):
        yield


def figure(width: float, panels: int = 1) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    height = HEIGHT if panels == 1 else min(2.2 + 2.6 * panels, 14.0)
    fig = Figure(figsize=(min(max(width, 6.0), 16.0), height), dpi=DPI, layout="constrained")
    axes = fig.subplots(panels, 1, squeeze=False, sharex=True)
    return fig, [row[0] for row in axes]


def percent_axis(ax: Axes, top: float = 118.0, bottom: float = 0.0, label: str = "recovery rate (%)") -> None:
    ax.set_ylim(bottom, top)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def write_figures(summary: Any, out_dir: Path, draw: Mapping[str, Callable[[Any], Figure]], skip: set[str],
                  errors: list[str] | None) -> list[Path]:
    """Draw each figure of ``draw`` not in ``skip`` into ``out_dir`` in every format; a skipped one has its files
    from an earlier call removed (nothing links a stale picture). A figure that fails raises :class:`PlotError`
    naming its file, or is recorded in ``errors`` when given, and the others are still written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw_one in draw.items():
        path = out_dir / name
        files = [path.with_suffix(suffix) for suffix in FORMATS]
        if name in skip:
            remove(files)
            continue
        try:
            with style():
                fig = draw_one(summary)
                for file in files:
                    fig.savefig(file, dpi=DPI, metadata=_METADATA[file.suffix], facecolor="white")
        except Exception as exc:  # any failure of one figure is reported with its file
            remove(files)
            message = f"{path}: {type(exc).__name__}: {exc}"
            if errors is None:
                raise PlotError(message) from exc
            errors.append(message)
        else:
            written.append(path)
    return written
