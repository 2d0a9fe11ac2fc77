// A finished sample's model calls from its exported calls file (the
// gateway's `<session>.calls.jsonl.zst`, read by the server beneath its
// export roots): per call, its outcome, the native request the harness sent
// (method, host, path, body) and the reply. Loaded when asked for: a
// session's calls can be megabytes.

import { api } from "./api.js";
import { h, mount, badge, fmtInt, fmtMs, pre, seg } from "./dom.js";

/** Draws the calls section of sample `index` of `taskId` in `el`; `s` is the sample. */
export function callsSection(el, taskId, index, s) {
  const stats = (s.result && s.result.stats) || {};
  if (!stats.calls_uri) {
    mount(el, h("h2", "Calls"), h("p.muted", s.state === "done"
      ? "No calls file was exported for this session (its node's export_calls is off, or it never exported)."
      : "The calls are exported when the session ends."));
    return;
  }
  const show = h("button#show-calls.small", { onclick: async () => {
    show.disabled = true;
    try {
      const r = await api(`/v1/tasks/${seg(taskId)}/samples/${index}/calls`);
      draw(el, r);
    } catch (e) {
      mount(el, h("h2", "Calls"), h("p.error#calls-error", e.message));
    }
  } }, "Show the calls");
  mount(el, h("h2", "Calls"), h("p.small.muted", "From the exported file ", h("code", stats.calls_uri), " "), show);
}

function draw(el, r) {
  const rows = r.calls.map((c) => h("details.call", { dataset: { callId: c.call_id } },
    h("summary",
      `#${c.seq} `, badge(c.status), ` ${c.model || ""} · ${c.native_request.method} ${c.native_request.host}${c.native_request.path}`,
      ` · ${fmtInt(c.prompt_tokens)} prompt + ${fmtInt(c.response_tokens)} response tokens · ${fmtMs(c.finished_ms - c.received_ms)}`,
      c.finish_reason ? ` · ${typeof c.finish_reason === "string" ? c.finish_reason : JSON.stringify(c.finish_reason)}` : "",
      c.error ? ` · ${c.side}: ${c.error}` : ""),
    h("h3", "Native request"), h("div.native-request", pre(c.native_request.body)),
    h("h3", "Reply"), h("div.reply", c.response ? pre(c.response) : h("p.muted", "No reply (the call failed).")),
    c.resumed ? [h("h3", "Resumed"), pre(c.resumed)] : null));
  mount(el,
    h("h2", `Calls (${r.calls.length})`),
    h("p.small.muted", `From the exported file `, h("code", r.uri), ` (${fmtInt(r.file_bytes)} bytes, calls schema ${r.calls_schema_version})`),
    h("div#calls-list", rows));
}
