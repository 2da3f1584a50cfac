// pyinfer's chat page: streams replies from /v1/chat/completions (server-sent events), Stop cancels the request
// (the connection closes and the server frees its KV at once), and a status line shows this reply's tok/s and
// the server's load from /metrics. The API key, when the server wants one, is typed once and kept in this tab's
// sessionStorage only.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_SLOT = "pyinfer-api-key";
const history = [];          // [{role, content}] of this conversation, the system prompt not included
let running = null;          // {controller, tokens, firstAt} of the reply being streamed
let lastReplyRate = null;    // tok/s of the last finished reply
let keyNotice = null;        // the "key needed" message, removed once a key is given
let conversation = 0;        // bumped by New chat: a reply of an older conversation never joins the new one
let polling = false;         // a /metrics poll is in flight

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY_SLOT);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = "message " + role;
  const who = document.createElement("span");
  who.className = "role";
  who.textContent = role === "user" ? "you" : role;
  const body = document.createElement("div");
  body.className = "content";
  body.textContent = text;
  el.append(who, body);
  $("conversation").appendChild(el);
  el.scrollIntoView({ block: "end" });
  return body;
}

function needKey(message) {
  $("key-form").hidden = false;
  $("api-key").focus();
  if (keyNotice) keyNotice.parentElement.remove();
  keyNotice = addMessage("error", message + ": type the server's API key at the left");
}

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch (_) {
    return response.statusText || "HTTP " + response.status;
  }
}

async function loadModelName() {
  const r = await fetch("/v1/models", { headers: headers() });
  if (r.status === 401) { $("model-name").textContent = "(API key needed)"; needKey(await errorText(r)); return; }
  if (!r.ok) { $("model-name").textContent = "(" + (await errorText(r)) + ")"; return; }
  const data = (await r.json()).data || [];
  $("model-name").textContent = data.length ? data[0].id : "(no model)";
}

function settings() {
  const num = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  const body = { temperature: num("temperature"), top_p: num("top-p"), max_tokens: num("max-tokens") };
  const seed = num("seed");
  if (seed !== undefined) body.seed = seed;
  return body;
}

// Yields the parsed JSON of each `data:` event of a server-sent-event stream until [DONE].
async function* events(response) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

async function send(prompt) {
  history.push({ role: "user", content: prompt });
  addMessage("user", prompt);
  const system = $("system").value.trim();
  const messages = (system ? [{ role: "system", content: system }] : []).concat(history);
  const reply = addMessage("assistant", "");
  reply.parentElement.dataset.state = "streaming";
  const mine = conversation;
  let text = "", drawPending = false;
  const draw = () => { drawPending = false; renderMarkdown(reply, text); reply.scrollIntoView({ block: "end" }); };
  running = { controller: new AbortController(), tokens: 0, firstAt: null };
  setBusy(true);
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: running.controller.signal,
      body: JSON.stringify(Object.assign({ messages, stream: true }, settings())),
    });
    if (r.status === 401) { needKey(await errorText(r)); history.pop(); reply.parentElement.remove(); return; }
    if (!r.ok) throw new Error(await errorText(r));
    for await (const chunk of events(r)) {
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices && chunk.choices[0].delta;
      if (delta && delta.content) {
        running.tokens += 1;  // the server sends one chunk per decoded token
        reply.parentElement.dataset.tokens = running.tokens;
        running.firstAt = running.firstAt || performance.now();
        text += delta.content;
        // At most one render per frame: a long reply is not re-rendered for every token.
        if (!drawPending) { drawPending = true; requestAnimationFrame(draw); }
      }
    }
    draw();
    reply.parentElement.dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      draw();
      reply.parentElement.dataset.state = "stopped";
      const note = document.createElement("em");
      note.textContent = " (stopped)";
      reply.appendChild(note);
    } else {
      reply.parentElement.dataset.state = "error";
      addMessage("error", String(e.message || e));
    }
  } finally {
    if (mine === conversation) {
      if (text) history.push({ role: "assistant", content: text });
      else if (history.length && history[history.length - 1].role === "user") history.pop();
    }
    lastReplyRate = replyRate();
    running = null;
    setBusy(false);
  }
}

function replyRate() {
  if (!running || !running.firstAt || running.tokens < 2) return null;
  return (running.tokens - 1) / ((performance.now() - running.firstAt) / 1000);
}

// Prometheus text -> {name: value} for the unlabelled samples.
function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\S+)$/.exec(line);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

async function pollStatus() {
  if (polling) return;  // a slow server gets one poll at a time
  polling = true;
  const parts = [];
  const rate = running ? replyRate() : lastReplyRate;
  if (rate !== null) parts.push((running ? "this reply " : "last reply ") + rate.toFixed(1) + " tok/s");
  try {
    const r = await fetch("/metrics", { headers: headers(), signal: AbortSignal.timeout(5000) });
    if (r.ok) {
      const m = parseMetrics(await r.text());
      const used = m.pyinfer_kv_used_tokens, budget = m.pyinfer_kv_budget_tokens;
      parts.push("server " + (m.pyinfer_tokens_per_second || 0).toFixed(1) + " tok/s (last 10 s)");
      if (budget) parts.push("KV " + used + " / " + budget + " tokens (" + Math.round(100 * used / budget) + "%)");
      parts.push((m.pyinfer_running || 0) + " running, " + (m.pyinfer_waiting || 0) + " waiting");
    } else {
      parts.push("metrics: " + r.status);
    }
  } catch (_) {
    parts.push("server unreachable");
  }
  polling = false;
  $("status").textContent = parts.join(" · ");
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt || running) return;
  $("prompt").value = "";
  send(prompt);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (running) running.controller.abort(); });
$("new-chat").addEventListener("click", () => {
  if (running) running.controller.abort();
  conversation += 1;
  history.length = 0;
  $("conversation").replaceChildren();
});
$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY_SLOT, $("api-key").value.trim());
  $("api-key").value = "";
  $("key-form").hidden = true;
  if (keyNotice) { keyNotice.parentElement.remove(); keyNotice = null; }
  loadModelName();
});

loadModelName();
pollStatus();
setInterval(pollStatus, 1000);
