// Shared by the sample apps: their JSON API calls, the badge, the "what left this device" panel,
// the settings dialog and the suggestion stream. Each app defines `$` and a `state` with a
// `frames` counter and `generating`, and its own `refreshStatus`.
"use strict";

// The settings dialog, the same in both apps: added here so the markup is written once
// (the pages have no templating step); app.js wires it up after this script runs.
document.body.insertAdjacentHTML("beforeend", `
<dialog id="settings">
  <form method="dialog" id="settings-form">
    <h2>Settings</h2>
    <label>Companion URL <input name="companion" placeholder="ws://127.0.0.1:8765 (empty: on-device only)"></label>
    <label>Device token <input name="token" type="password" autocomplete="off"></label>
    <label>Preset
      <select name="preset">
        <option value="default">default — balanced</option>
        <option value="fast">fast — fewer bytes, quicker</option>
        <option value="strict">strict — closest to the big model</option>
      </select>
    </label>
    <label>Leak guard (a draft that copies your private history word for word)
      <select name="leak_guard">
        <option value="allow">allow — send it, count it</option>
        <option value="redact">redact — cut it from the draft, write another word (default)</option>
        <option value="hold">hold — finish on this device alone</option>
      </select>
    </label>
    <p id="settings-error" class="error"></p>
    <div class="actions">
      <button value="cancel" formnovalidate>Close</button>
      <button id="settings-save" class="primary" value="save">Save settings</button>
    </div>
  </form>
</dialog>`);

// Each frame in words, with the text that left (or came back) decoded whole; the token ids
// are one click away ("token ids"). `f.texts` holds the request, drafted and committed text.
const FRAME_WORDS = {
  Hello: (f) => `hello from ${f.fields.client_name || "this device"}; device token ${f.fields.auth_token}`,
  HelloOk: (f) => `the companion (${f.fields.companion_version}) accepts this device`,
  OpenSession: () => "a session opens on the public request",
  SessionOpened: (f) => `session ${f.fields.session_id} open (the companion read ${f.fields.prompt_length} tokens)${(f.fields.ids || []).length ? `; ${f.fields.ids.length} candidates for the first token (scores, no text)` : ""}`,
  Resume: (f) => `the link was lost: a new connection resumes the session at round ${f.fields.round} with the request and the text so far`,
  Draft: (f) => `round ${f.fields.round}: the words drafted on this device, for the companion to check`,
  DraftS0: (f) => `round ${f.fields.round}: how likely a model without your history finds those ${(f.fields.logp_s0 || []).length} drafted tokens (scores, no text)`,
  Verdict: (f) => `round ${f.fields.round}: ${f.fields.accepted} drafted ${f.fields.accepted === 1 ? "token" : "tokens"} accepted; ${(f.fields.ids || []).length} candidates for the next one (scores, no text)`,
  RowRequest: () => "a request for the companion's next-token scores",
  RowReply: (f) => `next-token scores for ${(f.fields.ids || []).length} candidates`,
  Close: (f) => `closed${f.fields.reason ? `: ${f.fields.reason}` : ""}`,
  Error: (f) => `error ${f.fields.code}: ${f.fields.message}`,
};
const TEXT_LABEL = { prompt_ids: "request", committed_ids: "text so far", draft_ids: "drafted" };

// A frame type without its own words: its plain fields, as "name value" pairs.
function fieldWords(f) {
  return Object.entries(f.fields).filter(([, v]) => v === null || typeof v !== "object")
    .map(([k, v]) => `${k.replaceAll("_", " ")} ${v}`).join(" · ");
}

function renderFrame(f) {
  const li = document.createElement("li");
  li.className = `frame ${f.direction}`;
  li.dataset.type = f.type;
  const head = document.createElement("div");
  head.className = "head";
  head.innerHTML = `<span class="dir ${f.direction}">${f.direction === "up" ? "↑" : "↓"}</span>` +
    `<span class="type"></span><span class="bytes"></span>`;
  head.querySelector(".type").textContent = `#${f.n} ${f.type}`;
  head.querySelector(".bytes").textContent = `${f.bytes} B`;
  li.appendChild(head);
  const words = (FRAME_WORDS[f.type] || fieldWords)(f);
  if (words) {
    const d = document.createElement("div");
    d.className = "detail";
    d.textContent = words;
    li.appendChild(d);
  }
  for (const [name, text] of Object.entries(f.texts || {})) {
    const said = document.createElement("div");
    said.className = "said";
    const label = document.createElement("b");
    label.textContent = TEXT_LABEL[name] || name;
    const quote = document.createElement("q");
    quote.dataset.field = name;
    quote.textContent = text;
    said.append(label, quote);
    li.appendChild(said);
  }
  const ids = Object.entries(f.tokens || {});
  if (ids.length) { // the ids themselves, on demand
    const more = document.createElement("details");
    more.className = "ids";
    const summary = document.createElement("summary");
    summary.textContent = "token ids";
    more.appendChild(summary);
    for (const [name, tokens] of ids) {
      const row = document.createElement("div");
      const label = document.createElement("b");
      label.textContent = name === "ids" ? "candidates" : TEXT_LABEL[name] || name;
      row.appendChild(label);
      for (const t of tokens) {
        const s = document.createElement("span");
        s.textContent = t.text === null ? `${t.id}` : `${t.id} ${JSON.stringify(t.text)}`;
        row.appendChild(s);
      }
      more.appendChild(row);
    }
    li.appendChild(more);
  }
  return li;
}

// The tiny test models write random text: say so at the top of the page, once.
function showTestModels(on) {
  let banner = document.getElementById("test-banner");
  if (on && !banner) {
    banner = document.createElement("div");
    banner.id = "test-banner";
    banner.className = "banner";
    banner.textContent = "test models: random text — started with --tiny; start without it for the Qwen pair";
    document.body.prepend(banner);
  }
  if (banner) banner.hidden = !on;
}

function setBadge(el, mode, reason) {
  el.classList.remove("online", "offline", "none", "unknown");
  if (mode === "collaborative") {
    el.classList.add("online");
    el.textContent = "Online · companion steering";
  } else if (mode === "none") {
    el.classList.add("none");
    el.textContent = "On-device only";
  } else if (mode === "local") {
    el.classList.add("offline");
    el.textContent = "Offline · writing locally";
  } else {
    el.classList.add("unknown");
    el.textContent = "checking…";
  }
  el.title = reason || "";
}

function tokenSpan(text, provenance) {
  const span = document.createElement("span");
  span.className = `tok ${provenance}`;
  span.dataset.provenance = provenance;
  span.textContent = text;
  return span;
}

// The leak guard's line of the privacy panel (#leak-guard) after a suggestion: its policy and
// what it found in what was about to leave (stats.leak_flagged / leak_redacted / leak_held).
function leakGuardLine(s) {
  const plural = (n, one) => `${n} ${one}${n === 1 ? "" : "s"}`;
  return `leak guard (${s.leak_guard}): ${plural(s.leak_flagged, "span")} flagged, `
    + `${plural(s.leak_redacted, "token")} cut, ${plural(s.leak_held, "token")} kept on device`;
}

function showLeakGuard(s) {
  const el = $("leak-guard");
  el.textContent = leakGuardLine(s);
  el.classList.toggle("flagged", s.leak_flagged > 0);
  el.hidden = false;
}

// The end of a suggestion in words: tokens, drafts accepted, what was written offline, bytes,
// and what preparing while the user typed saved.
function doneSummary(s) {
  const parts = [`${s.tokens} tokens`];
  if (s.tokens > 0 && s.local_tokens === s.tokens) {
    parts.push("offline: written on this device alone");
  } else {
    if (s.drafted > 0) parts.push(`${(s.acceptance_rate * 100).toFixed(0)}% of ${s.drafted} drafted tokens accepted`);
    if (s.local_tokens > 0) parts.push(`partly offline: ${s.local_tokens} written on this device alone`);
  }
  parts.push(`${s.bytes_up + s.bytes_down} bytes on the wire`);
  if (s.prefill_reused) {
    parts.push(`${s.prefill_reused} of ${s.prefill_reused + s.prefill_tokens} prompt tokens prefilled before you asked`);
    if (s.drafted_ahead) parts.push(`first ${s.drafted_ahead} tokens drafted while you typed`);
  }
  return parts.join(" · ");
}

// What a cancelled suggestion had written: its tokens by provenance, from the page itself.
function streamedSummary() {
  const counts = {};
  for (const t of $("suggestion-text").querySelectorAll(".tok")) {
    counts[t.dataset.provenance] = (counts[t.dataset.provenance] || 0) + 1;
  }
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const names = { draft: "accepted draft", recovered: "recovered", bonus: "bonus",
                  generalist: "companion", local: "on this device alone" };
  const detail = Object.entries(counts).map(([p, n]) => `${n} ${names[p] || p}`).join(", ");
  return `${total} ${total === 1 ? "token" : "tokens"}${total ? ` (${detail})` : ""}`;
}

// Start a suggestion (one at a time): clear the last one, show "writing…", disable `button`
// and Accept, show Cancel, hide the ready mark, and stream from `url` until `finish`.
function startSuggestion(url, request, state, button, discard, finish) {
  if (state.generating) return;
  clearTimeout(state.typing);
  discard();
  state.generating = true;
  $("suggestion").hidden = false;
  $("suggestion-state").textContent = "writing…";
  $("accept").disabled = true;
  $(button).disabled = true;
  $("cancel").hidden = false;
  $("prepared").hidden = true;
  streamSuggestion(url, request, state, finish);
}

// End a suggestion (done, cancelled or failed): show `text`, enable Accept if anything was
// written, give `button` back, hide Cancel and refresh the privacy panel.
function endSuggestion(state, button, text) {
  state.generating = false;
  if (state.stream) state.stream.close();
  state.stream = null;
  $("suggestion-state").textContent = text;
  $("accept").disabled = $("suggestion-text").textContent.length === 0;
  $(button).disabled = false;
  $("cancel").hidden = true;
  refreshFrames();
}

// Stream a suggestion into #suggestion-text: POST `request` (JSON) to `url`, whose answer is a
// server-sent event stream; pieces coloured by provenance, a line where the link was lost or
// came back, and `finish(summary)` at the end. (A POST, not an EventSource: the request carries
// the user's draft, which may be longer than a URL.)
function streamSuggestion(url, request, state, finish) {
  const controller = new AbortController();
  state.stream = { close: () => controller.abort() };
  const on = {
    piece(p) {
      $("suggestion-text").appendChild(tokenSpan(p.text, p.provenance));
      $("suggestion-text").scrollTop = $("suggestion-text").scrollHeight;
    },
    mode(m) {
      setBadge($("badge"), m.mode, m.reason);
      if (!$("suggestion-text").childNodes.length) return;
      const line = document.createElement("span");
      line.className = "modeline";
      line.textContent = m.mode === "local" ? `— companion lost (${m.reason}); the on-device model goes on —`
        : "— companion back; steering resumes —";
      $("suggestion-text").appendChild(line);
    },
    done(s) {
      showLeakGuard(s);
      finish(doneSummary(s));
    },
    cancelled() { finish(`cancelled · ${streamedSummary()}`); },
    failed(e) { finish(`failed: ${e.error}`); },
  };
  (async () => {
    const res = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" },
                                   body: JSON.stringify(request), signal: controller.signal });
    if (!res.ok) throw new Error((await res.json().catch(() => ({}))).error || res.statusText);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const event = /^event: (.*)$/m.exec(block);
        const data = /^data: (.*)$/m.exec(block);
        if (event && data && on[event[1]]) on[event[1]](JSON.parse(data[1]));
      }
    }
    if (state.generating) finish("connection to the app lost");
  })().catch((err) => {
    if (state.generating) finish(err.name === "AbortError" ? "cancelled" : `failed: ${err.message}`);
  });
}

async function api(path, options = {}) {
  const res = await fetch(path, { headers: { "Content-Type": "application/json" }, ...options });
  const data = await res.json();
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

// Append the frames sent since the last call to the privacy panel.
async function refreshFrames() {
  const frames = await api(`/api/frames?since=${state.frames}`);
  const list = $("frames");
  for (const f of frames) list.appendChild(renderFrame(f));
  state.frames += frames.length;
  $("frame-count").textContent = state.frames;
  if (frames.length && !$("privacy").hidden) list.scrollTop = list.scrollHeight;
}

async function openSettings() {
  const settings = await api("/api/settings");
  const form = $("settings-form");
  form.companion.value = settings.companion;
  form.token.value = settings.token;
  form.preset.value = settings.preset;
  form.leak_guard.value = settings.leak_guard;
  $("settings-error").textContent = "";
  $("settings").showModal();
}

async function saveSettings(event) {
  if (event.submitter && event.submitter.value !== "save") return;
  event.preventDefault();
  const form = $("settings-form");
  try {
    await api("/api/settings", { method: "POST", body: JSON.stringify({
      companion: form.companion.value, token: form.token.value, preset: form.preset.value,
      leak_guard: form.leak_guard.value }) });
    $("settings").close();
    refreshStatus();
  } catch (err) { $("settings-error").textContent = err.message; }
}
