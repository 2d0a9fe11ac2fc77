// The trajectory viewer: a sample's exported rows (one per trace) as the
// trainer will see them. A trace is `prompt_ids + response_ids`; its
// `loss_mask` says which response tokens are trained (the policy generated
// them) and which are glue (tool results, template text); its spans
// (`trace_metadata.spans`) say where each merged call's generated tokens
// sit, how the call joined (first, extend, a template splice) and its
// policy version. Chains and segments are the rows themselves; a segment
// that starts after a compaction or rewritten history says so.
//
// Two views of the same session: as exported (prefix_merging: one trace
// per chain segment), and per request (each call alone: its prompt as the
// merged prefix up to its generated tokens, all of them trained), derived
// from the spans. A spliced call's own prompt differs from the merged
// prefix after `diverged_at` (its template re-rendered the previous
// turn), which the per-request view marks instead of inventing tokens.
//
// Token text: the server sends each distinct id's text (`token_text`,
// decoded with the operator's tokenizer.json); without a tokenizer it says
// why and cells show ids. A toggle switches between text and ids.

import { api } from "./api.js";
import { h, mount, badge, fmtInt, fmtReward, pre, seg } from "./dom.js";
import { tokenGrid, KIND_PROMPT, KIND_GLUE, KIND_TRAINED } from "./tokens.js";

/** Mounts the viewer for sample `index` of `taskId` into `el`; returns a cleanup. */
export function trajectoryViewer(el, taskId, index, opts = {}) {
  // Element ids only for the one viewer of a session page (two side by
  // side would repeat them).
  const id = (name) => (opts.ids === false ? "" : `#${name}`);
  let grid = null;
  let dead = false;
  mount(el, h("h2", "Trajectory"), h("p.muted", "Reading the exported file…"));
  const started = performance.now();
  api(`/v1/tasks/${seg(taskId)}/samples/${index}/trajectory`).then(
    (t) => {
      if (dead) return;
      render(t);
      el.dataset.loadedMs = String(Math.round(performance.now() - started));
    },
    (e) => {
      if (!dead) mount(el, h("h2", "Trajectory"), h(`p.error${id("trajectory-error")}`, e.message));
    },
  );

  function render(t) {
    const rows = t.rows.slice().sort((a, b) => a.trace_index - b.trace_index);
    if (!rows.length) {
      mount(el, h("h2", "Trajectory"), h("p.muted", `${t.uri}: no trace of this session.`));
      return;
    }
    const first = rows[0];
    const builder = first.builder;
    const st = first.stats || {};
    let view = builder === "prefix_merging" ? "merged" : "calls";
    let mode = "mask";
    let current = 0;
    const tt = t.token_text || {};
    const pieces = tt.pieces || null;
    let text = !!pieces;
    const list = h("div.tracelist");
    const gridBox = h("div.gridbox");
    const info = h("div.traceinfo");
    const detail = h(`div.tokdetail${id("token-detail")}`, h("p.muted", "Click a token to see its call and messages."));
    const btn = (label, name, on, pressed, disabled, title) =>
      h(`button${id(name)}`, { class: pressed ? "toggle on" : "toggle", dataset: { control: name }, onclick: on, disabled, title }, label);
    const controls = h("div.controls");
    const drawControls = () => mount(controls,
      h("span.group",
        btn("prefix_merging (as exported)", "view-merged", () => setView("merged"), view === "merged", builder !== "prefix_merging",
          builder !== "prefix_merging" ? "exported with per_request: re-export with `polar export --builder prefix_merging` to merge" : null),
        btn("per_request", "view-calls", () => setView("calls"), view === "calls")),
      h("span.group",
        btn("loss mask", "mode-mask", () => setMode("mask"), mode === "mask"),
        btn("logprob heat", "mode-logprob", () => setMode("logprob"), mode === "logprob")),
      h("span.group",
        btn("text", "show-text", () => setText(true), text, !pieces, pieces ? null : tt.reason),
        btn("ids", "show-ids", () => setText(false), !text)),
      h("span.group",
        btn("first trained token", "jump-trained", jumpTrained, false, false, "scroll to the first token with loss 1 and show it")));
    // The shown sequence, for the jump.
    let shown = null;
    const jumpTrained = () => {
      if (!shown || !grid) return;
      const i = shown.s.kind.indexOf(KIND_TRAINED);
      if (i < 0) {
        mount(detail, h("p.muted", "No token of this sequence is trained (loss 0 everywhere)."));
        return;
      }
      grid.reveal(i);
      showToken(detail, shown.s, shown.u, i);
    };
    const units = () => (view === "merged" ? rows.map((r, i) => ({ row: r, trace: i, call: null })) : perCall(rows));
    const drawList = () => {
      const us = units();
      mount(list, us.map((u, i) => {
        const r = u.row;
        const label = u.call === null
          ? [`trace ${r.trace_index}`, h("div.small", `chain ${r.chain} (${r.chain_role}) · segment ${r.segment} ${r.segment_kind}${r.break_reason ? ` (${r.break_reason})` : ""}`),
             h("div.small.muted", `${fmtInt(r.prompt_ids.length + r.response_ids.length)} tokens · ${r.call_ids.length} calls`), r.labels.length ? h("div.small", r.labels.map((l) => badge(l))) : null]
          : [`call ${u.k} of trace ${r.trace_index}`, h("div.small.muted", `${r.call_ids[u.k] || "?"} · ${fmtInt(u.len)} tokens`), u.splice ? h("div.small", badge("template_spliced")) : null];
        return h("div.traceitem", { class: i === current ? "traceitem on" : "traceitem", dataset: { unit: i }, onclick: () => select(i) }, label);
      }));
    };
    const select = (i) => {
      current = i;
      drawList();
      const u = units()[i];
      const s = view === "merged" ? mergedSeq(u.row) : callSeq(u);
      s.pieces = pieces;
      if (grid) grid.destroy();
      grid = tokenGrid(gridBox, s, { mode, text, onPick: (j) => showToken(detail, s, u, j) });
      shown = { s, u };
      mount(detail, h("p.muted", "Click a token to see its call and messages."));
      drawInfo(info, u, s, id);
    };
    const setView = (v) => {
      view = v;
      current = 0;
      drawControls();
      select(0);
    };
    const setMode = (m) => {
      mode = m;
      drawControls();
      if (grid) grid.setMode(m);
    };
    const setText = (on) => {
      text = on;
      drawControls();
      if (grid) grid.setText(on);
    };
    mount(el,
      h("h2", "Trajectory"),
      h("p.small", `${builder} · ${rows.length} traces · file `, h("code", t.uri), ` (${t.format}, ${fmtInt(t.file_bytes)} bytes) · reward ${fmtReward(first.reward)} · status ${first.status}`),
      h("p.small.muted", `calls ${st.calls ?? "–"} · chains ${st.chains ?? "–"} · segments ${st.segments ?? "–"} · breaks ${st.breaks ?? "–"} · retries superseded ${st.retries_superseded ?? "–"} · template mismatches ${st.template_mismatches_detected ?? "–"} (spliced ${st.template_mismatches_spliced ?? "–"}) · calls dropped ${(st.calls_dropped || []).length} · trained tokens ${fmtInt(st.loss_tokens)}`),
      pieces
        ? h(`p.small.muted${id("token-text-note")}`, "Token text: each id decoded on its own with ", h("code", tt.tokenizer), " (the server's tokenizer); ↵ ⇥ mark line breaks and tabs, ‹hex› the bytes of a partial UTF-8 character, bold purple text special tokens.")
        : h(`p.small.muted${id("token-text-note")}`, `Token text: ids only: ${tt.reason || "the server sent no token text"}.`),
      controls,
      h("p.legend", h("span.key.kp"), " prompt ", h("span.key.kg"), " glue (loss 0) ", h("span.key.kt"), " trained (loss 1) ", h("span.key.b-span"), " a call's generated tokens start ", h("span.key.b-glue"), " glue starts ", h("span.key.b-splice"), " template splice ", " · logprob heat: ", [0, 3, 6, 9].map((n) => h(`span.key.kt.h${n}`)), " low → high probability"),
      h("div.trajview", list, h("div.trajmain", info, gridBox, detail)),
    );
    el.addEventListener("reveal", (e) => grid && grid.reveal(e.detail));
    drawControls();
    select(0);
  }

  return () => {
    dead = true;
    if (grid) grid.destroy();
  };
}

/** The spans of a row, with each one's glue start. */
function spansOf(r) {
  const spans = (r.trace_metadata && r.trace_metadata.spans) || [];
  let end = 0;
  return spans.map((s, k) => {
    const out = { ...s, k, glue_start: end };
    end = s.response_start + s.response_len;
    return out;
  });
}

/** The exported trace as a token sequence with its kinds and marks. */
export function mergedSeq(r) {
  const P = r.prompt_ids.length;
  const n = P + r.response_ids.length;
  const ids = new Uint32Array(n);
  ids.set(r.prompt_ids, 0);
  ids.set(r.response_ids, P);
  const kind = new Uint8Array(n);
  const lp = r.response_logprobs ? new Float32Array(n).fill(NaN) : null;
  for (let j = 0; j < r.response_ids.length; j++) {
    kind[P + j] = r.loss_mask[j] === 1 ? KIND_TRAINED : KIND_GLUE;
    if (lp && r.loss_mask[j] === 1) lp[P + j] = r.response_logprobs[j];
  }
  const marks = new Map();
  const mark = (i, cls, title) => {
    if (i < 0 || i >= n) return;
    if (!marks.has(i)) marks.set(i, []);
    marks.get(i).push({ cls, title });
  };
  const spans = spansOf(r);
  const spanOf = new Int32Array(n).fill(0);
  for (const s of spans) {
    if (s.response_start > s.glue_start) mark(P + s.glue_start, "b-glue", `call ${s.k}: glue (tool results, template) starts`);
    mark(P + s.response_start, "b-span", `call ${s.k} (${r.call_ids[s.k] || "?"}): generated tokens start (${s.join.kind})`);
    if (s.join.kind === "splice") mark(s.join.diverged_at, "b-splice", `call ${s.k}: template splice: its prompt re-rendered the previous turn from here (resumed at its own token ${s.join.resumed_from})`);
    for (let j = s.glue_start; j < s.response_start + s.response_len; j++) spanOf[P + j] = s.k;
  }
  return { ids, kind, lp, marks, spanOf, length: n, prompt: P, row: r };
}

/** Every call of every trace, for the per-request view. */
function perCall(rows) {
  const out = [];
  rows.forEach((r, trace) => {
    for (const s of spansOf(r)) {
      out.push({ row: r, trace, call: s, k: s.k, len: r.prompt_ids.length + s.response_start + s.response_len, splice: s.join.kind === "splice" });
    }
  });
  return out;
}

/** One call alone: its prompt (the merged prefix before its tokens) and its generated tokens, all trained. */
function callSeq(u) {
  const r = u.row;
  const m = mergedSeq(r);
  const start = m.prompt + u.call.response_start;
  const n = start + u.call.response_len;
  const kind = new Uint8Array(n);
  kind.fill(KIND_TRAINED, start);
  const marks = new Map();
  marks.set(start, [{ cls: "b-span", title: `call ${u.k}: generated tokens start` }]);
  if (u.call.join.kind === "splice") {
    const at = u.call.join.diverged_at;
    marks.set(at, [{ cls: "b-splice", title: `call ${u.k}'s own prompt differs from here (its template re-rendered the previous turn); the export keeps the merged prefix, shown here, and its own glue from its token ${u.call.join.resumed_from}` }]);
  }
  const spanOf = new Int32Array(n).fill(u.k);
  return { ids: m.ids.subarray(0, n), kind, lp: m.lp ? m.lp.subarray(0, n) : null, marks, spanOf, length: n, prompt: start, row: r, call: u.k };
}

function drawInfo(el, u, s, id) {
  const r = u.row;
  const prev = r.trace_metadata && r.trace_metadata.previous;
  const spans = spansOf(r);
  const trained = s.kind.reduce((a, k) => a + (k === KIND_TRAINED ? 1 : 0), 0);
  const banner = r.segment_kind === "after_break"
    ? h(`p.banner${id("break-banner")}`, r.break_reason === "compaction" ? "Compaction starts here: " : "The prefix broke here: ",
      `this segment continues chain ${r.chain} after a ${r.break_reason || "break"}`, prev ? ` (it shares ${fmtInt(prev.common_prefix_len)} tokens with segment ${prev.segment})` : "", ".")
    : r.segment_kind === "superseded_retry" ? h("p.banner", "A call that a retry replaced: kept as its own trace.") : null;
  mount(el,
    banner,
    h("p.small", `${fmtInt(s.length)} tokens · ${fmtInt(s.prompt)} prompt · ${fmtInt(trained)} trained`, u.call !== null ? ` · call ${u.k} alone (per request)` : ` · ${spans.length} calls merged`, r.finish_reason ? ` · finish ${r.finish_reason}` : ""),
    u.call === null && spans.length ? spanTable(el, r, s, spans) : null,
  );
}

/** The calls of a trace, built when first opened (a trace may merge thousands). */
function spanTable(el, r, s, spans) {
  const d = h("details.spans", h("summary", `Calls in this trace (${spans.length})`));
  d.addEventListener("toggle", () => {
    if (!d.open || d.querySelector("table")) return;
    d.append(h("table.spans",
      h("thead", h("tr", ["call", "id", "join", "glue", "generated", "policy", "flags"].map((x) => h("th", x)))),
      h("tbody", spans.map((sp) => h("tr",
        h("td", h("a", { href: "#", onclick: (e) => { e.preventDefault(); gridReveal(el, s.prompt + sp.response_start); } }, `#${sp.k}`)),
        h("td.small", r.call_ids[sp.k] || "?"),
        h("td", sp.join.kind === "splice" ? `splice (diverged at ${sp.join.diverged_at}, resumed from ${sp.join.resumed_from})` : sp.join.kind),
        h("td", fmtInt(sp.response_start - sp.glue_start)),
        h("td", fmtInt(sp.response_len)),
        h("td.small", sp.policy_version || "–"),
        h("td.small", sp.truncated ? "truncated" : ""),
      )))));
  });
  return d;
}

function gridReveal(el, i) {
  el.dispatchEvent(new CustomEvent("reveal", { bubbles: true, detail: i }));
}

/** A token's text for the detail panel. */
function pieceText(p) {
  if (!p || p.unknown) return "not in the tokenizer's vocabulary";
  if (p.parts) {
    const shown = p.parts.map((x) => (x.bytes ? `<bytes ${x.bytes.map((b) => `0x${b.toString(16).toUpperCase().padStart(2, "0")}`).join(" ")}>` : JSON.stringify(x.text))).join(" ");
    return `${shown} (part of a multi-byte UTF-8 character)`;
  }
  return `${JSON.stringify(p.text)}${p.special ? " (special token)" : ""}${p.lossy ? " (the decoder replaced bytes it could not name)" : ""}`;
}

function showToken(el, s, u, i) {
  const r = s.row;
  const k = s.spanOf[i];
  const kindName = ["prompt", "glue (loss 0)", "trained (loss 1)"][s.kind[i]];
  const lp = s.lp && !Number.isNaN(s.lp[i]) ? s.lp[i] : null;
  const msgs = messagesOfCall(r, k);
  mount(el,
    h("p", h("b", `token ${i}`), ` · id ${s.ids[i]}`, s.pieces ? [" · text ", h("code.toktext", pieceText(s.pieces[s.ids[i]]))] : null, ` · ${kindName}`, lp !== null ? ` · logprob ${lp.toFixed(4)} (p ${Math.exp(lp).toFixed(3)})` : "",
      ` · ${i < s.prompt && k === 0 ? "prompt of call 0" : `call ${k}`} (${r.call_ids[k] || "?"})`),
    h("p.small.muted", msgs.note),
    msgs.items.map((m) => h("div.msg", h("div.msgrole", m.role, m.part ? ` (${m.part})` : ""), pre(messageText(m.message)))),
  );
}

/**
 * The messages call k of a merged trace came from, by position: call 0's
 * prompt is prompt_messages; call k's reply is the k-th assistant message
 * after them, and the messages between replies k-1 and k are its glue.
 */
export function messagesOfCall(r, k) {
  const all = r.prompt_messages.concat(r.response_messages);
  const base = r.prompt_messages.length;
  const replies = [];
  for (let i = base; i < all.length; i++) if (all[i].role === "assistant") replies.push(i);
  const items = [];
  if (k === 0) for (const m of r.prompt_messages) items.push({ role: m.role, part: "prompt", message: m });
  const from = k === 0 ? base : replies[k - 1] !== undefined ? replies[k - 1] + 1 : null;
  const to = replies[k];
  if (k > 0 && from !== null) for (let i = from; i < (to === undefined ? all.length : to); i++) items.push({ role: all[i].role, part: "glue", message: all[i] });
  if (to !== undefined) items.push({ role: "assistant", part: "reply", message: all[to] });
  return { items, note: "Messages matched to the call by position (the export keeps the last call's conversation, not each call's)." };
}

function messageText(m) {
  const parts = [];
  const c = m.content;
  if (typeof c === "string") parts.push(c);
  else if (Array.isArray(c)) for (const p of c) parts.push(typeof p === "string" ? p : p.text !== undefined ? p.text : JSON.stringify(p));
  if (m.reasoning) parts.unshift(`[reasoning] ${typeof m.reasoning === "string" ? m.reasoning : JSON.stringify(m.reasoning)}`);
  if (m.tool_calls) parts.push(`[tool calls] ${JSON.stringify(m.tool_calls)}`);
  if (m.tool_call_id) parts.unshift(`[tool result for ${m.tool_call_id}]`);
  return parts.join("\n") || JSON.stringify(m);
}
