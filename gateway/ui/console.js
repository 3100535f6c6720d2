// vllm-fleet console. No framework, no build step. Every text from the fleet (names, model ids,
// log lines) goes into the page through textContent, never as markup: the CSP forbids inline
// script as a second line of defence. Keys live in sessionStorage (gone with the tab) and travel
// only in the Authorization header.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const STATE_MS = 1000, ACTIVITY_MS = 2000, LOGS_MS = 1000, MAX_LOG_LINES = 3000;
  const keys = { key: sessionStorage.getItem("fleet.key") || "", admin: sessionStorage.getItem("fleet.admin") || "" };
  let tab = "overview", firstRender = false, logCursor = 0;

  function el(tag, props, ...kids) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") n.className = v;
      else if (k === "data") Object.assign(n.dataset, v);
      else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else n[k] = v;
    }
    for (const kid of kids) n.append(kid instanceof Node ? kid : document.createTextNode(kid == null ? "" : String(kid)));
    return n;
  }

  function headers(admin) {
    const k = admin ? keys.admin : (keys.key || keys.admin);
    return k ? { Authorization: "Bearer " + k } : {};
  }

  async function getJSON(path, admin) {
    const r = await fetch(path, { headers: headers(admin), cache: "no-store" });
    if (r.status === 401 || r.status === 403) throw new Error(admin ? "admin key needed" : "key needed");
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  function banner(text) { const b = $("banner"); b.textContent = text || ""; b.hidden = !text; }

  function duration(s) {
    if (s == null || s < 0) return "";
    if (s < 60) return Math.round(s) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.round(s % 60)).padStart(2, "0");
    return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0");
  }
  // Local wall-clock time, formatted by hand: the first toLocaleTimeString() loads ICU locale data,
  // which cost ~30 ms of the first render here.
  const pad = (n) => String(n).padStart(2, "0");
  const clock = (unix) => { const d = new Date(unix * 1000); return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()); };
  const ms = (s) => (s == null ? "–" : s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(2) + " s");
  const portOf = (url) => { try { return new URL(url).port; } catch (e) { return ""; } };

  // -- Overview ---------------------------------------------------------------------------------

  function badge(text) {
    const kind = /^(RUNNING|healthy)$/.test(text) ? "ok" : /^(SLEEPING|WAKING|asleep|draining|DRAINING|STARTING|unknown)$/.test(text) ? "mid" : "bad";
    return el("span", { class: "badge " + kind }, text || "–");
  }

  async function control(name, action, button) {
    if (!keys.admin) { banner("Controls need the admin key (type it above)."); return; }
    button.disabled = true;
    try {
      const r = await fetch("/admin/instances/" + encodeURIComponent(name) + "/" + action,
        { method: "POST", headers: headers(true) });
      const body = await r.json().catch(() => ({}));
      banner(r.ok ? (body.message || action + " asked") : action + " " + name + " refused: HTTP " + r.status + " " +
        ((body.error && body.error.message) || ""));
    } catch (e) { banner(String(e)); } finally { button.disabled = false; }
  }

  function instanceRows(st) {
    const sup = st.supervisor && st.supervisor.instances;
    const byName = new Map(st.backends.map((b) => [b.name, b]));
    const rows = sup ? sup.filter((i) => i.name !== "gateway") : st.backends.map((b) => ({ name: b.name, url: b.url, models: b.models }));
    return rows.map((i) => {
      const b = byName.get(i.name) || {};
      const up = i.state === "RUNNING" && i.since ? st.time - i.since : null;
      const ctl = el("td", { class: "ctl" });
      for (const action of ["restart", "sleep", "wake"]) {
        if (action !== "restart" && !i.sleep) continue;
        const btn = el("button", { type: "button", data: { action: action } }, action);
        btn.addEventListener("click", () => control(i.name, action, btn));
        ctl.append(btn);
      }
      return el("tr", { data: { instance: i.name } },
        el("td", { class: "name" }, i.name),
        el("td", { class: "proc" }, i.state ? badge(i.state) : "–"),
        el("td", { class: "gw" }, badge(b.state || "absent")),
        el("td", {}, i.restarts == null ? "–" : i.restarts),
        el("td", {}, up == null ? "–" : duration(up)),
        el("td", { class: "served" }, (i.models || b.models || []).join(", ")),
        el("td", {}, portOf(i.url || b.url)),
        el("td", {}, i.gpus && i.gpus.length ? i.gpus.join(",") : "cpu"),
        el("td", {}, b.in_flight == null ? "–" : b.in_flight),
        ctl);
    });
  }

  // A small line chart: one polyline per series (same scale), a dot on each series' last value so
  // that a single sample still shows. Series: [[values, cssClass], ...]; null values are gaps.
  function spark(series, label) {
    const w = 150, h = 28, ns = "http://www.w3.org/2000/svg";
    const max = Math.max(1e-9, ...series.flatMap(([vals]) => vals.map((v) => v || 0)));
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("class", "spark");
    for (const [vals, cls] of series) {
      const xy = vals.map((v, i) => v == null ? null : [i * (w - 3) / Math.max(vals.length - 1, 1) + 1.5, h - 2 - (v / max) * (h - 4)]);
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", xy.filter(Boolean).map(([x, y]) => x.toFixed(1) + "," + y.toFixed(1)).join(" "));
      line.setAttribute("class", cls);
      svg.append(line);
      const last = xy.filter(Boolean).pop();
      if (last) {
        const dot = document.createElementNS(ns, "circle");
        dot.setAttribute("cx", last[0].toFixed(1)); dot.setAttribute("cy", last[1].toFixed(1)); dot.setAttribute("r", "1.5");
        dot.setAttribute("class", cls);
        svg.append(dot);
      }
    }
    const t = document.createElementNS(ns, "title");
    t.textContent = label;
    svg.append(t);
    return svg;
  }

  function modelRows(st) {
    return st.models.map((m) => {
      const s = st.series[m.model];
      const rate = s ? s.req_per_s : [0, 0], p50 = s ? s.ttfb_p50_s : [], p99 = s ? s.ttfb_p99_s : [];
      const lastOf = (a) => { for (let i = a.length - 1; i >= 0; i--) if (a[i] != null) return a[i]; return null; };
      return el("tr", { data: { model: m.model } },
        el("td", { class: "name" }, m.model),
        el("td", {}, m.healthy + " / " + m.replicas),
        el("td", {}, m.in_flight),
        el("td", {}, spark([[rate, "a"]], "req/s, 10 s buckets"), " ", rate[rate.length - 1].toFixed(1)),
        el("td", {}, spark([[p99, "b"], [p50, "a"]], "TTFB p50 (blue) and p99 (orange), 10 s buckets"), " ",
          ms(lastOf(p50)) + " / " + ms(lastOf(p99))));
    });
  }

  function gpuBlocks(st) {
    const gpus = st.supervisor && st.supervisor.gpus;
    if (!gpus) return [el("p", { class: "muted" }, st.supervisor ? "the supervisor did not answer" : "no supervisor: GPUs unknown")];
    if (!gpus.length) return [el("p", { class: "muted" }, "no GPU found (NVML): a CPU fleet")];
    return gpus.map((g) => el("div", { class: "gpu" },
      el("span", { class: "name" }, "GPU " + g.index + " · " + g.name),
      el("meter", { min: 0, max: g.memory_total_mib, value: g.memory_used_mib, high: g.memory_total_mib * 0.9 }),
      el("span", {}, `${(g.memory_used_mib / 1024).toFixed(1)} / ${(g.memory_total_mib / 1024).toFixed(1)} GiB`),
      el("span", { class: "pill" }, g.vram_tier)));
  }

  function render(st) {
    $("node").textContent = "node tier " + st.vram_tier;
    $("ready").textContent = st.ready ? "ready" : "not ready";
    $("ready").className = "pill " + (st.ready ? "ok" : "bad");
    $("sup").textContent = !st.supervisor ? "no supervisor" : st.supervisor.connected ? "supervisor connected" : "supervisor lost";
    $("updated").textContent = "updated " + clock(st.time);
    $("instances").tBodies[0].replaceChildren(...instanceRows(st));
    $("models").tBodies[0].replaceChildren(...modelRows(st));
    $("gpus").replaceChildren(...gpuBlocks(st));
    const json = JSON.stringify(st.infernet, null, 2);
    if ($("infernet").textContent !== json) $("infernet").textContent = json;
    const sel = $("model"), want = st.models.map((m) => m.model).join("\n");
    if (sel.dataset.models !== want) {
      const keep = sel.value;
      sel.replaceChildren(...st.models.map((m) => el("option", { value: m.model }, m.model)));
      if (keep) sel.value = keep;
      sel.dataset.models = want;
    }
    if (!firstRender) {
      firstRender = true;
      performance.mark("fleet-first-render");
      document.body.dataset.rendered = "1";
    }
  }

  // -- Activity and logs ------------------------------------------------------------------------

  function renderActivity(body) {
    $("prompthead").hidden = !body.prompts;
    $("requests").tBodies[0].replaceChildren(...body.requests.map((r) => el("tr", {},
      el("td", {}, clock(r.time)), el("td", {}, r.model), el("td", {}, r.backend),
      el("td", { class: typeof r.status === "number" && r.status < 400 ? "ok" : "bad" }, String(r.status)),
      el("td", {}, ms(r.latency_s)), el("td", {}, ms(r.ttfb_s)),
      el("td", {}, r.tokens == null ? "–" : String(r.tokens)),
      ...(body.prompts ? [el("td", { class: "prompt" }, r.prompt || "")] : []))));
  }

  function logMatches(line) {
    const f = $("filter").value.toLowerCase(), src = $("source").value;
    return (!src || line.source === src) && (!f || line.text.toLowerCase().includes(f) || line.source.toLowerCase().includes(f));
  }

  function addLogs(body) {
    const box = $("loglines"), sel = $("source");
    const known = new Set([...sel.options].map((o) => o.value));
    for (const s of body.sources) if (!known.has(s)) sel.append(el("option", { value: s }, s));
    for (const line of body.lines) {
      const row = el("div", { class: "line", data: { source: line.source } },
        el("span", { class: "ts" }, clock(line.time)),
        el("span", { class: "src" }, line.source), el("span", { class: "txt" }, line.text));
      row.hidden = !logMatches(line);
      row._line = line;
      box.append(row);
    }
    while (box.childElementCount > MAX_LOG_LINES) box.firstElementChild.remove();
    if ($("follow").checked && body.lines.length) box.scrollTop = box.scrollHeight;
    logCursor = body.last;
  }

  function refilter() { for (const row of $("loglines").children) row.hidden = !logMatches(row._line); }

  // -- Playground -------------------------------------------------------------------------------

  async function chat(ev) {
    ev.preventDefault();
    const out = $("reply"), stat = $("replystat"), send = $("send");
    out.textContent = ""; stat.textContent = "…"; send.disabled = true;
    const t0 = performance.now(); let first = null, events = 0;
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json", ...headers(false) },
        body: JSON.stringify({ model: $("model").value, stream: true, max_tokens: Number($("max_tokens").value),
          temperature: Number($("temperature").value), messages: [{ role: "user", content: $("prompt").value }] }) });
      if (!r.ok) { const b = await r.json().catch(() => ({})); throw new Error("HTTP " + r.status + " " + ((b.error && b.error.message) || "")); }
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, cut).trim(); buf = buf.slice(cut + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const doc = JSON.parse(data);
          if (doc.error) throw new Error(doc.error.message);
          const delta = doc.choices && doc.choices[0] && doc.choices[0].delta;
          if (delta && delta.content) { if (first == null) first = performance.now(); out.append(delta.content); events++; }
        }
      }
      stat.textContent = `${events} chunks · first token ${first == null ? "–" : Math.round(first - t0) + " ms"} · total ${Math.round(performance.now() - t0)} ms`;
      out.dataset.done = "1";
    } catch (e) { stat.textContent = "error: " + e.message; } finally { send.disabled = false; }
  }

  // -- Loops ------------------------------------------------------------------------------------

  function loop(fn, every) {
    const run = async () => {
      if (!document.hidden) { try { await fn(); } catch (e) { banner(e.message); } }
      setTimeout(run, every);
    };
    run();
  }

  function init() {
    $("key").value = keys.key; $("admin").value = keys.admin;
    $("keys").addEventListener("submit", (ev) => {
      ev.preventDefault();
      keys.key = $("key").value.trim(); keys.admin = $("admin").value.trim();
      sessionStorage.setItem("fleet.key", keys.key); sessionStorage.setItem("fleet.admin", keys.admin);
      banner("");
    });
    for (const b of document.querySelectorAll("nav button")) {
      b.addEventListener("click", () => {
        tab = b.dataset.tab;
        for (const o of document.querySelectorAll("nav button")) o.classList.toggle("on", o === b);
        for (const s of document.querySelectorAll("main > section")) s.hidden = s.id !== tab;
      });
    }
    $("copy").addEventListener("click", () => navigator.clipboard.writeText($("infernet").textContent)
      .then(() => banner("Infernet JSON copied"), () => banner("copy refused by the browser: select the text")));
    $("filter").addEventListener("input", refilter);
    $("source").addEventListener("change", refilter);
    $("chat").addEventListener("submit", chat);
    loop(async () => { render(await getJSON("/ui/api/state")); if (!/refused|copied|asked/.test($("banner").textContent)) banner(""); }, STATE_MS);
    // With the admin key, so that prompt excerpts show where the operator turned them on.
    loop(async () => { if (tab === "activity") renderActivity(await getJSON("/ui/api/activity", !!keys.admin)); }, ACTIVITY_MS);
    loop(async () => {
      if (tab !== "logs") return;
      if (!keys.admin) { $("lognote").textContent = "logs need the admin key"; return; }
      const body = await getJSON("/admin/logs?after=" + logCursor, true);
      $("lognote").textContent = body.note || "";
      addLogs(body);
    }, LOGS_MS);
  }

  document.addEventListener("DOMContentLoaded", init);
})();
