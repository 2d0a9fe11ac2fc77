// The session timeline: each model call on one time axis, from the
// result's `stats.calls` (the gateway lists them from its capture log).
// A call's bar runs from its arrival at the agent to its end: the part
// before the first token (TTFT, which includes any wait in the agent's
// queue: the record has no separate queue time) and the generation after
// it. The gap between one call's end and the next call's arrival is the
// harness's own time (tools, thinking), drawn on the axis. Failed calls
// and retries (the same request sent again) are marked.

import { h, mount, fmtMs, fmtInt } from "./dom.js";

export function timeline(el, calls, total, done) {
  if (!calls.length) {
    mount(el, h("h2", "Timeline"), h("p.muted", done ? "This session made no model call (or its node reported none)." : "The calls are listed when the session ends."));
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
    const bar = h("div.tl-track",
      first
        ? [place(h("div.tl-ttft", { title: `time to first token ${fmtMs(first - c.received_ms)}` }), c.received_ms, first),
           place(h("div.tl-gen", { title: `generation ${fmtMs(c.finished_ms - first)}` }), first, c.finished_ms)]
        : place(h("div.tl-gen", { title: `call ${fmtMs(c.finished_ms - c.received_ms)} (no first-token time: not streamed)` }), c.received_ms, c.finished_ms),
    );
    const failed = c.status === "failed";
    return h("div.tl-row", { class: `tl-row${failed ? " failed" : ""}${c.retry_of !== null && c.retry_of !== undefined ? " retry" : ""}`, dataset: { seq: c.seq, status: c.status } },
      h("div.tl-label",
        h("b", `#${c.seq}`), " ", c.api, " · ", c.model,
        failed ? h("span.badge.s-failed", `failed (${c.side})`) : null,
        c.retry_of !== null && c.retry_of !== undefined ? h("span.badge.s-retry", `retry of #${c.retry_of}`) : null,
        h("div.small.muted",
          `${c.finish_reason || "–"} · ${fmtInt(c.prompt_tokens)} prompt + ${fmtInt(c.response_tokens)} response tokens · `,
          `TTFT ${first ? fmtMs(first - c.received_ms) : "–"} · total ${fmtMs(c.finished_ms - c.received_ms)}`,
          c.token_ids_missing ? " · token ids missing" : "",
          failed && c.error ? ` · ${c.error}` : ""),
      ),
      bar,
    );
  });
  mount(el,
    h("h2", `Timeline (${calls.length}${total && total > calls.length ? ` of ${total}` : ""} calls, ${fmtMs(span)})`),
    h("p.legend", h("span.key.tl-ttft"), " time to first token (queue included) ", h("span.key.tl-gen"), " generation ", h("span.key.tl-gap"), " tool / harness time between calls ", h("span.key.failed"), " failed call"),
    h("div.tl", h("div.tl-row.axis", h("div.tl-label", "harness"), axis), rows),
  );
}
