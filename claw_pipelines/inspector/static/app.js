// claw inspector: live overview, labelling, on-demand prompt tokens. Plain DOM, no framework.
"use strict";

const POLL_MS = 2000;

function text(el, value) { if (el) el.textContent = value; }

function drawSpark(svg, series) {
  if (!svg) return;
  const max = Math.max(1, ...series);
  const pts = series.map((v, i) => `${(i * 120) / Math.max(1, series.length - 1)},${30 - (v / max) * 28 - 1}`);
  svg.replaceChildren();
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.appendChild(line);
}

function drawHist(box, bins) {
  if (!box) return;
  const max = Math.max(1, ...bins);
  box.replaceChildren(...bins.map((n, i) => {
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.height = `${(100 * n) / max}%`;
    bar.title = `${(i / bins.length).toFixed(1)}–${((i + 1) / bins.length).toFixed(1)}: ${n} steps`;
    return bar;
  }));
}

function formatField(el, value) {
  if (value === null || value === undefined) return "–";
  if (el.dataset.format === "pct") return `${Math.round(100 * value)}%`;
  if (el.dataset.format === "fixed2") return Number(value).toFixed(2);
  return String(value);
}

function renderOverview(o) {
  document.querySelectorAll("[data-field]").forEach((el) => text(el, formatField(el, o[el.dataset.field])));
  drawSpark(document.getElementById("spark"), o.turns_per_s_series);
  drawHist(document.getElementById("quality-hist"), o.quality_histogram);
  const missing = document.getElementById("missing");
  if (missing) missing.replaceChildren(...o.missing.map((m) => { const li = document.createElement("li"); li.textContent = m; return li; }));
  const versions = document.getElementById("versions");
  if (versions) {
    const entries = Object.entries(o.policy_versions_in_flight);
    versions.replaceChildren(...(entries.length ? entries : [["–", "no open trajectories"]]).map(([v, n]) => {
      const tr = document.createElement("tr");
      for (const c of [v, n]) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
      return tr;
    }));
  }
  for (const r of o.recipes) {
    const row = document.querySelector(`tr[data-recipe="${CSS.escape(r.recipe)}"]`);
    if (!row) continue;
    row.querySelectorAll("[data-col]").forEach((td) => {
      const v = r[td.dataset.col];
      const empty = td.dataset.col === "plan_error" ? "" : "–";
      text(td, v === null ? empty : v === true ? "yes" : v === false ? "no" : String(v));
    });
  }
  const tables = document.getElementById("tables");
  if (tables) tables.replaceChildren(...Object.entries(o.tables).map(([t, v]) => {
    const s = document.createElement("span"); s.textContent = `${t}: ${v === null ? "missing" : "v" + v}`; return s;
  }));
}

async function pollOverview() {
  try {
    const res = await fetch("/api/overview", { cache: "no-store" });
    if (res.ok) renderOverview(await res.json());
  } finally {
    setTimeout(pollOverview, POLL_MS);
  }
}

function formState(form) { return JSON.stringify([...new FormData(form)]); }

// A label form is in use when it holds typed input or the focus: reloading would lose the input.
function labelFormInUse() {
  return [...document.querySelectorAll("form.label-form")].some(
    (f) => formState(f) !== f.dataset.pristine || f.contains(document.activeElement));
}

function offerReload(message) {
  let notice = document.getElementById("reload-notice");
  if (!notice) {
    notice = document.createElement("p");
    notice.id = "reload-notice";
    notice.setAttribute("role", "status");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = "reload";
    button.addEventListener("click", () => location.reload());
    notice.append(document.createElement("span"), " — ", button);
    document.body.appendChild(notice);
  }
  text(notice.querySelector("span"), message);
}

async function pollTrajectory(id, steps) {
  try {
    const res = await fetch(`/api/trajectories/${encodeURIComponent(id)}/summary`, { cache: "no-store" });
    if (res.ok) {
      const s = await res.json();
      const changed = s.num_steps !== steps || s.status !== "open";
      if (changed && !labelFormInUse()) { location.reload(); return; }
      if (changed) offerReload(s.num_steps !== steps ? "new steps arrived" : "the trajectory was closed");
    }
  } catch (e) { /* the server restarts: keep polling */ }
  setTimeout(() => pollTrajectory(id, steps), POLL_MS);
}

// FastAPI reports invalid input as a list of {loc, msg, input}: show "field: message" per problem.
function errorText(detail) {
  if (!Array.isArray(detail)) return String(detail);
  return detail.map((problem) => {
    const field = problem.loc.filter((part) => part !== "body").join(".");
    const message = problem.msg.replace(/^Value error, /, "");
    return field ? `${field}: ${message}` : message;
  }).join("; ");
}

async function submitLabel(event) {
  event.preventDefault();
  const form = event.currentTarget;
  if (form.dataset.kind === "filter" && !confirm(`${form.querySelector("strong").textContent} Are you sure?`)) return;
  const status = form.querySelector(".label-status");
  const data = new FormData(form);
  const author = data.get("author").trim();
  const body = { target_kind: form.dataset.kind, author };
  if (form.dataset.ids) body.target_ids = JSON.parse(form.dataset.ids);
  if (form.dataset.filter) body.filter = JSON.parse(form.dataset.filter);
  if (data.get("quality_label").trim()) body.quality_label = data.get("quality_label").trim();
  if (data.get("trainable")) body.trainable = data.get("trainable") === "true";
  const tags = data.get("tags").split(",").map((t) => t.trim()).filter(Boolean);
  if (tags.length) body.tags = tags;
  if (data.get("note").trim()) body.note = data.get("note").trim();
  status.classList.remove("failed");
  text(status, "saving…");
  const res = await fetch("/api/labels", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const out = await res.json();
  if (!res.ok) {
    status.classList.add("failed");
    text(status, `not saved: ${errorText(out.detail)}`);
    return;
  }
  localStorage.setItem("claw-author", author);  // only now: a refused name must not replace it
  text(status, `saved ${out.written} ${out.target_kind} label(s) (labels v${out.labels_version})`);
  setTimeout(() => location.reload(), 700);
}

function toggleFullText(event) {
  const button = event.currentTarget;
  const clamped = button.previousElementSibling.classList.toggle("clamped");
  button.textContent = clamped ? "show all" : "show less";
}

async function showPromptTokens(event) {
  const button = event.currentTarget;
  const box = button.nextElementSibling;
  if (!box.hidden) { box.hidden = true; return; }
  const res = await fetch(`/api/steps/${encodeURIComponent(button.dataset.turn)}/prompt_tokens`);
  const out = await res.json();
  if (out.tokens) {
    box.className = "prompt-tokens tokens";
    box.replaceChildren(...out.tokens.texts.map((t, i) => { const s = document.createElement("span"); s.className = "tok"; s.title = `id ${out.tokens.ids[i]}`; s.textContent = t; return s; }));
  } else {
    box.className = "prompt-tokens ids";
    box.textContent = out.ids.join(" ");
  }
  box.hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  const body = document.body;
  if (body.dataset.liveOverview) {
    drawSpark(document.getElementById("spark"), JSON.parse(document.getElementById("spark").dataset.series));
    drawHist(document.getElementById("quality-hist"), JSON.parse(document.getElementById("quality-hist").dataset.bins));
    setTimeout(pollOverview, POLL_MS);
  }
  if (body.dataset.liveTrajectory) setTimeout(() => pollTrajectory(body.dataset.liveTrajectory, Number(body.dataset.steps)), POLL_MS);
  const author = localStorage.getItem("claw-author") || "";
  document.querySelectorAll("form.label-form").forEach((f) => {
    f.addEventListener("submit", submitLabel);
    if (author) f.elements.author.value = author;
    f.dataset.pristine = formState(f);
  });
  document.querySelectorAll("button.prompt-ids").forEach((b) => b.addEventListener("click", showPromptTokens));
  document.querySelectorAll("button.show-all").forEach((b) => b.addEventListener("click", toggleFullText));
});
