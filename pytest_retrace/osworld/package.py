"""OSWorld's own evaluation code, the ``desktop-env`` package from PyPI, loaded one module at a time.

``desktop_env.evaluators.metrics`` and ``.getters`` import every submodule from their ``__init__``, and those
import what OSWorld's whole evaluation needs: torch through easyocr, librosa, OpenCV, cloud SDKs. A task
comparing two spreadsheets needs none of them. So nothing here imports those packages: the names a package
exports are read from its ``__init__`` with :mod:`ast`, the parent packages are put into ``sys.modules`` as empty
packages with the real ``__path__``, and only the submodule that defines a function is imported.

A module imported at the top of such a submodule that is not installed is served, for the length of that import
only, by a stand-in whose every use raises :class:`Unavailable`: ``docs.py`` imports easyocr for one metric of
its thirty, and the other twenty-nine work without it. Which installed modules a function needs is read from
its code (the top-level imports it refers to, following the module's own helpers and what it imports from its
siblings), so ``retrace osworld check`` can name a missing package per task before anything runs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

DISTRIBUTION = "desktop-env"
PINNED = "1.0.2"  # the version whose code docs/osworld.md measured; pyproject's `osworld` extra installs it
INSTALL = "pip install --no-deps desktop-env==1.0.2 && pip install 'pytest-retrace[osworld]'"
Kind = Literal["metric", "getter"]
_PACKAGES = {"metric": "desktop_env.evaluators.metrics", "getter": "desktop_env.evaluators.getters"}
# What pip calls the modules desktop-env's evaluators import, where the two names differ.
PIP_NAMES = {
    "cv2": "opencv-python-headless", "fitz": "pymupdf", "docx": "python-docx", "pptx": "python-pptx",
    "odf": "odfpy", "bs4": "beautifulsoup4", "acoustid": "pyacoustid", "dotenv": "python-dotenv",
    "PIL": "pillow", "skimage": "scikit-image", "yaml": "pyyaml", "pydrive": "PyDrive",
    "requests_toolbelt": "requests-toolbelt", "easyocr": "easyocr (needs torch)", "Xlib": "python-xlib",
    "PyPDF2": "PyPDF2", "sklearn": "scikit-learn",
}


class Unavailable(RuntimeError):
    """desktop-env, or a package one of its functions needs, is not installed (the message says which)."""


@dataclass(frozen=True)
class Entry:
    """A metric or getter desktop-env exports: where it is defined and which modules its code uses."""

    kind: Kind
    name: str  # the metric's name, or the getter's type (its function is get_<type>)
    module: str  # dotted name of the submodule defining it
    function: str
    needs: frozenset[str]  # top-level modules (outside desktop_env) the function's code refers to


# --- the installed package -------------------------------------------------------------------------------


@cache
def root() -> Path | None:
    """The installed ``desktop_env`` directory (found without importing it), or None."""
    spec = importlib.util.find_spec("desktop_env")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_problem() -> str | None:
    """Why desktop-env cannot be used at all, or None."""
    if root() is None:
        return f"OSWorld's desktop-env is not installed ({INSTALL})"
    found = version()
    if found != PINNED:
        return f"desktop-env {found} is installed, but retrace is measured against {PINNED} ({INSTALL})"
    return None


def _source(dotted: str) -> Path:
    base = root()
    assert base is not None
    parts = dotted.split(".")[1:]
    path = base.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@cache
def _tree(dotted: str) -> ast.Module:
    return ast.parse(_source(dotted).read_text(encoding="utf-8"), filename=str(_source(dotted)))


# --- what each function needs ---------------------------------------------------------------------------


def _resolve(module: str, level: int, target: str | None) -> str:
    """An import's absolute module name, seen from ``module`` (a relative import has ``level`` dots)."""
    if not level:
        return target or ""
    package = module if _source(module).name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def _bindings(module: str, statements: Sequence[ast.stmt]) -> dict[str, tuple[str, str | None]]:
    """Names bound by the import statements among ``statements`` (and in their if/try blocks): name ->
    (absolute module, the attribute imported from it or None for ``import x``)."""
    bound: dict[str, tuple[str, str | None]] = {}
    for node in _statements(statements):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.partition(".")[0]
                    bound[top] = (top, None)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node.level, node.module)
            for alias in node.names:
                bound[alias.asname or alias.name] = (source, alias.name)
    return bound


def _statements(statements: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements and those inside their if/try blocks (an optional import sits in a try)."""
    for node in statements:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            yield from _statements([*node.body, *node.orelse, *getattr(node, "finalbody", []),
                                    *(s for h in getattr(node, "handlers", []) for s in h.body)])


@cache
def _definitions(module: str) -> dict[str, ast.AST]:
    """The module's top-level functions and classes by name."""
    return {node.name: node for node in _tree(module).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _needs(module: str, name: str, seen: set[tuple[str, str]]) -> set[str]:
    """Top-level modules outside desktop_env that ``module.name``'s code refers to, followed through the
    module's own helpers and what it imports from desktop_env's other modules."""
    if (module, name) in seen or name not in _definitions(module):
        return set()
    seen.add((module, name))
    node = _definitions(module)[name]
    top_level = _bindings(module, _tree(module).body)
    local = _bindings(module, [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))])
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    needs = {source.partition(".")[0] for source, _ in local.values() if not source.startswith("desktop_env")}
    for word in used:
        if word in _definitions(module) and word != name:
            needs |= _needs(module, word, seen)
        elif word in top_level or word in local:
            source, attribute = local.get(word) or top_level[word]
            if not source.startswith("desktop_env"):
                needs.add(source.partition(".")[0])
            elif attribute is not None and _source(source).is_file():
                needs |= _needs(source, attribute, seen)
    for source, attribute in local.values():  # function-level `from .docs import compare_docx_files`
        if source.startswith("desktop_env") and attribute is not None and _source(source).is_file():
            needs |= _needs(source, attribute, seen)
    return needs


def refers_to(found: Entry, word: str) -> bool:
    """Whether the function's code, or a helper of its module it calls, names ``word`` (as a name or an
    attribute: ``env.controller.get_accessibility_tree()`` names ``get_accessibility_tree``)."""
    seen: set[str] = set()
    todo = [found.function]
    while todo:
        name = todo.pop()
        node = _definitions(found.module).get(name)
        if name in seen or node is None:
            continue
        seen.add(name)
        for child in ast.walk(node):
            named = child.attr if isinstance(child, ast.Attribute) else child.id if isinstance(child, ast.Name) else None
            if named == word:
                return True
            if named in _definitions(found.module):
                todo.append(named)
    return False


@cache
def index() -> dict[Kind, dict[str, Entry]]:
    """Every metric and getter desktop-env's packages export, by metric name and getter type; empty when the
    package is not installed. Read from the source: nothing is imported."""
    found: dict[Kind, dict[str, Entry]] = {"metric": {}, "getter": {}}
    if root() is None:
        return found
    for kind, package in _PACKAGES.items():
        exported = {name: (source, attribute or name)
                    for name, (source, attribute) in _bindings(package, _tree(package).body).items()
                    if source.startswith(package + ".")}
        exported.update({name: (package, name) for name in _definitions(package)})
        for name, (module, function) in sorted(exported.items()):
            if kind == "getter":
                if not name.startswith("get_"):
                    continue
                name = name.removeprefix("get_")
            found[kind][name] = Entry(kind, name, module, function, frozenset(_needs(module, function, set())))  # type: ignore[index]
    return found


def entry(kind: Kind, name: str) -> Entry | None:
    return index()[kind].get(name)


def missing(modules: frozenset[str] | set[str]) -> list[str]:
    """The modules among ``modules`` that cannot be imported here, as pip names them."""
    return sorted(PIP_NAMES.get(m, m) for m in modules if not _importable(m))


@cache
def _importable(module: str) -> bool:
    if module in sys.builtin_module_names or module in sys.stdlib_module_names:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def problem(kind: Kind, name: str) -> str | None:
    """Why the metric or getter ``name`` cannot run here (not in desktop-env, a package it needs is missing),
    or None."""
    if (whole := package_problem()) is not None:
        return whole
    found = entry(kind, name)
    if found is None:
        return f"desktop-env {PINNED} has no {kind} {name!r}"
    if lacking := missing(found.needs):
        return f"{kind} {name} needs {', '.join(lacking)}, not installed"
    return None


# --- loading ---------------------------------------------------------------------------------------------

_LOCK = threading.Lock()  # sys.modules and sys.meta_path are the interpreter's: one load at a time


def load(kind: Kind, name: str) -> Callable[..., Any]:
    """The metric or getter function, its module imported alone; Unavailable names what is missing."""
    if (why := problem(kind, name)) is not None:
        raise Unavailable(why)
    found = entry(kind, name)
    assert found is not None
    return getattr(load_module(found.module), found.function)


def load_module(dotted: str) -> types.ModuleType:
    """``desktop_env.<...>`` imported without running its parents' ``__init__``; the modules it imports that
    are not installed become stand-ins raising :class:`Unavailable` when used."""
    if (why := package_problem()) is not None:
        raise Unavailable(why)
    with _LOCK:
        if dotted in sys.modules:
            return sys.modules[dotted]
        _parents(dotted)
        absent = _Absent(_absent_imports())
        sys.meta_path.insert(0, absent)
        try:
            return importlib.import_module(dotted)
        except ImportError as exc:  # installed but broken (a compiled part missing): as good as absent
            raise Unavailable(f"{dotted} cannot be imported: {exc}") from exc
        finally:
            sys.meta_path.remove(absent)
            for name in absent.served:  # a later `import cv2` elsewhere must still fail as it should
                sys.modules.pop(name, None)


def _parents(dotted: str) -> None:
    """Every package above ``dotted`` as an empty module with the real ``__path__``: their ``__init__``s would
    import everything."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name in sys.modules:
            continue
        path = str(_source(name).parent)
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [path]
        module = importlib.util.module_from_spec(spec)
        module.__path__ = [path]
        sys.modules[name] = module
        if i > 1:
            setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], module)


@cache
def _absent_imports() -> frozenset[str]:
    """The top-level modules desktop-env's evaluators and controllers import that are not installed here."""
    base = root()
    assert base is not None
    tops: set[str] = set()
    for path in [*base.glob("evaluators/*/*.py"), *base.glob("controllers/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                tops |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops.add(node.module.partition(".")[0])
    return frozenset(t for t in tops if t != "desktop_env" and not _importable(t))


class _Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a stand-in for the modules desktop-env imports that are not installed, for one load; any other
    import is left alone (the standard library's own `try: import _winapi` must still fail)."""

    def __init__(self, absent: frozenset[str]) -> None:
        self.absent = absent
        self.served: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.absent:
            return None
        self.served.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


class _StandIn(types.ModuleType):
    """A module that is not installed: importing names from it works, using any of them raises."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Missing(f"{self.__name__}.{attribute}", self.__name__.partition(".")[0])


class _Missing:
    def __init__(self, what: str, module: str) -> None:
        self._what, self._module = what, module

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise Unavailable(f"{self._what} needs {PIP_NAMES.get(self._module, self._module)}, which is not installed")

    __call__ = __iter__ = __enter__ = _fail

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Missing(f"{self._what}.{attribute}", self._module)
