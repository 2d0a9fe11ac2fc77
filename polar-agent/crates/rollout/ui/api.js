// The API from the browser: the bearer token (asked for once, kept in this
// tab's sessionStorage, sent in the Authorization header only, never in a
// URL), JSON requests, and the server's event stream read with fetch (an
// EventSource cannot send a header), reconnecting with Last-Event-ID.

const KEY = "polar.rollout.token";

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(t) {
  sessionStorage.setItem(KEY, t);
}

export function forgetToken() {
  sessionStorage.removeItem(KEY);
}

/** An API error with the server's code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

/** fetch + JSON with the token; throws ApiError. */
export async function api(path, opts = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${token()}` };
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method: opts.method || "GET",
    headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
    cache: "no-store",
    credentials: "omit",
    signal: opts.signal,
  });
  const text = await resp.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!resp.ok) {
    const e = body && body.error;
    throw new ApiError(resp.status, e ? e.code : "http", e ? e.message : text.slice(0, 200));
  }
  return body;
}

/**
 * Follows GET /v1/events (optionally one task's): calls onEvent(event) for
 * each frame and onState("live" | "reconnecting" | "lagged") as the stream
 * changes. Returns a function that stops it.
 */
export function followEvents({ taskId, onEvent, onState }) {
  let stopped = false;
  let last = null;
  let ctrl = null;
  let wait = 500;
  const run = async () => {
    while (!stopped) {
      ctrl = new AbortController();
      try {
        const q = taskId ? `?task_id=${encodeURIComponent(taskId)}` : "";
        const headers = { Accept: "text/event-stream", Authorization: `Bearer ${token()}` };
        if (last !== null) headers["Last-Event-ID"] = String(last);
        const resp = await fetch(`/v1/events${q}`, { headers, signal: ctrl.signal, cache: "no-store", credentials: "omit" });
        if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
        onState && onState("live");
        wait = 500;
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let at;
          while ((at = buf.search(/\r?\n\r?\n/)) >= 0) {
            const frame = buf.slice(0, at);
            buf = buf.slice(at).replace(/^\r?\n\r?\n/, "");
            const ev = parseFrame(frame);
            if (!ev) continue;
            if (ev.id !== null) last = ev.id;
            if (ev.event === "lagged") {
              onState && onState("lagged");
              onEvent({ type: "lagged" });
              continue;
            }
            try {
              onEvent(JSON.parse(ev.data));
            } catch {
              // A frame that is not JSON is not ours: skipped.
            }
          }
        }
      } catch (e) {
        if (stopped) return;
      }
      if (stopped) return;
      onState && onState("reconnecting");
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(wait * 2, 10000);
    }
  };
  run();
  return () => {
    stopped = true;
    if (ctrl) ctrl.abort();
  };
}

function parseFrame(frame) {
  let id = null;
  let event = "message";
  const data = [];
  for (const line of frame.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "id") id = Number(value);
    else if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length && event !== "lagged") return null;
  return { id, event, data: data.join("\n") };
}
