// SpecSteer Mail: the page. Talks to server.mjs's JSON API and its server-sent events.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { folder: "inbox", inbox: [], sent: [], current: null, replyTo: null,
                stream: null, generating: false, frames: 0, typing: null, prepares: 0 };
const PREPARE_AFTER_MS = 600; // a pause in typing this long prepares the draft

const short = (from) => (from || "").replace(/\s*<.*>\s*$/, "") || from;
const day = (date) => (date || "").slice(0, 10);

// ---------------------------------------------------------------- folders and messages
async function loadFolders() {
  state.inbox = await api("/api/inbox");
  state.sent = await api("/api/sent");
  $("inbox-count").textContent = state.inbox.length;
  $("sent-count").textContent = state.sent.length;
  renderList();
}

function showFolder(folder) {
  state.folder = folder;
  $("folder-inbox").classList.toggle("active", folder === "inbox");
  $("folder-sent").classList.toggle("active", folder === "sent");
  renderList();
}

function renderList() {
  const items = state.folder === "inbox"
    ? state.inbox.map((m) => ({ id: m.id, who: short(m.from), subject: m.subject, body: m.body, date: m.date, raw: m }))
    : state.sent.map((r) => ({ id: r.id, who: `To: ${short(r.meta.to || "")}`, subject: r.title, body: r.body, date: r.created_at, raw: r }));
  const list = $("messages");
  list.replaceChildren();
  for (const item of items) {
    const li = document.createElement("li");
    li.dataset.id = item.id;
    li.innerHTML = `<div class="from"><span class="who"></span><span class="date"></span></div><div class="subj"></div><div class="snip"></div>`;
    li.querySelector(".who").textContent = item.who;
    li.querySelector(".date").textContent = day(item.date);
    li.querySelector(".subj").textContent = item.subject;
    li.querySelector(".snip").textContent = item.body.replace(/\s+/g, " ").slice(0, 90);
    li.onclick = () => openMessage(item);
    list.appendChild(li);
  }
}

function openMessage(item) {
  state.current = item;
  for (const li of $("messages").children) li.classList.toggle("active", li.dataset.id === item.id);
  $("empty").hidden = true;
  $("composer").hidden = true;
  $("message").hidden = false;
  $("m-subject").textContent = item.subject;
  $("m-from").textContent = state.folder === "inbox" ? item.raw.from : `To: ${item.raw.meta.to || ""}`;
  $("m-date").textContent = day(item.date);
  $("m-body").textContent = item.body;
  $("reply").hidden = state.folder !== "inbox";
}

function compose(replyTo) {
  discard();
  state.replyTo = replyTo || null;
  $("composer").hidden = false;
  $("empty").hidden = true;
  if (!replyTo) $("message").hidden = true;
  $("c-to").value = replyTo ? replyTo.from : "";
  $("c-subject").value = replyTo ? (replyTo.subject.startsWith("Re:") ? replyTo.subject : `Re: ${replyTo.subject}`) : "";
  $("c-body").value = "";
  say(replyTo ? "Replying" : "New message");
  typed();
  (replyTo ? $("c-body") : $("c-to")).focus();
}

async function send(event) {
  event.preventDefault();
  try {
    await api("/api/send", { method: "POST", body: JSON.stringify({
      to: $("c-to").value, subject: $("c-subject").value, body: $("c-body").value }) });
    discard();
    $("composer").hidden = true;
    $("message").hidden = true;
    state.current = null;
    await loadFolders();
    showFolder("sent");
    say("");
    $("empty").hidden = false;
    $("empty").textContent = "Sent. It is now part of your private history, read only on this device.";
  } catch (err) { say(err.message); }
}

function say(text) { $("status-line").textContent = text; }

// ---------------------------------------------------------------- drafting
// The composer as the server's request: a reply or a new message, continuing what is written
// (the text stays on this device: it ends the on-device model's prompt).
const composerRequest = () => ({ reply_to: state.replyTo && state.replyTo.id, to: $("c-to").value,
                                 subject: $("c-subject").value, body: $("c-body").value });

function startDraft() {
  startSuggestion("/api/draft", composerRequest(), state, "draft", discard, finish);
}

// While the user types, retrieve and prefill the draft on the device (debounced). The server
// answers when the prefill is done: "ready" shows then, for the latest request only.
function typed() {
  clearTimeout(state.typing);
  $("prepared").hidden = true;
  const seq = ++state.prepares; // an answer still on its way is for text that changed
  state.typing = setTimeout(() => {
    if (state.generating) return;
    api("/api/prepare", { method: "POST", body: JSON.stringify(composerRequest()) })
      .then((r) => { if (seq === state.prepares && !state.generating) $("prepared").hidden = !r.ready; })
      .catch(() => {}); // only a head start: drafting works without it
  }, PREPARE_AFTER_MS);
}

function finish(text) {
  endSuggestion(state, "draft", text);
}

async function cancel() { await api("/api/cancel", { method: "POST", body: "{}" }); }

function accept() {
  const text = [...$("suggestion-text").querySelectorAll(".tok")].map((s) => s.textContent).join("");
  // the draft continues the text without its trailing spaces (the model writes the space)
  $("c-body").value = $("c-body").value.replace(/[ \t]+$/, "") + text;
  discard();
}

function discard() {
  if (state.generating) cancel();
  $("suggestion-text").replaceChildren();
  $("suggestion").hidden = true;
}

// ---------------------------------------------------------------- import, badge (privacy panel and settings: shared_ui)
async function importMbox() {
  const file = $("import").files[0];
  if (!file) return;
  $("import-report").textContent = "importing…";
  try {
    const res = await api("/api/import", { method: "POST", body: await file.arrayBuffer(),
                                           headers: { "Content-Type": "application/mbox",
                                                      "X-File-Name": encodeURIComponent(file.name) } });
    $("import-report").textContent = res.report;
    await loadFolders();
  } catch (err) { $("import-report").textContent = err.message; }
  $("import").value = "";
}

async function refreshStatus() {
  if (state.generating) return;
  try {
    const s = await api("/api/status");
    showTestModels(s.test_models);
    setBadge($("badge"), s.mode, s.reason);
  } catch (err) { setBadge($("badge"), "unknown", err.message); }
}

// ---------------------------------------------------------------- wiring
$("compose").onclick = () => compose(null);
$("reply").onclick = () => compose(state.current.raw);
$("folder-inbox").onclick = () => showFolder("inbox");
$("folder-sent").onclick = () => showFolder("sent");
$("draft").onclick = startDraft;
$("cancel").onclick = cancel;
$("accept").onclick = accept;
$("discard").onclick = discard;
$("close-composer").onclick = () => { discard(); $("composer").hidden = true; if (!state.current) $("empty").hidden = false; };
$("composer").addEventListener("submit", send);
$("import").onchange = importMbox;
for (const id of ["c-to", "c-subject", "c-body"]) $(id).oninput = typed;
$("privacy-toggle").onclick = () => { $("privacy").hidden = !$("privacy").hidden; refreshFrames(); };
$("settings-open").onclick = openSettings;
$("settings-form").addEventListener("submit", saveSettings);

loadFolders();
refreshStatus();
setInterval(refreshStatus, 2000);
setInterval(() => { if (state.generating || !$("privacy").hidden) refreshFrames(); }, 700);
