"""Prints the state of every page chromium has open, read over its DevTools port on loopback (127.0.0.1:9222):
URL, scroll offsets, focused element and every form field's value. A probe: what a mistake changed in a page
off screen (a field scrolled out of view, a checkbox in a closed section) shows here and nowhere else."""
import base64, json, os, socket, struct, sys, urllib.request

PORT = 9222
JS = r"""JSON.stringify({url: location.href, x: scrollX, y: scrollY,
 focus: document.activeElement ? (document.activeElement.id || document.activeElement.tagName) : null,
 fields: Array.from(document.querySelectorAll('input,select,textarea,details')).map(e =>
   [e.id || e.name || e.tagName, e.tagName == 'DETAILS' ? e.open : (e.type == 'checkbox' || e.type == 'radio') ? e.checked : e.value])})"""


def ws_call(url, method, params):
    host, rest = url[len("ws://"):].split("/", 1)
    h, p = host.split(":")
    s = socket.create_connection((h, int(p)), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /{rest} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    buf = buf.split(b"\r\n\r\n", 1)[1]
    data = json.dumps({"id": 1, "method": method, "params": params}).encode()
    mask = os.urandom(4)
    head = bytes([0x81]) + (bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0x80 | 126]) + struct.pack(">H", len(data)))
    s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def read(n):
        nonlocal buf
        while len(buf) < n:
            chunk = s.recv(65536)
            if not chunk:
                raise EOFError
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out

    while True:
        b1, b2 = read(2)
        n = b2 & 0x7F
        if n == 126:
            n = struct.unpack(">H", read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", read(8))[0]
        msg = json.loads(read(n))
        if msg.get("id") == 1:
            s.close()
            return msg


if sys.argv[1:] == ["--wait"]:  # setup: until the page has loaded and painted twice (up to 90 s)
    import time
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            pages = [t for t in json.load(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/json/list", timeout=5))
                     if t["type"] == "page" and t["url"].startswith("file://")]
            if pages:
                r = ws_call(pages[0]["webSocketDebuggerUrl"], "Runtime.evaluate", {"awaitPromise": True, "returnByValue": True,
                            "expression": "new Promise(ok => { const go = () => requestAnimationFrame(() => "
                                          "requestAnimationFrame(() => ok(document.readyState))); "
                                          "document.readyState == 'complete' ? go() : addEventListener('load', go); })"})
                if r.get("result", {}).get("result", {}).get("value") == "complete":
                    sys.exit(0)
        except (OSError, EOFError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    sys.exit("the page did not load within 90 s")
try:
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/json/list", timeout=5))
except OSError as exc:
    print("no browser:", type(exc).__name__)
    sys.exit(0)
lines = []
for t in (t for t in targets if t["type"] == "page"):
    if t["url"].startswith("file://"):
        r = ws_call(t["webSocketDebuggerUrl"], "Runtime.evaluate", {"expression": JS, "returnByValue": True})
        lines.append(str(r.get("result", {}).get("result", {}).get("value")))
    else:
        lines.append(json.dumps({"url": t["url"], "title": t["title"]}))
print("\n".join(sorted(lines)))  # in a fixed order: the list's order follows focus
