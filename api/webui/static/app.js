// Conveyor chat page: streams /v1/chat/completions over SSE and shows the engine's live state.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  model: null,
  history: [],      // {role, content}
  controller: null, // AbortController of the reply in flight
  apiKey: localStorage.getItem("conveyor-api-key") || "",
};

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.apiKey) h["Authorization"] = "Bearer " + state.apiKey;
  return h;
}

function showError(text) {
  const el = $("error");
  el.textContent = text; // textContent: never interpreted as HTML
  el.hidden = !text;
}

function needKey() {
  $("key-row").hidden = false;
  $("settings").open = true;
  $("api-key").focus();
}

async function errorFromResponse(resp) {
  let detail = resp.statusText, code = null;
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) detail = body.error.message;
    if (body && body.error) code = body.error.code;
  } catch (_) { /* not JSON */ }
  if (resp.status === 401) needKey();
  let hint = "";
  if (code === "context_length_exceeded") {
    hint = "\nShorten the message, or press Clear to start a new conversation.";
  }
  return `HTTP ${resp.status}: ${detail}${hint}`;
}

async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) {
      $("model-name").textContent = "model list unavailable";
      showError(await errorFromResponse(resp));
      return;
    }
    const body = await resp.json();
    state.model = body.data && body.data.length ? body.data[0].id : null;
    $("model-name").textContent = state.model ? "model: " + state.model : "no model";
    showError("");
  } catch (e) {
    $("model-name").textContent = "server unreachable";
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const content = document.createElement("span");
  content.className = "content";
  content.textContent = text;
  div.appendChild(content);
  const meta = document.createElement("span");
  meta.className = "meta";
  div.appendChild(meta);
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return { div, content, meta };
}

// readSSE yields the data payload of every event in a fetch response body.
async function* readSSE(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let idx;
    while ((idx = buf.search(/\r?\n\r?\n/)) >= 0) {
      const raw = buf.slice(0, idx);
      buf = buf.slice(idx).replace(/^\r?\n\r?\n/, "");
      const data = raw.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

async function send(text) {
  showError("");
  state.history.push({ role: "user", content: text });
  const asked = addMessage("user", text);
  const reply = addMessage("assistant", "");
  reply.div.classList.add("streaming");
  const messages = [];
  const system = $("system-prompt").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...state.history);
  const req = {
    model: state.model || "default",
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  const seed = $("seed").value.trim();
  if (seed !== "") req.seed = Number(seed);

  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  const started = performance.now();
  let firstAt = null, lastAt = null, tokens = 0, usage = null, text_ = "", finish = null;
  let stopped = false, failed = false;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(req), signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await errorFromResponse(resp));
    for await (const data of readSSE(resp.body)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error("stream error: " + (chunk.error.message || "unknown"));
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices || []) {
        const delta = c.delta && c.delta.content;
        if (delta) {
          const now = performance.now();
          if (firstAt === null) firstAt = now;
          lastAt = now;
          tokens += 1; // an estimate until the usage chunk arrives
          text_ += delta;
          reply.content.textContent = text_; // textContent: model text is never HTML
          $("messages").scrollTop = $("messages").scrollHeight;
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      stopped = true;
    } else {
      failed = true;
      showError(e.message);
    }
  } finally {
    state.controller = null;
    setBusy(false);
    reply.div.classList.remove("streaming");
  }
  if (usage && usage.completion_tokens != null) tokens = usage.completion_tokens;
  if (!text_) {
    // Nothing came back (an error, or Stop before the first token): drop the turn and
    // give the prompt back for an edit and a retry.
    state.history.pop();
    asked.div.remove();
    reply.div.remove();
    if (!$("prompt").value.trim()) $("prompt").value = text;
    return;
  }
  const parts = [];
  if (firstAt !== null) {
    parts.push(`TTFT ${Math.round(firstAt - started)} ms`);
    const span = (lastAt - firstAt) / 1000;
    if (tokens > 1 && span > 0) parts.push(`${((tokens - 1) / span).toFixed(1)} tokens/s`);
    parts.push(`${tokens} tokens`);
  }
  if (stopped) parts.push("stopped");
  else if (failed) parts.push("ended by an error");
  else if (finish) parts.push(`finish: ${finish}`);
  reply.meta.textContent = parts.join(" · ");
  state.history.push({ role: "assistant", content: text_ });
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => { if (state.controller) state.controller.abort(); });
$("clear").addEventListener("click", () => {
  if (state.controller) state.controller.abort();
  state.history = [];
  $("messages").textContent = "";
  showError("");
});
$("api-key").value = state.apiKey;
$("api-key").addEventListener("change", () => {
  state.apiKey = $("api-key").value.trim();
  localStorage.setItem("conveyor-api-key", state.apiKey);
  loadModel();
});

function fmt(n) { return n == null ? "–" : String(n); }

async function pollStats() {
  let status = "";
  try {
    const resp = await fetch("/v1/engine/stats", { headers: headers() });
    if (resp.ok) {
      showStats(await resp.json());
    } else {
      status = resp.status === 401 ? "needs the API key" : `HTTP ${resp.status}`;
    }
  } catch (_) {
    status = "server unreachable"; // restarting: try again next tick
  }
  $("engine-status").textContent = status;
  setTimeout(pollStats, 1000);
}

function pct(x) { return x == null ? "–" : (100 * x).toFixed(1) + " %"; }

function showStats(s) {
  $("stat-running").textContent = fmt(s.running);
  $("stat-waiting").textContent = fmt(s.waiting);
  $("stat-kv-used").textContent = fmt(s.kv_used_blocks);
  $("stat-kv-cached").textContent = fmt(s.kv_cached_blocks);
  $("stat-kv-free").textContent = fmt(s.kv_free_blocks);
  $("stat-kv-usage").textContent = pct(s.kv_usage);
  $("stat-prefix").textContent = s.prefix_cache_queries_tokens ? pct(s.prefix_cache_hit_rate) : "–";
  $("stat-preempt").textContent = fmt(s.preemptions);
  $("stat-steps").textContent = fmt(s.steps);
  const drafted = s.spec_drafts > 0;
  $("stat-spec-proposed").textContent = fmt(s.spec_draft_tokens);
  $("stat-spec-rate").textContent = drafted ? pct(s.spec_acceptance_rate) : "–";
  $("stat-spec-length").textContent = drafted ? s.spec_mean_accepted_length.toFixed(2) : "–";
  $("spec-off").hidden = drafted;
  const total = s.kv_total_blocks || 0;
  const share = (n) => (total > 0 ? (100 * (n || 0)) / total : 0) + "%";
  $("kv-bar").querySelector(".used").style.width = share(s.kv_used_blocks);
  $("kv-bar").querySelector(".cached").style.width = share(s.kv_cached_blocks);
  $("kv-bar").title = `${fmt(s.kv_used_blocks)} used, ${fmt(s.kv_cached_blocks)} cached, ` +
    `${fmt(s.kv_free_blocks)} free of ${total} blocks of ${fmt(s.block_size)} tokens`;
  drawBars(s.recent_batch_sizes || []);
}

function drawBars(sizes) {
  const el = $("batch-bars");
  const maxv = Math.max(1, ...sizes);
  el.textContent = "";
  for (const n of sizes) {
    const bar = document.createElement("div");
    bar.style.height = (100 * n / maxv) + "%";
    bar.title = n + (n === 1 ? " sequence" : " sequences");
    el.appendChild(bar);
  }
  $("batch-max").textContent = sizes.length ? "max " + maxv : "";
}

loadModel();
pollStats();
