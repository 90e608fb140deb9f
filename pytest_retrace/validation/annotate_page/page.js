// The annotation page: one sample at a time for one annotator, answered by keyboard or mouse.
// Everything from a sample (the agent's words included) is set as text, never as HTML.
"use strict";
const params = new URLSearchParams(location.search);
const token = params.get("token");
const who = params.get("annotator");
const $ = (id) => document.getElementById(id);
let current = null;   // the sample shown
let saving = false;

function withToken(url) {
  return token ? url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : url;
}

async function api(url, options = {}) {
  const headers = Object.assign({ "Content-Type": "application/json" }, token ? { "X-Retrace-Token": token } : {});
  const response = await fetch(url, Object.assign({ headers }, options));
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || response.status + " " + response.statusText);
  return body;
}

function inline(text) {  // the guideline's **bold**, *emphasis* and `keys`, on escaped text
  const esc = text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  return esc.replace(/\*\*(.+?)\*\*/g, "<strong>$1</strong>").replace(/\*(.+?)\*/g, "<em>$1</em>")
    .replace(/`(.+?)`/g, "<kbd>$1</kbd>");
}

function renderGuideline(markdown) {  // headings, bullet lists and paragraphs: all the guideline uses
  const out = [];
  for (const block of markdown.split(/\n\s*\n/)) {
    const lines = block.trim().split("\n");
    if (lines[0].startsWith("### ")) out.push("<h3>" + inline(lines[0].slice(4)) + "</h3>");
    else if (lines[0].startsWith("- ")) {
      const items = block.trim().split(/\n- /).map((s) => s.replace(/^- /, "").replace(/\n\s*/g, " "));
      out.push("<ul>" + items.map((s) => "<li>" + inline(s) + "</li>").join("") + "</ul>");
    } else out.push("<p>" + inline(lines.join(" ")) + "</p>");
  }
  $("guideline-text").innerHTML = out.join("");
}

function details(step) {
  const skip = new Set(["stage", "action", "settle", "settled", "rationale", "error"]);
  const parts = Object.entries(step).filter(([k, v]) => !skip.has(k) && v !== null).map(([k, v]) => k + "=" + JSON.stringify(v));
  if (step.error) parts.push("error: " + step.error);
  return parts.join(" ");
}

function fillTable(table, steps, withStage) {
  const body = table.querySelector("tbody");
  body.replaceChildren();
  steps.forEach((step, i) => {
    const row = body.insertRow();
    const cells = [String(i + 1), ...(withStage ? [step.stage] : []), step.action, details(step), step.rationale || ""];
    cells.forEach((text, j) => { const c = row.insertCell(); c.textContent = text; if (j === cells.length - 1) c.className = "words"; });
  });
  if (!steps.length) body.insertRow().insertCell().textContent = "(none)";
}

function imageUrl(name) { return withToken("api/samples/" + current.id + "/images/" + name); }

function setRecoveredMode(mode) {
  const img = $("img-recovered");
  if (!current || (mode !== "recovered" && !current.images[mode])) return;
  img.dataset.mode = mode;
  img.src = imageUrl(mode);
  $("recovered-caption").textContent = { recovered: "recovered", diff: "recovered: differences from the target in red",
    heatmap: "recovered: SSIM heatmap against the target (red: dissimilar)" }[mode];
}

function show(sample, progress) {
  current = sample;
  $("sample").hidden = false;
  $("sample").dataset.id = sample.id;
  $("instruction").textContent = sample.instruction;
  for (const name of ["target", "error"]) $("img-" + name).src = imageUrl(name);
  if (sample.images.recovered) setRecoveredMode("recovered");
  else { $("img-recovered").removeAttribute("src"); $("recovered-caption").textContent = "recovered: no image kept"; }
  fillTable($("recovery"), sample.recovery, false);
  fillTable($("history"), sample.history, true);
  $("answer").reset();
  document.querySelectorAll("fieldset").forEach((f) => f.classList.remove("missing"));
  setProgress(progress);
  window.scrollTo(0, 0);
}

function setProgress(p) { $("progress").textContent = p.done + " / " + p.total + " answered"; }

async function next() {
  const p = await api(withToken("api/next?annotator=" + encodeURIComponent(who)));
  setProgress(p);
  if (p.done === 0) $("guideline").open = true;
  if (p.sample === null) { $("sample").hidden = true; $("done").hidden = false; current = null; return; }
  show(await api(withToken("api/samples/" + p.sample)), p);
}

function status(text, isError) { $("status").textContent = text; $("status").className = isError ? "error" : ""; }

function choose(name, value) {
  const input = document.querySelector('input[name="' + name + '"][value="' + value + '"]');
  if (input) { input.checked = true; input.closest("fieldset").classList.remove("missing"); }
}

async function save(event) {
  if (event) event.preventDefault();
  if (!current || saving) return;
  const recovered = document.querySelector('input[name="recovered"]:checked');
  const env = document.querySelector('input[name="env"]:checked');
  $("q-recovered").classList.toggle("missing", !recovered);
  $("q-env").classList.toggle("missing", !env);
  if (!recovered || !env) { status("answer both questions first", true); return; }
  saving = true;
  const body = { annotator: who, sample: current.id, recovered: recovered.value === "true",
                 environmental_only: JSON.parse(env.value), note: $("note").value };
  try {
    await api(withToken("api/answers"), { method: "POST", body: JSON.stringify(body) });
    status("saved", false);
    await next();
  } catch (err) {
    status("not saved: " + err.message, true);
  } finally {
    saving = false;
  }
}

function toggleZoom() { document.body.classList.toggle("zoomed"); }

document.addEventListener("keydown", (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.target.tagName === "TEXTAREA") {
    if (event.key === "Escape") event.target.blur();
    else if (event.key === "Enter" && !event.shiftKey) save(event);
    return;
  }
  const help = $("help");
  if (help.open) { if (event.key === "Escape" || event.key === "?") { help.close(); event.preventDefault(); } return; }
  const actions = {
    y: () => choose("recovered", "true"), n: () => choose("recovered", "false"),
    e: () => choose("env", "true"), v: () => choose("env", "false"), s: () => choose("env", "null"),
    Enter: () => save(), z: toggleZoom, g: () => { $("guideline").open = !$("guideline").open; },
    d: () => setRecoveredMode($("img-recovered").dataset.mode === "diff" ? "recovered" : "diff"),
    h: () => setRecoveredMode($("img-recovered").dataset.mode === "heatmap" ? "recovered" : "heatmap"),
    "?": () => help.showModal(),
  };
  if (actions[event.key]) { event.preventDefault(); actions[event.key](); }
});

async function start() {
  $("answer").addEventListener("submit", save);
  document.querySelectorAll("#screens img").forEach((img) => img.addEventListener("click", toggleZoom));
  fetch(withToken("api/guideline"), { headers: token ? { "X-Retrace-Token": token } : {} })
    .then((r) => r.text()).then(renderGuideline);
  const study = await api(withToken("api/study"));
  if (!who || !study.annotators.includes(who)) {
    $("choose").hidden = false;
    for (const name of study.annotators) {
      const link = document.createElement("a");
      const query = new URLSearchParams(token ? { annotator: name, token } : { annotator: name });
      link.href = "?" + query.toString();
      link.textContent = name;
      const item = document.createElement("li");
      item.append(link);
      $("annotators").append(item);
    }
    return;
  }
  $("who").textContent = who;
  await next();
}

start().catch((err) => status("cannot load: " + err.message, true));
