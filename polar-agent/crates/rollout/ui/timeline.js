// The session timeline: each model call on one time axis, from the
// result's `stats.calls` (the gateway lists them from its capture log),
// or, while the session runs, from the calls its node reported so far.
// A call's bar runs from its arrival at the agent to its end: its wait in
// the agent before it left for its replica (queue: a paused generation,
// reading and normalizing the request; `sent_ms`), the backend's time to
// first token after that (TTFT), and the generation after it. Records
// without `sent_ms` (written before it) draw one bar from the arrival to
// the first token, queue included. The gap between one call's end and the next call's arrival is the
// harness's own time (tools, thinking), drawn on the axis. Failed calls
// and retries (the same request sent again) are marked.

import { h, mount, fmtMs, fmtInt } from "./dom.js";

/**
 * Draws `calls` (of `total`) in `el`. `done`: the session ended (the
 * result's list); `running`: the calls its node reported so far, live.
 */
export function timeline(el, calls, total, done, running = false) {
  el.dataset.live = running ? "true" : "false";
  if (!calls.length) {
    mount(el, h("h2", "Timeline"), h("p.muted", done ? "This session made no model call (or its node reported none)." : running ? "Running: no model call has ended yet." : "The calls are listed when the session ends."));
    return;
  }
  const t0 = Math.min(...calls.map((c) => c.received_ms));
  const t1 = Math.max(...calls.map((c) => c.finished_ms));
  const span = Math.max(t1 - t0, 1);
  const pct = (t) => `${(((t - t0) / span) * 100).toFixed(3)}%`;
  const width = (a, b) => `${Math.max(((b - a) / span) * 100, 0.15).toFixed(3)}%`;
  const place = (el, a, b) => {
    el.style.left = pct(a);
    el.style.width = width(a, b);
    return el;
  };
  // Gaps on the axis: between the end of the calls so far and the next arrival.
  const gaps = [];
  const sorted = calls.slice().sort((a, b) => a.received_ms - b.received_ms);
  let end = sorted[0].finished_ms;
  for (const c of sorted.slice(1)) {
    if (c.received_ms > end) gaps.push([end, c.received_ms]);
    end = Math.max(end, c.finished_ms);
  }
  const axis = h("div.tl-axis", gaps.map(([a, b]) => place(h("div.tl-gap", { title: `tool / harness time ${fmtMs(b - a)}` }), a, b)));
  const rows = calls.map((c) => {
    const first = c.first_token_ms || null;
    const sent = c.sent_ms || null;
    const start = sent || c.received_ms;
    const parts = [];
    if (sent) parts.push(place(h("div.tl-queue", { title: `queue in the agent ${fmtMs(sent - c.received_ms)}` }), c.received_ms, sent));
    if (first) {
      parts.push(place(h("div.tl-ttft", { title: `time to first token ${fmtMs(first - start)}${sent ? "" : " (queue included)"}` }), start, first));
      parts.push(place(h("div.tl-gen", { title: `generation ${fmtMs(c.finished_ms - first)}` }), first, c.finished_ms));
    } else {
      parts.push(place(h("div.tl-gen", { title: `call ${fmtMs(c.finished_ms - start)} (no first-token time: not streamed)` }), start, c.finished_ms));
    }
    const bar = h("div.tl-track", parts);
    const failed = c.status === "failed";
    return h("div.tl-row", { class: `tl-row${failed ? " failed" : ""}${c.retry_of !== null && c.retry_of !== undefined ? " retry" : ""}`, dataset: { seq: c.seq, status: c.status } },
      h("div.tl-label",
        h("b", `#${c.seq}`), " ", c.api, " · ", c.model,
        failed ? h("span.badge.s-failed", `failed (${c.side})`) : null,
        c.retry_of !== null && c.retry_of !== undefined ? h("span.badge.s-retry", `retry of #${c.retry_of}`) : null,
        h("div.small.muted",
          `${c.finish_reason || "–"} · ${fmtInt(c.prompt_tokens)} prompt + ${fmtInt(c.response_tokens)} response tokens · `,
          sent ? `queue ${fmtMs(sent - c.received_ms)} · ` : "",
          `TTFT ${first ? fmtMs(first - start) : "–"} · total ${fmtMs(c.finished_ms - c.received_ms)}`,
          c.token_ids_missing ? " · token ids missing" : "",
          failed && c.error ? ` · ${c.error}` : ""),
      ),
      bar,
    );
  });
  mount(el,
    h("h2", `Timeline (${calls.length}${total && total > calls.length ? ` of ${total}` : ""} calls, ${fmtMs(span)})`, running ? h("span.badge.s-running#timeline-live", "live") : null),
    h("p.legend", h("span.key.tl-queue"), " queue in the agent ", h("span.key.tl-ttft"), " time to first token ", h("span.key.tl-gen"), " generation ", h("span.key.tl-gap"), " tool / harness time between calls ", h("span.key.failed"), " failed call"),
    h("div.tl", h("div.tl-row.axis", h("div.tl-label", "harness"), axis), rows),
  );
}
