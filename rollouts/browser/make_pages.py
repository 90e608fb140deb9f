"""Writes pages/*.html: the local pages of the browser tasks, all on one layout so the mistake catalogue
(pytest_retrace/dataset/perturbations/browser.yaml) can name fixed coordinates: the form's fields in rows 48 px
apart from y = 180 on screen, a Save button below them, a long note, and at the very bottom (out of view until
the page is scrolled to its end) an "Extras" box with two checkboxes. Save writes the form as a text file into
~/Downloads (a Blob download). Every control has author styles (no native hover look: where the pointer rests
must not show), autocomplete and spellcheck are off (no suggestion popup, no late red underline)."""
from pathlib import Path

STYLE = """body{font:16px "DejaVu Sans",sans-serif;margin:0;padding:20px 40px;background:#fff;color:#000}
h1{font-size:26px;margin:0 0 20px;height:32px}
.row{height:48px;display:flex;align-items:center}
.row>label:first-child{width:220px}
input[type=text],select{font:16px "DejaVu Sans",sans-serif;width:340px;height:30px;box-sizing:border-box;
 border:1px solid #777;border-radius:0;background:#fff;color:#000;padding:2px 6px;-webkit-appearance:none;appearance:none}
input[type=text]:focus,select:focus,button:focus,input[type=checkbox]:focus{outline:2px solid #1a55c0;outline-offset:1px}
button{font:16px "DejaVu Sans",sans-serif;padding:6px 22px;border:1px solid #555;background:#e8e8e8;color:#000;border-radius:0}
button:hover,button:active{background:#e8e8e8}
.note{height:1150px;color:#333;width:700px;line-height:24px}
fieldset{width:600px;border:1px solid #777}
input[type=checkbox]{width:18px;height:18px;margin:0 10px 0 0}"""

SCRIPT = """document.getElementById('f').onsubmit = function (e) {
  e.preventDefault();
  var lines = [];
  document.querySelectorAll('#f input, #f select').forEach(function (el) {
    lines.push(el.id + '=' + (el.type == 'checkbox' ? (el.checked ? 'yes' : 'no') : el.value));
  });
  var a = document.createElement('a');
  a.href = URL.createObjectURL(new Blob([lines.join('\\n') + '\\n'], {type: 'text/plain'}));
  a.download = '%s';
  document.body.appendChild(a);
  a.click();
};"""

# the checkboxes in Extras keep the keyboard focus where it was when clicked (as a toolbar button does)
EXTRAS = """<fieldset id=extras><legend>Extras</legend>
<div class=row><input type=checkbox id=newsletter onmousedown="event.preventDefault()"><label for=newsletter>Send me the newsletter</label></div>
<div class=row><input type=checkbox id=gift onmousedown="event.preventDefault()"><label for=gift>Gift wrapping</label></div>
</fieldset>"""


def field(spec):
    kind, ident, label = spec[:3]
    if kind == "text":
        return f'<div class=row><label for={ident}>{label}</label><input type=text id={ident}></div>'
    if kind == "select":
        opts = "".join(f"<option>{o}</option>" for o in spec[3])
        return f'<div class=row><label for={ident}>{label}</label><select id={ident}>{opts}</select></div>'
    if kind == "check":
        return (f'<div class=row><label for={ident}>{label}</label>'
                f'<input type=checkbox id={ident}><span>yes</span></div>')
    raise ValueError(kind)


def page(title, fields, download, note):
    rows = "\n".join(field(f) for f in fields)
    return f"""<!doctype html>
<html><head><meta charset=utf-8><title>{title}</title><style>{STYLE}</style></head>
<body><h1>{title}</h1>
<form id=f autocomplete=off spellcheck=false>
{rows}
<div class=row><button type=submit id=save>Save</button></div>
<div class=note><p>{note}</p></div>
{EXTRAS}
</form>
<script>{SCRIPT % download}</script>
</body></html>
"""


PAGES = {
    "order.html": page("Order form", [("text", "name", "Name"), ("text", "city", "City"), ("text", "qty", "Quantity")],
                       "order.txt", "Orders placed before noon ship the same day. The extras below are optional."),
    "contact.html": page("Contact us", [("text", "email", "E-mail"), ("text", "subject", "Subject"),
                                        ("check", "urgent", "Urgent")],
                         "contact.txt", "We answer within two working days."),
    "signup.html": page("Sign up", [("text", "user", "User name"), ("select", "plan", "Plan", ["Basic", "Pro", "Team"]),
                                    ("text", "country", "Country")],
                        "signup.txt", "The plan can be changed at any time."),
    "feedback.html": page("Feedback", [("text", "name", "Name"), ("text", "rating", "Rating (1-5)"),
                                       ("text", "comment", "Comment")],
                          "feedback.txt", "Thank you for telling us how we did."),
    "recipes.html": page("Soup recipes", [("text", "search", "Search")], "recipes.txt",
                         "Tomato soup, lentil soup, onion soup."),
    "travel.html": page("Travel plan", [("text", "from", "From"), ("text", "to", "To")], "travel.txt",
                        "Trains leave every hour."),
}

if __name__ == "__main__":
    out = Path(__file__).with_name("pages")
    out.mkdir(exist_ok=True)
    for name, html in PAGES.items():
        (out / name).write_text(html, encoding="utf-8")
