// Small DOM and formatting helpers shared by every page. Text is always set
// as text (textContent), never parsed as HTML: what the server returns
// (task ids, error messages, evaluator output, model messages) is data.

/** h("div.cls#id", {attr: v, onclick: f}, child...) makes an element. */
export function h(spec, attrs, ...children) {
  const m = /^([a-z0-9]+)((?:[.#][\w-]+)*)$/i.exec(spec);
  const el = document.createElement(m ? m[1] : "div");
  if (m && m[2]) {
    for (const part of m[2].match(/[.#][\w-]+/g)) {
      if (part[0] === ".") el.classList.add(part.slice(1));
      else el.id = part.slice(1);
    }
  }
  if (attrs && (typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function mount(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const m = Math.floor(ms / 60000);
  return `${m} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function fmtTime(unixMs) {
  if (!unixMs) return "–";
  return new Date(unixMs).toLocaleString();
}

/** A finished task (a GRPO group) whose usable rewards are all equal: its
 *  advantages are all 0, it teaches nothing. */
export function noSignal(t) {
  return ["completed", "partial"].includes(t.status) && t.counts.usable >= 2 && t.reward_std === 0;
}

export function fmtReward(r) {
  return r === null || r === undefined ? "–" : Number(r).toFixed(3);
}

export function fmtInt(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

/** A status word as a coloured badge. */
export function badge(word, extra) {
  return h(`span.badge.s-${String(word).replace(/[^a-z_]/gi, "")}`, String(word), extra ? ` ${extra}` : "");
}

/** A JSON value shown as indented text. */
export function pre(value) {
  return h("pre.json", typeof value === "string" ? value : JSON.stringify(value, null, 2));
}

/** Percent-encodes a path segment. */
export const seg = encodeURIComponent;

/** A result's `stats.stage_ms` in pipeline order: "init 1.2 s · ready 3 ms · ...". */
export function stagesText(stageMs, upper) {
  const order = ["queued", "init", "ready", "running", "postrun"];
  const keys = Object.keys(stageMs || {}).sort((a, b) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99));
  return keys.map((k) => `${upper ? k.toUpperCase() : k} ${fmtMs(stageMs[k])}`).join(" · ");
}

/** The scalar fields of an evaluator's detail, shortly: "exit_code: 0 · ...". */
export function evalSummary(ev) {
  if (typeof ev !== "object" || ev === null) return String(ev);
  const parts = [];
  for (const [k, v] of Object.entries(ev)) {
    if (v === null || typeof v === "object") continue;
    const text = typeof v === "string" && v.length > 40 ? `${v.slice(0, 40)}…` : JSON.stringify(v);
    parts.push(`${k}: ${text}`);
    if (parts.length === 3) break;
  }
  return parts.join(" · ") || "evaluated (see the sample)";
}
