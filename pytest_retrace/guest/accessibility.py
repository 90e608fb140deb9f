"""OSWorld's ``GET /accessibility``: the desktop's AT-SPI tree as the XML OSWorld's VM server gives, which
desktop-env's getters and metrics parse (``accessibility_tree``, ``active_url_from_accessTree`` and the getters
built on it, ``check_accessibility_tree``).

The tree is read inside the desktop, by a script run with the desktop's own ``python3`` and Debian's pyatspi
(python3-pyatspi) through the backend, as the task's user with the task's environment: the harness's venv
has no pyatspi, and only the task's processes see its session bus. A task runs with AT-SPI on only when it asks
(``Task.accessibility``): otherwise the script finds the bus disabled and the answer is a 501 naming the
option. The format, as OSWorld's server writes it: a ``desktop-frame`` root, one element per accessible named
by its role (spaces as ``-``), its name in ``name``, its states as ``st:<state>="true"``, its object attributes
as ``attr:<name>``, where it is showing its screen position and size as ``cp:screencoord="(x, y)"`` and
``cp:size="(w, h)"``, its text (U+FFFC and U+FFFD left out) as the element's text, ``image``/``selection``
when it has those interfaces, ``val:value|min|max|step``, ``act:<action>_desc`` and ``_kb``; at most 50 levels
deep and 1024 children a node. Differences: Chromium's application is named "Google Chrome", as on OSWorld's
x86 VMs (these desktops' google-chrome is Debian's chromium, and desktop-env looks Chrome up by that name;
on arm, where OSWorld's VMs run Chromium, it keeps its name); a LibreOffice Calc table gives its first 1024
cells, not the ones showing; a name, attribute or text that XML cannot hold (control characters) loses them.
"""

from __future__ import annotations

import base64
import zlib

from pytest_retrace.guest.backend import GuestBackend

TREE_TIMEOUT = 60.0  # seconds for the whole tree: a large LibreOffice or Thunderbird window takes a few
OFF, NO_PYATSPI = 3, 4  # the script's exit codes for its two 501s
ACCESSIBILITY_OFF = ("the accessibility tree is off for this task: its apps run without AT-SPI. A task whose "
                     "judge reads the tree sets `accessibility: true` (retrace build --osworld sets it for "
                     "OSWorld's tasks that need it), on a provider that starts the buses (xvfb, or docker "
                     "with variant=osworld)")

# Run as ``python3 -c`` inside the desktop: the standard library and pyatspi only. It prints the tree
# zlib-compressed and base64-encoded (a command's output is capped at 1 MiB; a tree compresses ~10x).
SCRIPT = r'''
import base64, os, platform, re, sys, zlib
import xml.etree.ElementTree as ET
if os.environ.get("DBUS_SESSION_BUS_ADDRESS", "disabled:").startswith("disabled:") or \
        os.environ.get("NO_AT_BRIDGE") == "1":
    sys.exit(%(off)d)
try:
    import pyatspi
except ImportError as exc:
    print(f"pyatspi is not importable by this desktop's python3 ({exc}): install python3-pyatspi")
    sys.exit(%(no_pyatspi)d)
NS = {k: f"https://accessibility.ubuntu.example.org/ns/{v}" for k, v in (
    ("st", "state"), ("attr", "attributes"), ("cp", "component"), ("doc", "document"),
    ("docattr", "document/attributes"), ("txt", "text"), ("val", "value"), ("act", "action"))}
for prefix, uri in NS.items():
    ET.register_namespace(prefix, uri)
MAX_DEPTH, MAX_WIDTH = 50, 1024
NAME = re.compile(r"^[A-Za-z_][\w.-]*$")
BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
CHROME = "Chromium" if "arm" in platform.machine() else "Google Chrome"

def clean(text):
    return BAD.sub("", str(text))

def q(prefix, name):
    return "{%%s}%%s" %% (NS[prefix], name)

def attributes(node, app):
    found = {"name": clean(node.name or "")}
    if app and found["name"] == "Chromium":
        found["name"] = CHROME
    for state in node.getState().get_states():
        name = pyatspi.stateToString(state).replace(" ", "_")
        if name:
            found[q("st", name)] = "true"
    try:
        pairs = node.get_attributes() or {}
    except Exception:
        pairs = {}
    for key, value in pairs.items():
        if NAME.match(key):
            found[q("attr", key)] = clean(value)
    if found.get(q("st", "visible")) == found.get(q("st", "showing")) == "true":
        try:
            box = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
            found[q("cp", "screencoord")] = str((box.x, box.y))
            found[q("cp", "size")] = str((box.width, box.height))
        except NotImplementedError:
            pass
    for interface, key in (("queryImage", "image"), ("querySelection", "selection")):
        try:
            getattr(node, interface)()
            found[key] = "true"
        except NotImplementedError:
            pass
    try:
        value = node.queryValue()
        for key, read in (("value", "currentValue"), ("min", "minimumValue"), ("max", "maximumValue"),
                          ("step", "minimumIncrement")):
            try:
                found[q("val", key)] = str(getattr(value, read))
            except Exception:
                pass
    except NotImplementedError:
        pass
    try:
        action = node.queryAction()
        for i in range(action.nActions):
            name = action.getName(i).replace(" ", "-")
            if NAME.match(name):
                found[q("act", name + "_desc")] = clean(action.getDescription(i))
                found[q("act", name + "_kb")] = clean(action.getKeyBinding(i))
    except NotImplementedError:
        pass
    return found

def element(node, depth):
    role = (node.getRoleName() or "").strip()
    tag = role.replace(" ", "-") or "unknown"
    out = ET.Element(tag if NAME.match(tag) else "unknown", attributes(node, role == "application"))
    try:
        text = node.queryText()
        out.text = clean(text.getText(0, text.characterCount)).replace("\ufffc", "").replace("\ufffd", "") or None
    except NotImplementedError:
        pass
    if depth < MAX_DEPTH:
        try:
            for i, child in enumerate(node):
                if i == MAX_WIDTH:
                    break
                if child is not None:
                    out.append(element(child, depth + 1))
        except Exception as exc:  # an app that went away while it was read: what was read stays
            print(f"children of a {role}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return out

root = ET.Element("desktop-frame")
for app in pyatspi.Registry.getDesktop(0):
    if app is not None:
        try:
            root.append(element(app, 1))
        except Exception as exc:
            print(f"an application: {type(exc).__name__}: {exc}", file=sys.stderr)
data = ET.tostring(root, encoding="unicode").encode()
sys.stdout.write(base64.b64encode(zlib.compress(data, 6)).decode())
''' % {"off": OFF, "no_pyatspi": NO_PYATSPI}


def accessibility_tree(backend: GuestBackend, timeout: float = TREE_TIMEOUT) -> tuple[int, str]:
    """(200, the tree's XML), or the HTTP status and why not: 501 with accessibility off or no pyatspi in the
    desktop, 500 when the script failed or did not finish within `timeout` seconds."""
    res = backend.run(["python3", "-c", SCRIPT], False, timeout)
    code, output = res["returncode"], res["output"]
    if code == OFF:
        return 501, ACCESSIBILITY_OFF
    if code == NO_PYATSPI:
        return 501, f"the accessibility tree cannot be read here: {output.strip()}"
    if code == 124:
        return 500, f"the accessibility tree was not read within {timeout:g} s"
    if code != 0:
        return 500, f"reading the accessibility tree failed (exit status {code}): {res['error'][-600:].strip()}"
    try:
        return 200, zlib.decompress(base64.b64decode(output, validate=True)).decode()
    except (ValueError, zlib.error) as exc:  # cut at the output cap, or not the script's output at all
        return 500, f"the accessibility tree's output ({len(output)} characters) is not whole: {exc}"
