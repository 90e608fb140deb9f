"""Writes the OSWorld-format tasks (tasks/<domain>/<id>.json) and their scripted rollouts (actions/<id>.yaml) of
this project: edit the definitions here, not the files. Then run make_files.py for the files they use.

Each rollout is one pyautogui action per step at 1280x800, with `ready`: the window (a regex on its title) the
task's config leaves in front, which record.py waits for before the first action."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import (
    ACTIONS,
    HOME,
    TASKS,
    cloud_file,
    command_line,
    download,
    execute,
    launch,
    office_default,
    open_file,
    rule,
    save_postconfig,
    sleep,
    task,
    task_id,
    vm_file,
)


@dataclass
class Def:
    domain: str  # OSWorld's domain directory (libreoffice_calc, ...)
    slug: str  # the task's short name: its id is made from it (common.task_id)
    task: dict[str, Any]
    ready: str  # the window the config leaves in front
    actions: list[str]
    settle: float = 1.0  # seconds of quiet after each action (LibreOffice redraws on idle timers)
    notes: dict[str, Any] = field(default_factory=dict)


DEFS: list[Def] = []


def add(d: Def) -> None:
    DEFS.append(d)


# --- libreoffice_calc: compare_table on the saved workbook against a gold workbook --------------------------

CALC = "libreoffice_calc"


def calc(slug: str, name: str, instruction: str, actions: list[str], rules: list[dict[str, Any]] | None = None) -> None:
    path = f"{HOME}/{name}"
    window = f"{name} - LibreOffice Calc"
    gold = name.replace(".xlsx", "_gold.xlsx")
    add(Def(CALC, slug, task(
        slug, CALC, instruction, [download(CALC, slug, name), office_default(path), open_file(path)], ["libreoffice calc"],
        {"postconfig": save_postconfig(window), "func": "compare_table", "result": vm_file(path),
         "expected": cloud_file(CALC, slug, gold),
         "options": {"rules": rules or [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}}),
        window, actions))




def cell(ref: str) -> str:
    """A click on a cell of Calc's grid at 1280x800 (column A at x 79, 77 px apart; row 1 at y 191, 20 apart)."""
    col, row = ord(ref[0]) - ord("A"), int(ref[1:])
    return f"pyautogui.click({79 + 77 * col}, {191 + 20 * (row - 1)})"

calc("calc-total", "sales.xlsx",
     "In the open workbook, write Total in A5 and the sum of B2:B4 in B5.",
     [cell("A5"), "pyautogui.write('Total\\t')",
      "pyautogui.write('=SUM(B2:B4)\\n')"])

calc("calc-double", "stock.xlsx",
     "In the open workbook, add a column C headed Double whose rows hold twice the Qty of their row, as formulas.",
     [cell("C1"), "pyautogui.write('Double\\n')", "pyautogui.write('=B2*2\\n')", "pyautogui.write('=B3*2\\n')",
      "pyautogui.write('=B4*2\\n')"])
calc("calc-delete-row", "fruit.xlsx",
     "Delete the row of pear from the open workbook, so that no empty row is left.",
     [cell("A3"), "pyautogui.hotkey('shift', 'space')", "pyautogui.hotkey('ctrl', '-')"])
calc("calc-headers", "prices.xlsx",
     "Rename the headers of the open workbook: Item becomes Fruit and Qty becomes Price.",
     [cell("A1"), "pyautogui.write('Fruit\\t')", "pyautogui.write('Price\\n')"])

calc("calc-sort", "stock-sort.xlsx",
     "Sort the rows of the open workbook by Qty, largest first, keeping the header row on top.",
     [cell("B2"), "pyautogui.click(792, 63)"])  # the toolbar's Sort Descending

# --- libreoffice_writer: compare_docx_files on the saved document against a gold document -------------------

WRITER = "libreoffice_writer"


def office(domain: str, app: str, metric: str, slug: str, name: str, instruction: str, actions: list[str]) -> None:
    """A document opened in LibreOffice `app`, saved by OSWorld's postconfig, judged by `metric` against the
    gold document `<name>_gold.<ext>`."""
    path = f"{HOME}/{name}"
    window = f"{name} - LibreOffice {app}"
    stem, dot, ext = name.rpartition(".")
    add(Def(domain, slug, task(
        slug, domain, instruction, [download(domain, slug, name), office_default(path), open_file(path)],
        [f"libreoffice {app.lower()}"],
        {"postconfig": save_postconfig(window), "func": metric, "result": vm_file(path),
         "expected": cloud_file(domain, slug, f"{stem}_gold{dot}{ext}")}), window, actions))


def writer(slug: str, name: str, instruction: str, actions: list[str]) -> None:
    office(WRITER, "Writer", "compare_docx_files", slug, name, instruction, actions)


writer("writer-append", "notes.docx",
       "Add a last paragraph to the open document that says: Bring the slides.",
       ["pyautogui.hotkey('ctrl', 'end')", "pyautogui.press('enter')", "pyautogui.write('Bring the slides.')"])
writer("writer-delete-line", "agenda.docx",
       "Delete the paragraph about lunch from the open document, leaving no empty paragraph behind.",
       ["pyautogui.hotkey('ctrl', 'home')", "pyautogui.press('down')", "pyautogui.hotkey('shift', 'down')",
        "pyautogui.press('delete')"])
writer("writer-replace", "memo.docx",
       "In the open document, replace every Tuesday with Thursday.",
       ["pyautogui.hotkey('ctrl', 'h')", "pyautogui.write('Tuesday')", "pyautogui.click(665, 316)",
        "pyautogui.write('Thursday')", "pyautogui.click(905, 371)", "pyautogui.click(933, 638)"])


# --- libreoffice_impress: compare_pptx_files on the saved deck against a gold deck ---------------------------

IMPRESS = "libreoffice_impress"
# a click on the empty canvas below the slide ends the text box's editing and selects nothing. Not Escape first:
# Escape leaves the text box selected, and Impress then pulses its selection frame every 0.5 s for as long as it
# stays selected (ImpTextframeHdl's animated overlay), a screen that never settles (docker runs of the first
# calibration: "the screen was still changing after 10 s" on every test whose target or suffix had it)
DESELECT = "pyautogui.click(540, 730)"


def impress(slug: str, name: str, instruction: str, actions: list[str]) -> None:
    office(IMPRESS, "Impress", "compare_pptx_files", slug, name, instruction, actions)


impress("impress-title", "review.pptx",
        "Change the title of the first slide of the open presentation to Annual review.",
        ["pyautogui.click(530, 401)", "pyautogui.hotkey('ctrl', 'a')", "pyautogui.write('Annual review')",
         DESELECT])
impress("impress-delete-slide", "plan.pptx",
        "Delete the last slide (Old ideas) of the open presentation.",
        ["pyautogui.click(100, 451)", "pyautogui.press('delete')"])

impress("impress-bullet", "numbers.pptx",
        "Add a third bullet, Hiring paused, to the second slide of the open presentation.",
        ["pyautogui.click(100, 335)", "pyautogui.click(400, 371)", "pyautogui.press('end')",
         "pyautogui.press('enter')", "pyautogui.write('Hiring paused')", DESELECT])

# --- os: a terminal, judged by a command's output (vm_command_line) ------------------------------------------

OS = "os"
XTERM = ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-bg", "white", "-fg", "black"]


def terminal(slug: str, files: list[str], instruction: str, command: str, expected: str, actions: list[str],
             into: str = HOME) -> None:
    config = [download(OS, slug, *files, into=into)] if files else []
    add(Def(OS, slug, task(
        slug, OS, instruction, config + [launch(XTERM), sleep(1)], ["os", "terminal"],
        {"func": "exact_match", "result": command_line(command), "expected": rule(expected=expected)}),
        "^xterm$", actions, settle=0.5))


terminal("os-archive-logs", ["a.log", "b.log", "keep.txt"],
         "Create the folder ~/archive and move every .log file of ~/logs into it; leave the other files where they are.",
         "cd ~ && find archive logs -type f | sort", "archive/a.log\narchive/b.log\nlogs/keep.txt\n",
         ["pyautogui.write('mkdir ~/archive\\n')", "pyautogui.write('mv ~/logs/*.log ~/archive/\\n')"],
         into=f"{HOME}/logs")
terminal("os-permissions", ["backup.sh", "backup.sh.bak"],
         "Make ~/backup.sh executable by its owner only (rwx for the owner, nothing for anyone else), and delete "
         "its old copy ~/backup.sh.bak.",
         "stat -c %A ~/backup.sh; ls ~/backup.sh.bak 2>/dev/null | wc -l", "-rwx------\n0\n",
         ["pyautogui.write('chmod 700 ~/backup.sh\\n')", "pyautogui.write('rm ~/backup.sh.bak\\n')"])
terminal("os-rename-photos", ["beach.jpeg", "hill.jpeg"],
         "Rename every .jpeg file in ~/photos to end in .jpg instead.",
         "ls ~/photos", "beach.jpg\nhill.jpg\n",
         ["pyautogui.write('cd ~/photos\\n')", "pyautogui.write('mv beach.jpeg beach.jpg\\n')",
          "pyautogui.write('mv hill.jpeg hill.jpg\\n')"], into=f"{HOME}/photos")

terminal("os-todo", [], "Create the folder ~/notes with a file todo.txt in it whose only line is: buy milk",
         "cat ~/notes/todo.txt", "buy milk\n",
         ["pyautogui.write('mkdir ~/notes\\n')", "pyautogui.write(\"echo 'buy milk' > ~/notes/todo.txt\\n\")"])

# --- chrome: Google Chrome as OSWorld starts it (DevTools on 1337, relayed to 9222 by socat) ------------------

CHROME = "chrome"
# Chrome's own prompts that would differ from run to run (translation offers, a restore bubble) kept away
CHROME_QUIET = ["--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
                "--hide-crash-restore-bubble", "--disable-smooth-scrolling"]


def chrome_config(slug: str, pages: list[str], domain: str = CHROME, tabs: bool = False) -> list[dict[str, Any]]:
    """The pages downloaded, Chrome launched on the first (or, with ``tabs``, on none: chrome_open_tabs then
    opens every page, closing the first tab as desktop-env's step does)."""
    first = [] if tabs else [page_url(pages[0])]
    config = [download(domain, slug, *pages, into=f"{HOME}/www"),
              launch(["google-chrome", "--remote-debugging-port=1337", *CHROME_QUIET, *first]),
              launch(["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"])]
    if tabs:
        config.append({"type": "chrome_open_tabs", "parameters": {"urls_to_open": [page_url(p) for p in pages]}})
    return config


def page_url(page: str) -> str:
    return f"file://{HOME}/www/{page}"


add(Def(CHROME, "chrome-order-form", task(
    "chrome-order-form", CHROME,
    "On the open order form, enter the name Ana Lima, the city Porto and the quantity 3, leave the extras "
    "unticked, and save the form with its Save button (it downloads order.txt).",
    chrome_config("chrome-order-form", ["order.html"]), ["chrome"],
    {"func": "compare_text_file", "result": vm_file(f"{HOME}/Downloads/order.txt"),
     "expected": cloud_file(CHROME, "chrome-order-form", "order_gold.txt")}),
    "^Order form - Chromium$",
    ["pyautogui.click(500, 180)", "pyautogui.write('Ana Lima')", "pyautogui.press('tab')",
     "pyautogui.write('Porto')", "pyautogui.press('tab')", "pyautogui.write('3')", "pyautogui.press('enter')"],
    settle=0.5))
add(Def(CHROME, "chrome-contact-form", task(
    "chrome-contact-form", CHROME,
    "On the open contact form, enter the e-mail bo@example.org and the subject Refund, tick Urgent, leave the "
    "extras unticked and save the form (Save downloads contact.txt).",
    chrome_config("chrome-contact-form", ["contact.html"]), ["chrome"],
    {"func": "compare_text_file", "result": vm_file(f"{HOME}/Downloads/contact.txt"),
     "expected": cloud_file(CHROME, "chrome-contact-form", "contact_gold.txt")}),
    "^Contact us - Chromium$",
    ["pyautogui.click(500, 180)", "pyautogui.write('bo@example.org')", "pyautogui.press('tab')",
     "pyautogui.write('Refund')", "pyautogui.press('tab')", "pyautogui.press('space')", "pyautogui.press('tab')",
     "pyautogui.press('enter')"], settle=0.5))
add(Def(CHROME, "chrome-bookmark", task(
    "chrome-bookmark", CHROME, "Bookmark the open page under the name Soups.",
    chrome_config("chrome-bookmark", ["recipes.html"]), ["chrome"],
    # a new profile's first bookmark goes to Other bookmarks (the bar is hidden), so OSWorld's
    # is_expected_bookmarks, which reads the bar, does not apply: the profile's Bookmarks file is read instead
    {"postconfig": [sleep(3)],  # Chrome writes its Bookmarks file a moment after the change
     "func": "check_include_exclude", "result": command_line("cat ~/.config/google-chrome/Default/Bookmarks"),
     "expected": rule(include=['"name": "Soups"', f'"url": "{page_url("recipes.html")}"'], exclude=[])}),
    "^Soup recipes - Chromium$",
    ["pyautogui.hotkey('ctrl', 'd')", "pyautogui.write('Soups')", "pyautogui.press('enter')"], settle=0.5))
add(Def(CHROME, "chrome-close-tab", task(
    "chrome-close-tab", CHROME, "Close the Travel plan tab, and keep the other tabs open.",
    chrome_config("chrome-close-tab", ["recipes.html", "travel.html", "order.html"], tabs=True), ["chrome"],
    {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"},
     "expected": rule(type="url", urls=[page_url("recipes.html"), page_url("order.html")])}),
    "^Order form - Chromium$",
    ["pyautogui.hotkey('ctrl', '2')", "pyautogui.hotkey('ctrl', 'w')"], settle=0.5))


# --- gimp: the image exported over itself, judged by OSWorld's image metrics -------------------------------

GIMP = "gimp"
IMAGE_MENU = "pyautogui.click(396, 65)"
# File > Overwrite <name> (the image's own file, as imported), then Export in PNG's options dialog
OVERWRITE = ["pyautogui.click(219, 65)", "pyautogui.click(297, 376)", "pyautogui.press('enter')"]


def gimp(slug: str, name: str, instruction: str, evaluator: dict[str, Any], actions: list[str]) -> None:
    path = f"{HOME}/{name}"
    add(Def(GIMP, slug, task(slug, GIMP, instruction, [download(GIMP, slug, name), launch(["gimp", path])],
                             ["gimp"], evaluator), f"{name.split('.')[0]}.*GIMP", actions))


gimp("gimp-mirror", "photo.png", "Flip the open image horizontally and overwrite photo.png with the result.",
     {"func": "check_image_mirror", "result": vm_file(f"{HOME}/photo.png"),
      "expected": {**cloud_file(GIMP, "gimp-mirror", "photo.png"), "dest": "photo_original.png"}},
     [IMAGE_MENU, "pyautogui.click(431, 226)", "pyautogui.click(760, 228)", *OVERWRITE])
gimp("gimp-scale", "banner.png",
     "Scale the open image to 100 pixels wide, keeping its aspect ratio, and overwrite banner.png with it.",
     {"func": "check_image_size", "result": vm_file(f"{HOME}/banner.png"), "expected": rule(width=100, height=50)},
     [IMAGE_MENU, "pyautogui.click(444, 351)", "pyautogui.write('100')", "pyautogui.press('tab')",
      "pyautogui.click(849, 593)", *OVERWRITE])


# --- vlc: VLC's preferences (Tools > Preferences, Save), judged on its vlcrc by OSWorld's vlc metrics ---------

VLC = "vlc"
# OSWorld's VMs have VLC's first-run privacy question answered; here a vlcrc saying so is downloaded first
VLC_START = "VLC_VERBOSE=-1 vlc --no-audio --no-video-title-show"


def vlc(slug: str, instruction: str, func: str, rules: dict[str, Any], actions: list[str]) -> None:
    add(Def(VLC, slug, task(
        slug, VLC, instruction, [download(VLC, slug, "vlcrc", into=f"{HOME}/.config/vlc"), launch(VLC_START, True)],
        ["vlc"], {"func": func, "result": {"type": "vlc_config", "dest": "vlcrc"}, "expected": rule(**rules)}),
        "^VLC media player$", actions, settle=0.5))


PREFERENCES, SAVE = "pyautogui.hotkey('ctrl', 'p')", "pyautogui.click(904, 729)"
vlc("vlc-one-instance", "When VLC is started from the file manager, let it open a new instance every time "
    "instead of reusing the running one. Change it in VLC's preferences.",
    "check_one_instance_when_started_from_file", {"expected_one_instance_when_started_from_file": 0},
    [PREFERENCES, "pyautogui.click(280, 541)", SAVE])
vlc("vlc-minimal-view", "Make VLC start in minimal view mode, in its preferences.",
    "check_qt_minimal_view", {"expected_qt_minimal_view": 1}, [PREFERENCES, "pyautogui.click(418, 331)", SAVE])


# --- thunderbird: a profile with local mail, unpacked and started as OSWorld's tasks do ----------------------

TB = "thunderbird"
PROFILE = f"{HOME}/.thunderbird/retrace.default"
LOCAL = f"{PROFILE}/Mail/Local Folders"


def thunderbird(slug: str, instruction: str, evaluator: dict[str, Any], actions: list[str]) -> None:
    config = [download(TB, slug, "thunderbird-profile.tar.gz"),
              execute(["tar", "-xzf", f"{HOME}/thunderbird-profile.tar.gz", "-C", HOME]),
              launch(["thunderbird", "-profile", PROFILE])]
    add(Def(TB, slug, task(slug, TB, instruction, config, ["thunderbird"], evaluator), "Mozilla Thunderbird$",
            actions, settle=1.0))


thunderbird("tb-delete-spam", "Delete the message 'You won a prize' from the Inbox of Local Folders.",
            {"func": "exact_match",
             "result": command_line(f"grep -c '^Subject: You won a prize' '{LOCAL}/Trash'"),
             "expected": rule(expected="1\n")}, ["pyautogui.click(59, 131)", "pyautogui.click(150, 160)", "pyautogui.click(400, 217)",
             "pyautogui.press('delete')"])
thunderbird("tb-new-folder", "Create a folder named Receipts in Local Folders.",
            {"func": "check_include_exclude", "result": command_line(f"ls '{LOCAL}'"),
             "expected": rule(include=["Receipts"], exclude=[])}, ["pyautogui.rightClick(143, 131)", "pyautogui.click(201, 232)", "pyautogui.write('Receipts')",
             "pyautogui.press('enter')"])


# --- multi_apps: a terminal beside another app ----------------------------------------------------------------

MULTI = "multi_apps"
# The desktop's window manager opens every window maximized; the terminal's own size and place (lower right)
# are what its title bar's maximize button restores it to, so that the other app shows beside it.
SIDE_XTERM = [*XTERM, "-geometry", "60x12+620+480"]
UNMAXIMIZE = "pyautogui.click(1253, 9)"
SIDE = "pyautogui.click(900, 600)"  # into the terminal
CHROME_MINIMIZE = "pyautogui.click(1197, 20)"  # Chrome's own title-bar button: what lay under it shows again


def multi(slug: str, instruction: str, config: list[dict[str, Any]], apps: list[str], evaluator: dict[str, Any],
          actions: list[str]) -> None:
    add(Def(MULTI, slug, task(slug, MULTI, instruction, config + [launch(SIDE_XTERM)], apps, evaluator), "^xterm$",
            actions))


multi("multi-count-errors",
      "Count the lines of ~/server.log that contain ERROR, and write that number in B1 of the open workbook.",
      [download(MULTI, "multi-count-errors", "server.log", "report.xlsx"), office_default(f"{HOME}/report.xlsx"), open_file(f"{HOME}/report.xlsx")],
      ["libreoffice calc", "terminal"],
      {"postconfig": save_postconfig("report.xlsx - LibreOffice Calc"), "func": "compare_table",
       "result": vm_file(f"{HOME}/report.xlsx"), "expected": cloud_file(MULTI, "multi-count-errors", "report_gold.xlsx"),
       "options": {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}},
      [UNMAXIMIZE, "pyautogui.write('grep -c ERROR ~/server.log\\n')", cell("B1"), "pyautogui.write('3\\n')"])
multi("multi-motto",
      "Add the text of ~/motto.txt as a new last paragraph of the open document.",
      [download(MULTI, "multi-motto", "motto.txt", "letter.docx"), office_default(f"{HOME}/letter.docx"), open_file(f"{HOME}/letter.docx")],
      ["libreoffice writer", "terminal"],
      {"postconfig": save_postconfig("letter.docx - LibreOffice Writer"), "func": "compare_docx_files",
       "result": vm_file(f"{HOME}/letter.docx"), "expected": cloud_file(MULTI, "multi-motto", "letter_gold.docx")},
      [UNMAXIMIZE, "pyautogui.write('cat ~/motto.txt\\n')", "pyautogui.click(400, 300)", "pyautogui.hotkey('ctrl', 'end')",
       "pyautogui.press('enter')", "pyautogui.write('Less, but better.')"])
multi("multi-save-order",
      "Fill the open order form with the name Ana Lima, the city Porto and the quantity 3 and save it with its Save "
      "button; then move the order.txt it downloads into ~/orders.",
      chrome_config("multi-save-order", ["order.html"], domain=MULTI)
      # Chrome's window first (a launch does not wait for it), so that the terminal opens over it every time
      + [execute(["xdotool", "search", "--sync", "--onlyvisible", "--name", "^Order form - Chromium$"]),
         execute(["mkdir", "-p", f"{HOME}/orders"])],
      ["chrome", "terminal"],
      {"func": "exact_match",
       "result": command_line("cd ~ && find orders Downloads -type f | sort && cat orders/order.txt"),
       "expected": rule(expected="orders/order.txt\nname=Ana Lima\ncity=Porto\nqty=3\nnewsletter=no\ngift=no\n")},
      [UNMAXIMIZE, "pyautogui.click(500, 180)", "pyautogui.write('Ana Lima')", "pyautogui.press('tab')",
       "pyautogui.write('Porto')", "pyautogui.press('tab')", "pyautogui.write('3')", "pyautogui.press('enter')",
       CHROME_MINIMIZE, SIDE, "pyautogui.write('mv ~/Downloads/order.txt ~/orders/\\n')"])


def main() -> None:
    seen: set[str] = set()
    for d in DEFS:
        assert d.slug not in seen, d.slug
        seen.add(d.slug)
        out = TASKS / d.domain / f"{task_id(d.slug)}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(d.task, indent=2) + "\n")
        ACTIONS.mkdir(exist_ok=True)
        rollout = {"task": task_id(d.slug), "slug": d.slug, "domain": d.domain, "ready": d.ready,
                   "settle_quiet": d.settle, "actions": d.actions}
        (ACTIONS / f"{task_id(d.slug)}.yaml").write_text(
            "# Generated by gen_tasks.py; edit it, not this file.\n" + yaml.safe_dump(rollout, sort_keys=False,
                                                                                       width=120))
    print(f"{len(DEFS)} tasks")


if __name__ == "__main__":
    main()
