"""Writes the rollouts (*.yaml) of the browser domain: run after make_pages.py."""
import json
from pathlib import Path

FLAGS = ["--no-first-run", "--no-default-browser-check", "--user-data-dir=/home/user/.config/chromium",
         "--remote-debugging-port=9222", "--disable-gpu", "--force-device-scale-factor=1", "--password-store=basic",
         "--disable-sync", "--disable-background-networking", "--disable-component-update",
         "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
         "--disable-smooth-scrolling", "--hide-crash-restore-bubble"]
PROBE = "python3 ~/.cache/retrace/domprobe.py"
HERE = Path(__file__).parent


def setup(page, title):
    return [
        {"type": "file", "path": f"~/www/{page}", "src": f"pages/{page}"},
        {"type": "file", "path": "~/Downloads/.keep", "content": ""},
        {"type": "file", "path": "~/.cache/retrace/domprobe.py", "src": "domprobe.py"},
        {"type": "launch", "command": ["chromium", *FLAGS, f"file:///home/user/www/{page}"],
         "window": f"^{title} - Chromium$", "timeout": 120},
        {"type": "command", "command": f"{PROBE} --wait", "timeout": 120},
    ]


def form_eval(name, text):
    return {"func": "compare_text_file", "result": {"type": "vm_file", "path": f"~/Downloads/{name}"},
            "expected": {"type": "rule", "rules": {"text": text}}}


def bookmark_eval(name, page, extra=None):
    ev = {"func": "match_regex", "result": {"type": "vm_file", "path": "~/.config/chromium/Default/Bookmarks"},
          "expected": {"type": "rule", "rules": {"pattern":
                       '"name": "' + name + '",[^{}]*"url": "file:///home/user/www/' + page + '"'}}}
    return ev


TASKS = [
    ("order", "Order form", "order.html",
     "On the open order form, enter the name Ana Lima, the city Porto and the quantity 3, leave the extras unticked, and save the form with its Save button (it downloads order.txt).",
     form_eval("order.txt", "name=Ana Lima\ncity=Porto\nqty=3\nnewsletter=no\ngift=no\n"),
     ["pyautogui.click(500, 180)", "pyautogui.write('Ana Lima')", "pyautogui.press('tab')", "pyautogui.write('Porto')",
      "pyautogui.press('tab')", "pyautogui.write('3')", "pyautogui.press('enter')"]),
    ("contact", "Contact us", "contact.html",
     "On the open contact form, enter the e-mail bo@example.org and the subject Refund, tick Urgent, leave the extras unticked and save the form (Save downloads contact.txt).",
     form_eval("contact.txt", "email=bo@example.org\nsubject=Refund\nurgent=yes\nnewsletter=no\ngift=no\n"),
     ["pyautogui.click(500, 180)", "pyautogui.write('bo@example.org')", "pyautogui.press('tab')",
      "pyautogui.write('Refund')", "pyautogui.press('tab')", "pyautogui.press('space')", "pyautogui.press('tab')",
      "pyautogui.press('enter')"]),
    ("signup", "Sign up", "signup.html",
     "On the open sign-up form, enter the user name mira, choose the Pro plan, enter the country Chile, leave the extras unticked and save the form (Save downloads signup.txt).",
     form_eval("signup.txt", "user=mira\nplan=Pro\ncountry=Chile\nnewsletter=no\ngift=no\n"),
     ["pyautogui.click(500, 180)", "pyautogui.write('mira')", "pyautogui.press('tab')", "pyautogui.press('p')",
      "pyautogui.press('tab')", "pyautogui.write('Chile')", "pyautogui.press('enter')"]),
    ("feedback", "Feedback", "feedback.html",
     "On the open feedback form, enter the name Leo, the rating 4 and the comment Fast delivery, leave the extras unticked and save the form (Save downloads feedback.txt).",
     form_eval("feedback.txt", "name=Leo\nrating=4\ncomment=Fast delivery\nnewsletter=no\ngift=no\n"),
     ["pyautogui.click(500, 180)", "pyautogui.write('Leo')", "pyautogui.press('tab')", "pyautogui.write('4')",
      "pyautogui.press('tab')", "pyautogui.write('Fast ')", "pyautogui.write('delivery')", "pyautogui.press('enter')"]),
    ("bookmark", "Soup recipes", "recipes.html",
     "Bookmark the open page under the name Soups, then close the browser.",
     bookmark_eval("Soups", "recipes.html"),
     ["pyautogui.hotkey('ctrl', 'd')", "pyautogui.write('Soups')", "pyautogui.press('enter')",
      "pyautogui.hotkey('ctrl', 'shift', 'w')"]),
    ("bookmarks-bar", "Travel plan", "travel.html",
     "Show the bookmarks bar, bookmark the open page under the name Trip, then close the browser.",
     {"func": ["check_json_key", "match_regex"],
      "result": [{"type": "vm_file", "path": "~/.config/chromium/Default/Preferences"},
                 {"type": "vm_file", "path": "~/.config/chromium/Default/Bookmarks"}],
      "expected": [{"type": "rule", "rules": {"keys": {"bookmark_bar.show_on_all_tabs": True}}},
                   bookmark_eval("Trip", "travel.html")["expected"]]},
     ["pyautogui.hotkey('ctrl', 'shift', 'b')", "pyautogui.hotkey('ctrl', 'd')", "pyautogui.write('Trip')",
      "pyautogui.press('enter')", "pyautogui.hotkey('ctrl', 'shift', 'w')"]),
]

if __name__ == "__main__":
    for ident, title, page, instruction, evaluator, actions in TASKS:
        doc = {"task": {"id": f"chromium-{ident}", "instruction": instruction, "domain": "browser",
                        "setup": setup(page, title), "evaluator": evaluator},
               "probes": [{"type": "command", "command": PROBE}],
               "trajectory": actions}
        text = "# Generated by gen.py (browser domain: chromium on a local page); edit gen.py, not this file.\n"
        text += json.dumps(doc, indent=1) + "\n"  # JSON is YAML
        (HERE / f"{ident}.yaml").write_text(text, encoding="utf-8")
