// A virtualized grid of tokens: only the rows in view (and a few around)
// exist in the DOM, so a 200,000-token trace scrolls like a short one.
// Each token is a fixed-width cell showing its id (the export has token
// ids, not text: nothing is detokenized here), coloured by its kind
// (prompt, glue with loss 0, trained with loss 1) or, in the logprob mode,
// trained tokens by their sampling probability (a heat scale in ten
// steps). Boundaries (a call's glue, its generated tokens, a template
// splice) are marked on the cell where they start.

export const KIND_PROMPT = 0;
export const KIND_GLUE = 1;
export const KIND_TRAINED = 2;

const ROW_H = 22; // px, as .tokrow in style.css
const OVERSCAN = 8;

/**
 * seq: { ids, kind (Uint8Array of KIND_*), lp (Float32Array, NaN where
 * none) | null, marks: Map(index -> [{cls, title}]), length }
 * opts: { mode: "mask" | "logprob", onPick(index) }
 */
export function tokenGrid(container, seq, opts = {}) {
  let mode = opts.mode || "mask";
  let selected = -1;
  const scroll = document.createElement("div");
  scroll.className = "tokscroll";
  scroll.tabIndex = 0;
  const space = document.createElement("div");
  space.className = "tokspace";
  const win = document.createElement("div");
  win.className = "tokwin";
  space.append(win);
  scroll.append(space);
  container.replaceChildren(scroll);

  let cols = 1;
  let rows = 1;
  let drawn = [-1, -1];
  const measure = () => {
    const probe = document.createElement("span");
    probe.className = "tok";
    probe.textContent = "0";
    const row = document.createElement("div");
    row.className = "tokrow";
    const label = document.createElement("span");
    label.className = "tokidx";
    row.append(label, probe);
    win.append(row);
    const cell = probe.getBoundingClientRect().width || 52;
    const lab = label.getBoundingClientRect().width || 64;
    row.remove();
    const avail = scroll.clientWidth - lab - 24;
    cols = Math.max(4, Math.floor(avail / cell));
    rows = Math.ceil(seq.length / cols);
    space.style.height = `${rows * ROW_H}px`;
    drawn = [-1, -1];
  };

  const cellClass = (i) => {
    const k = seq.kind[i];
    let c = k === KIND_PROMPT ? "tok kp" : k === KIND_GLUE ? "tok kg" : "tok kt";
    if (mode === "logprob" && k === KIND_TRAINED && seq.lp) {
      const lp = seq.lp[i];
      if (!Number.isNaN(lp)) c += ` h${Math.min(9, Math.floor(Math.exp(lp) * 10))}`;
    }
    if (i === selected) c += " sel";
    return c;
  };

  const draw = (force) => {
    const first = Math.max(0, Math.floor(scroll.scrollTop / ROW_H) - OVERSCAN);
    const last = Math.min(rows, Math.ceil((scroll.scrollTop + scroll.clientHeight) / ROW_H) + OVERSCAN);
    if (!force && first === drawn[0] && last === drawn[1]) return;
    drawn = [first, last];
    win.style.top = `${first * ROW_H}px`;
    const frag = document.createDocumentFragment();
    for (let r = first; r < last; r++) {
      const row = document.createElement("div");
      row.className = "tokrow";
      const label = document.createElement("span");
      label.className = "tokidx";
      label.textContent = String(r * cols);
      row.append(label);
      const end = Math.min(seq.length, (r + 1) * cols);
      for (let i = r * cols; i < end; i++) {
        const t = document.createElement("span");
        t.className = cellClass(i);
        t.dataset.i = String(i);
        t.textContent = String(seq.ids[i]);
        const marks = seq.marks.get(i);
        if (marks) {
          for (const m of marks) t.classList.add(m.cls);
          t.title = marks.map((m) => m.title).join("\n");
        }
        row.append(t);
      }
      frag.append(row);
    }
    win.replaceChildren(frag);
  };

  let pending = false;
  scroll.addEventListener("scroll", () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      draw(false);
    });
  });
  scroll.addEventListener("click", (e) => {
    const t = e.target.closest(".tok");
    if (!t || t.dataset.i === undefined) return;
    selected = Number(t.dataset.i);
    draw(true);
    if (opts.onPick) opts.onPick(selected);
  });
  const resize = new ResizeObserver(() => {
    // Keep the token at the top in view when the width (columns) changes.
    const top = Math.floor(scroll.scrollTop / ROW_H) * cols;
    measure();
    scroll.scrollTop = Math.floor(top / cols) * ROW_H;
    draw(true);
  });
  resize.observe(scroll);
  measure();
  draw(true);

  return {
    element: scroll,
    setMode(m) {
      mode = m;
      draw(true);
    },
    /** Scrolls so that token `i` is in view and selects it. */
    reveal(i) {
      selected = i;
      scroll.scrollTop = Math.max(0, Math.floor(i / cols) * ROW_H - scroll.clientHeight / 3);
      draw(true);
    },
    destroy() {
      resize.disconnect();
    },
  };
}
