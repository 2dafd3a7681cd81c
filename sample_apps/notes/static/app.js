// SpecSteer Notes: the page. Talks to server.py's JSON API and its server-sent events.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { notes: [], current: null, stream: null, frames: 0, generating: false, typing: null, prepares: 0 };
const PREPARE_AFTER_MS = 600; // a pause in typing this long prepares the continuation

// ---------------------------------------------------------------- notes
async function loadNotes() {
  const q = $("search").value.trim();
  state.notes = await api(`/api/notes${q ? `?q=${encodeURIComponent(q)}` : ""}`);
  const list = $("note-list");
  list.replaceChildren();
  for (const note of state.notes) {
    const li = document.createElement("li");
    li.dataset.id = note.id;
    if (state.current && state.current.id === note.id) li.classList.add("active");
    const t = document.createElement("div");
    t.className = "t";
    t.textContent = note.title || "(untitled)";
    const s = document.createElement("div");
    s.className = "s";
    s.textContent = note.body.replace(/\s+/g, " ").slice(0, 80);
    li.append(t, s);
    li.onclick = () => openNote(note);
    list.appendChild(li);
  }
}

function openNote(note) {
  discard();
  clearTimeout(state.typing);
  state.prepares++;
  $("prepared").hidden = true;
  state.current = note;
  $("title").value = note ? note.title : "";
  $("body").value = note ? note.body : "";
  $("delete").disabled = !note;
  for (const li of $("note-list").children) li.classList.toggle("active", !!note && li.dataset.id === note.id);
  say(note ? `Saved note · ${note.created_at ? note.created_at.slice(0, 10) : ""}` : "New note");
}

async function save() {
  $("prepared").hidden = true; // the history changes: prepare again once it is saved
  state.prepares++;
  const note = await api("/api/notes", {
    method: "POST",
    body: JSON.stringify({ id: state.current && state.current.id, title: $("title").value, body: $("body").value }),
  });
  state.current = note;
  $("delete").disabled = false;
  await loadNotes();
  say("Saved to your private history");
  prepare();
  return note;
}

async function remove() {
  if (!state.current) return;
  if (!confirm(`Delete “${state.current.title || "this note"}”? It is forgotten from your history too.`)) return;
  await api(`/api/notes/${encodeURIComponent(state.current.id)}`, { method: "DELETE" });
  openNote(null);
  await loadNotes();
  say("Deleted and forgotten");
}

function say(text) { $("status-line").textContent = text; }

// ---------------------------------------------------------------- continuation
// What the continuation continues: the note as it is in the editor (saved or not). Its title
// is the public topic; its text stays on this device (it ends the on-device model's prompt).
const noteRequest = () => ({ id: state.current && state.current.id, title: $("title").value, body: $("body").value });

function startContinuation() {
  startSuggestion("/api/continue", noteRequest(), state, "continue", discard, finish);
}

// While the user types, retrieve and prefill the continuation on the device (debounced), so
// "Continue in my voice" starts from a prepared prompt.
// The server answers when the prefill is done: "ready" shows then, for the latest request only
// (typing on, saving or opening a note starts a newer one, or none).
function prepare() {
  const seq = ++state.prepares;
  if (state.generating || !($("title").value || $("body").value)) return;
  api("/api/prepare", { method: "POST", body: JSON.stringify(noteRequest()) })
    .then((r) => { if (seq === state.prepares && !state.generating) $("prepared").hidden = !r.ready; })
    .catch(() => {}); // only a head start: the continuation works without it
}

function typed() {
  state.prepares++; // an answer still on its way is for text that changed
  clearTimeout(state.typing);
  $("prepared").hidden = true;
  state.typing = setTimeout(prepare, PREPARE_AFTER_MS);
}

function finish(text) {
  endSuggestion(state, "continue", text);
}

async function cancel() {
  await api("/api/cancel", { method: "POST", body: "{}" });
}

function accept() {
  const text = [...$("suggestion-text").querySelectorAll(".tok")].map((s) => s.textContent).join("");
  const body = $("body");
  // the continuation follows the note without its trailing spaces (the model writes the space)
  body.value = body.value.replace(/[ \t]+$/, "") + text;
  discard();
  save().catch((e) => say(e.message));
}

function discard() {
  if (state.generating) cancel();
  $("suggestion-text").replaceChildren();
  $("suggestion").hidden = true;
}

// ---------------------------------------------------------------- badge (privacy panel and settings: shared_ui)
async function refreshStatus() {
  if (state.generating) return; // mode events drive the badge while writing
  try {
    const s = await api("/api/status");
    showTestModels(s.test_models);
    setBadge($("badge"), s.settings.companion ? s.mode : "none", s.reason);
  } catch (err) { setBadge($("badge"), "unknown", err.message); }
}

// ---------------------------------------------------------------- wiring
$("new-note").onclick = () => { openNote(null); $("title").focus(); };
$("save").onclick = () => save().catch((e) => say(e.message));
$("delete").onclick = () => remove().catch((e) => say(e.message));
$("continue").onclick = startContinuation;
$("cancel").onclick = cancel;
$("accept").onclick = accept;
$("discard").onclick = discard;
$("search").oninput = () => loadNotes();
$("title").oninput = typed;
$("body").oninput = typed;
$("privacy-toggle").onclick = () => { $("privacy").hidden = !$("privacy").hidden; refreshFrames(); };
$("settings-open").onclick = openSettings;
$("settings-form").addEventListener("submit", saveSettings);
document.addEventListener("keydown", (e) => {
  if ((e.ctrlKey || e.metaKey) && e.key === "s") { e.preventDefault(); save(); }
});

openNote(null);
loadNotes();
refreshStatus();
setInterval(refreshStatus, 2000);
setInterval(() => { if (state.generating || !$("privacy").hidden) refreshFrames(); }, 700);
