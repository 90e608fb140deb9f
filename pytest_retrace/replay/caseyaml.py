"""Reading a case file's YAML safely: size-checked, and parsed by a SafeLoader that refuses what a case file
never needs and a hostile one can abuse (duplicate keys, deep nesting, alias bombs, huge integers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import ScalarEvent
from yaml.nodes import MappingNode, Node, SequenceNode
from yaml.resolver import Resolver

from pytest_retrace.text import show as _show

# Case files are input, not trusted code: these bound what loading one may cost or accept.
MAX_FILE_BYTES = 1 << 20  # real cases are a few KiB
# Values in the document, also once aliases are expanded (a few lines of anchors can describe 10^9): real
# cases hold under 200, and PyYAML's pure-Python composer takes about 30 µs per value.
MAX_YAML_NODES = 10_000
MAX_YAML_DEPTH = 50  # nesting levels; real cases need fewer than 10, and PyYAML's composer recurses


class CaseError(Exception):
    """A case file that cannot be used; str() names the file and the field."""

    def __init__(self, path: Path | str, field: str, message: str) -> None:
        self.path, self.field, self.message = Path(path), field, message
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")


class _CaseChecks:
    """What a case file never needs and a hostile one can abuse, refused: duplicate keys (PyYAML silently
    keeps the last), nesting deep enough to exhaust the composer's recursion, aliases that expand to millions
    of values (a "billion laughs"), and integers too long to convert. Mixed into a SafeLoader below."""

    _depth = 0
    _nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        # checked while composing, so that a huge or deep document is abandoned early, not after the fact
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise ComposerError(None, None, f"more than {MAX_YAML_NODES} values", self.peek_event().start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
        event = self.peek_event()
        if isinstance(event, ScalarEvent) and event.tag == "!":
            # YAML's non-specific tag: libyaml reads `!` as a string and PyYAML's own parser as null; a case
            # file never needs it, and it must not mean two things
            raise ComposerError(None, None, "the non-specific tag '!' is not allowed", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node:
        node = super().compose_document()
        # Walk the document as construction will see it, every alias expanded, and stop at the cap:
        # the walk itself is bounded, also for a recursive alias (`&a [*a]`), which exceeds the depth.
        count, stack = 0, [(node, 1)]
        while stack:
            item, depth = stack.pop()
            count += 1
            if count > MAX_YAML_NODES:
                raise ComposerError(None, None, f"more than {MAX_YAML_NODES} values once aliases are "
                                    "expanded", item.start_mark)
            if depth > MAX_YAML_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels once aliases "
                                    "are expanded", item.start_mark)
            if isinstance(item, SequenceNode):
                stack += [(child, depth + 1) for child in item.value]
            elif isinstance(item, MappingNode):
                stack += [(child, depth + 1) for pair in item.value for child in pair]
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` may be overridden by the mapping's own keys
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable: the base class reports it
            if duplicate:
                raise ConstructorError("while constructing a mapping", node.start_mark,
                                       f"found duplicate key {_show(key)}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Node) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # over Python's int-to-str limit (4300 digits)
            raise ConstructorError(None, None, "integer too large", node.start_mark) from None


class CaseLoader(_CaseChecks, yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's SafeLoader with the checks above, all in Python."""


CaseLoader.add_constructor("tag:yaml.org,2002:int", CaseLoader.construct_yaml_int)

if getattr(yaml, "__with_libyaml__", False):
    from yaml._yaml import CParser

    class FastCaseLoader(_CaseChecks, Composer, SafeConstructor, Resolver, CParser):  # type: ignore[misc]
        """The same checks, on libyaml's events: the C parser scans (three quarters of the pure-Python
        loader's time, and every xdist worker loads every case at collection), while nodes are still composed
        in Python, where the checks above run as the document is built. Yields exactly CaseLoader's result
        (tests/replay/test_caseyaml.py)."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    FastCaseLoader.add_constructor("tag:yaml.org,2002:int", FastCaseLoader.construct_yaml_int)
    LOADER: type = FastCaseLoader
else:  # PyYAML built without libyaml
    LOADER = CaseLoader


def read_case_bytes(path: Path) -> bytes:
    """A case file's bytes, or CaseError: only a regular file, and at most MAX_FILE_BYTES of it."""
    try:
        if not path.is_file():  # a FIFO or a device would block or never end
            raise CaseError(path, "", "not a regular file" if path.exists() else "file not found")
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise CaseError(path, "", f"cannot read: {exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CaseError(path, "", f"the file is larger than {MAX_FILE_BYTES} bytes")
    return data


def parse_yaml(path: Path, data: bytes) -> Any:
    """The YAML document of ``data`` (read from ``path``, which errors name), or CaseError."""
    try:
        return yaml.load(data.decode("utf-8"), Loader=LOADER)  # a SafeLoader with the checks
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CaseError(path, where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except UnicodeDecodeError as exc:
        raise CaseError(path, "", f"cannot read: {exc}") from None
