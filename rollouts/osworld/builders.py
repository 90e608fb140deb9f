"""The bytes of every file the OSWorld-format tasks use, per task (its slug in gen_tasks.py) and file name:
the files a task downloads and the gold files its evaluator compares with. Built with the libraries OSWorld's
metrics read them with (openpyxl, python-docx, python-pptx, Pillow); a gold deck is converted by LibreOffice
itself (headless), as the app under test saves it, so that compare_pptx_files compares the edit and not two
writers' defaults. make_files.py fixes the dates of every zip-based file."""

from __future__ import annotations

import datetime
import io
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import docx
import openpyxl
import pptx

FIXED = datetime.datetime(2024, 1, 1)
Builder = Callable[[], bytes]


def text(body: str) -> Builder:
    return lambda: body.encode()


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


def docx_file(paragraphs: list[str]) -> Builder:
    def build() -> bytes:
        document = docx.Document()
        for paragraph in paragraphs:
            document.add_paragraph(paragraph)
        document.core_properties.created = document.core_properties.modified = FIXED
        document.core_properties.author = "pytest-retrace"
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()
    return build


def pptx_file(slides: list[tuple[str, list[str]]], by_libreoffice: bool = False) -> Builder:
    """A deck of (title, bullets) slides: the first a title slide, its bullets the subtitle; with
    ``by_libreoffice`` converted by LibreOffice headless (pptx -> pptx), as Impress writes it."""
    def build() -> bytes:
        deck = pptx.Presentation()
        for i, (title, bullets) in enumerate(slides):
            slide = deck.slides.add_slide(deck.slide_layouts[0 if i == 0 else 1])
            slide.shapes.title.text = title
            body = slide.placeholders[1].text_frame
            body.text = bullets[0] if bullets else ""
            for bullet in bullets[1:]:
                body.add_paragraph().text = bullet
        deck.core_properties.created = deck.core_properties.modified = FIXED
        deck.core_properties.author = "pytest-retrace"
        out = io.BytesIO()
        deck.save(out)
        return libreoffice(out.getvalue(), "pptx", "Impress Office Open XML") if by_libreoffice else out.getvalue()
    return build


def libreoffice(data: bytes, ext: str, filter_name: str) -> bytes:
    """``data`` (a .<ext> file) opened and saved again by LibreOffice headless with ``filter_name``, in a
    profile of its own so that a running LibreOffice is not disturbed."""
    with tempfile.TemporaryDirectory(prefix="retrace-osworld-") as tmp:
        src = Path(tmp) / "in" / f"file.{ext}"
        src.parent.mkdir()
        src.write_bytes(data)
        subprocess.run(["soffice", f"-env:UserInstallation=file://{tmp}/profile", "--headless", "--norestore",
                        "--convert-to", f"{ext}:{filter_name}", "--outdir", f"{tmp}/out", str(src)],
                       check=True, capture_output=True, timeout=180)
        return (Path(tmp) / "out" / f"file.{ext}").read_bytes()


SALES = [["Item", "Qty"], ["apple", 3], ["pear", 5], ["plum", 9]]
PRICES = [["Item", "Qty"], ["apple", 1.2], ["pear", 0.8], ["plum", 2.5]]
REVIEW = [("Quarterly review", ["Sales and plans"]), ("Numbers", ["Revenue up", "Costs flat"])]
PLAN = [("Plan 2025", ["Team offsite"]), ("Goals", ["Ship the app", "Hire two people"]),
        ("Old ideas", ["A blimp", "A second office"])]
MEMO = ["Team memo", "The review is on Tuesday at ten.", "Lunch follows, as every Tuesday.", "Thanks, Ana"]
AGENDA = ["Agenda", "Lunch at noon in the garden.", "Budget review.", "Next steps."]
NOTES = ["Meeting notes", "Agenda: budget review.", "Date: 4 June."]

PAGES = Path(__file__).resolve().parent.parent / "browser" / "pages"  # this project's own local pages


def page(name: str) -> Builder:
    return lambda: (PAGES / name).read_bytes()


def png(size: tuple[int, int], seed: int) -> Builder:
    """An image no flip leaves unchanged: a colour gradient with a block off its centre."""
    def build() -> bytes:
        from PIL import Image, ImageDraw

        w, h = size
        image = Image.new("RGB", size)
        image.putdata([((x * 255) // w, (y * 255) // h, (seed * 60) % 256) for y in range(h) for x in range(w)])
        ImageDraw.Draw(image).rectangle((w // 8, h // 4, w // 3, h // 2), fill=(250, 240, 20))
        out = io.BytesIO()
        image.save(out, "PNG")
        return out.getvalue()
    return build


# VLC's first start asks about network access and metadata; a vlcrc with the question answered, as on OSWorld's VMs
VLCRC = "[qt] # Qt interface\nqt-privacy-ask=0\n\n[core] # core program\nmetadata-network-access=0\n"

# A Thunderbird profile: Local Folders with an Inbox, and one POP account that never connects (an identity, so
# Thunderbird opens its mail window instead of the account set-up), every first-run question answered.
TB_PREFS = {
    "mail.accountmanager.accounts": "account1,account2", "mail.accountmanager.defaultaccount": "account2",
    "mail.accountmanager.localfoldersserver": "server1",
    "mail.account.account1.server": "server1", "mail.server.server1.type": "none",
    "mail.server.server1.hostname": "Local Folders", "mail.server.server1.name": "Local Folders",
    "mail.server.server1.userName": "nobody", "mail.server.server1.directory-rel": "[ProfD]Mail/Local Folders",
    "mail.account.account2.server": "server2", "mail.account.account2.identities": "id1",
    "mail.server.server2.type": "pop3", "mail.server.server2.hostname": "pop.example.invalid",
    "mail.server.server2.name": "ana@example.org", "mail.server.server2.userName": "ana",
    "mail.server.server2.login_at_startup": False, "mail.server.server2.check_new_mail": False,
    "mail.server.server2.directory-rel": "[ProfD]Mail/pop.example.invalid",
    "mail.identity.id1.useremail": "ana@example.org", "mail.identity.id1.fullName": "Ana Lima",
    "mail.shell.checkDefaultClient": False, "mail.provider.enabled": False, "mailnews.start_page.enabled": False,
    "mail.rights.version": 1, "app.update.auto": False, "app.update.enabled": False,
    "datareporting.policy.dataSubmissionPolicyBypassNotification": True,
    "toolkit.telemetry.reportingpolicy.firstRun": False, "mail.spotlight.firstRunDone": True,
    "mail.winsearch.firstRunDone": True, "mail.inbox.show_tip": False, "mail.uidensity": 1,
    # started offline, and kept so: the task's sandbox has no network, and Thunderbird's own detection of that
    # flipped the status bar's offline icon at a moment that depended on load (118 px off in every replay of the
    # first calibration, and no screen of tb-delete-spam equal across three replays)
    "offline.autoDetect": False, "offline.startup_state": 3,
}
INBOX = [("Bo Chen <bo@example.org>", "Lunch on Friday", "Shall we meet at noon?"),
         ("Prize Team <win@example.net>", "You won a prize", "Click here to claim it."),
         ("Ana Lima <ana@example.org>", "Slides for Monday", "Attached are the slides.")]


def mbox(messages: list[tuple[str, str, str]]) -> str:
    out = []
    for i, (sender, subject, body) in enumerate(messages):
        out.append(f"From - Mon Jan  1 0{i}:00:00 2024\nFrom: {sender}\nTo: Ana Lima <ana@example.org>\n"
                   f"Subject: {subject}\nDate: Mon, 1 Jan 2024 0{i}:00:00 +0000\n"
                   f"Message-ID: <{i}@retrace.example>\nMIME-Version: 1.0\n"
                   f"Content-Type: text/plain; charset=UTF-8\n\n{body}\n\n")
    return "".join(out)


def thunderbird_profile() -> bytes:
    import gzip
    import tarfile

    def prefs() -> str:
        return "".join(f'user_pref("{k}", {json.dumps(v)});\n' for k, v in TB_PREFS.items())

    files = {".thunderbird/retrace.default/user.js": prefs(),
             ".thunderbird/retrace.default/Mail/Local Folders/Inbox": mbox(INBOX),
             ".thunderbird/retrace.default/Mail/Local Folders/Trash": "",
             ".thunderbird/profiles.ini": "[General]\nStartWithLastProfile=1\n\n[Profile0]\nName=default\n"
                                          "IsRelative=1\nPath=retrace.default\nDefault=1\n"}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, body in sorted(files.items()):
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1704067200, 0o644
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


SERVER_LOG = ("08:00 INFO start\n08:01 ERROR disk slow\n08:02 INFO retry\n08:03 ERROR disk full\n"
              "08:04 WARN low memory\n08:05 ERROR gave up\n08:06 INFO stop\n")
LETTER = ["Dear team,", "Our motto for the year:"]

FILES: dict[str, dict[str, Builder]] = {
    "calc-total": {"sales.xlsx": xlsx(SALES), "sales_gold.xlsx": xlsx(SALES + [["Total", 17]])},
    "calc-double": {"stock.xlsx": xlsx(SALES),
                    "stock_gold.xlsx": xlsx([r + [c] for r, c in zip(SALES, ["Double", 6, 10, 18])])},
    "calc-delete-row": {"fruit.xlsx": xlsx(SALES), "fruit_gold.xlsx": xlsx(SALES[:2] + SALES[3:])},
    "calc-headers": {"prices.xlsx": xlsx(PRICES), "prices_gold.xlsx": xlsx([["Fruit", "Price"]] + PRICES[1:])},
    "writer-append": {"notes.docx": docx_file(NOTES), "notes_gold.docx": docx_file(NOTES + ["Bring the slides."])},
    "writer-delete-line": {"agenda.docx": docx_file(AGENDA),
                           "agenda_gold.docx": docx_file(AGENDA[:1] + AGENDA[2:])},
    "writer-replace": {"memo.docx": docx_file(MEMO),
                       "memo_gold.docx": docx_file([p.replace("Tuesday", "Thursday") for p in MEMO])},
    "impress-title": {"review.pptx": pptx_file(REVIEW),
                      "review_gold.pptx": pptx_file([("Annual review", REVIEW[0][1])] + REVIEW[1:], True)},
    "impress-delete-slide": {"plan.pptx": pptx_file(PLAN), "plan_gold.pptx": pptx_file(PLAN[:2], True)},
    "os-archive-logs": {"a.log": text("boot ok\n"), "b.log": text("disk full\n"), "keep.txt": text("keep me\n")},
    "os-permissions": {"backup.sh": text("#!/bin/sh\ntar czf ~/backup.tgz ~/notes\n"),
                       "backup.sh.bak": text("#!/bin/sh\ntar czf backup.tgz notes\n")},
    "os-rename-photos": {"beach.jpeg": text("not really a jpeg\n"), "hill.jpeg": text("nor this one\n")},
    "chrome-order-form": {"order.html": page("order.html"),
                          "order_gold.txt": text("name=Ana Lima\ncity=Porto\nqty=3\nnewsletter=no\ngift=no\n")},
    "chrome-bookmark": {"recipes.html": page("recipes.html")},
    "chrome-close-tab": {name: page(name) for name in ("recipes.html", "travel.html", "order.html")},
    "gimp-mirror": {"photo.png": png((240, 160), 1)},
    "gimp-scale": {"banner.png": png((400, 200), 2)},
    "vlc-one-instance": {"vlcrc": text(VLCRC)},
    "vlc-minimal-view": {"vlcrc": text(VLCRC)},
    "tb-delete-spam": {"thunderbird-profile.tar.gz": thunderbird_profile},
    "tb-new-folder": {"thunderbird-profile.tar.gz": thunderbird_profile},
    "multi-count-errors": {"server.log": text(SERVER_LOG), "report.xlsx": xlsx([["Errors"]]),
                           "report_gold.xlsx": xlsx([["Errors", 3]])},
    "multi-motto": {"motto.txt": text("Less, but better.\n"), "letter.docx": docx_file(LETTER),
                    "letter_gold.docx": docx_file(LETTER + ["Less, but better."])},
    "multi-save-order": {"order.html": page("order.html")},
    "calc-sort": {"stock-sort.xlsx": xlsx(SALES), "stock-sort_gold.xlsx": xlsx(SALES[:1] + SALES[:0:-1])},
    "impress-bullet": {"numbers.pptx": pptx_file(REVIEW),
                       "numbers_gold.pptx": pptx_file([REVIEW[0], ("Numbers", [*REVIEW[1][1], "Hiring paused"])],
                                                      True)},
    "chrome-contact-form": {"contact.html": page("contact.html"), "contact_gold.txt": text(
        "email=bo@example.org\nsubject=Refund\nurgent=yes\nnewsletter=no\ngift=no\n")},
}
