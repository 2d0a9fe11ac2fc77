// A virtualized grid of tokens: only the rows in view (and a few around)
// exist in the DOM, so a 200,000-token trace scrolls like a short one.
// Each token is a cell showing its text (from the server's tokenizer,
// `pieces`: one per distinct id, decoded there; nothing is decoded or
// guessed here) or, without one, its id. Cells are laid out like the text
// they read as: each as wide as its text (at most MAX_CH characters, the
// rest in the cell's tooltip and the detail panel), a row ending where the
// row is full or a token holds a line break. The layout is computed from
// the text alone (a monospace font: one width per character), so the
// position of any token is known without the DOM. Whitespace is shown as
// marks (CSS draws them; the cell's text stays the token's exact text);
// bytes that are no character on their own (part of a multi-byte UTF-8
// character) as hex, special tokens outlined. Cells are coloured by kind
// (prompt, glue with loss 0, trained with loss 1) or, in the logprob mode,
// trained tokens by their sampling probability (a heat scale in ten
// steps). Boundaries (a call's glue, its generated tokens, a template
// splice) are marked on the cell where they start.

export const KIND_PROMPT = 0;
export const KIND_GLUE = 1;
export const KIND_TRAINED = 2;

const ROW_H = 22; // px, as .tokrow in style.css
const OVERSCAN = 8;
const MAX_CH = 24; // the widest cell, in characters
const PAD = 6; // px of a cell beyond its text (padding and margin, style.css)
const MARKS = { "\n": "↵", "\t": "⇥", "\r": "␍" };

/** What a piece shows: [{text} | {ws, ch} | {hex, bytes}], its width in characters, whether it ends a line. */
export function pieceView(piece) {
  const runs = [];
  let width = 0;
  let nl = false;
  const addText = (s) => {
    let plain = "";
    const flush = () => {
      if (plain) runs.push({ text: plain });
      plain = "";
    };
    for (const ch of s) {
      const code = ch.codePointAt(0);
      if (MARKS[ch] !== undefined) {
        flush();
        runs.push({ ws: MARKS[ch], ch });
        if (ch === "\n") nl = true;
      } else if (code < 0x20 || code === 0x7f) {
        flush();
        runs.push({ ws: `\\x${code.toString(16).padStart(2, "0")}`, ch });
        width += 3;
      } else {
        plain += ch;
      }
      width += 1;
    }
    flush();
  };
  if (piece.parts) {
    for (const p of piece.parts) {
      if (p.bytes) {
        const hex = p.bytes.map((b) => b.toString(16).toUpperCase().padStart(2, "0")).join(" ");
        runs.push({ hex, bytes: p.bytes });
        width += hex.length + 2;
      } else addText(p.text);
    }
  } else addText(piece.text);
  return { runs, width: Math.max(1, width), nl };
}

/**
 * seq: { ids, kind (Uint8Array of KIND_*), lp (Float32Array, NaN where
 * none) | null, marks: Map(index -> [{cls, title}]), length,
 * pieces: {id: piece} | null (the server's token text) }
 * opts: { mode: "mask" | "logprob", text: bool (show text when pieces), onPick(index) }
 */
export function tokenGrid(container, seq, opts = {}) {
  let mode = opts.mode || "mask";
  let showText = opts.text !== false && !!seq.pieces;
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

  // One view per distinct id, made when first needed.
  const views = new Map();
  const viewOf = (id) => {
    let v = views.get(id);
    if (v === undefined) {
      const p = seq.pieces[id];
      v = p && !p.unknown ? { ...pieceView(p), piece: p } : { runs: null, width: String(id).length + 2, nl: false, piece: null };
      views.set(id, v);
    }
    return v;
  };

  // rowStart[r]: the first token of row r; rowStart[rows] = length.
  let rowStart = new Int32Array([0, seq.length]);
  let rows = 1;
  let drawn = [-1, -1];
  let charW = 7;
  let idW = 52;
  const measure = () => {
    const probe = document.createElement("span");
    probe.className = "tok";
    probe.style.width = "auto";
    probe.textContent = "0".repeat(20);
    const row = document.createElement("div");
    row.className = "tokrow";
    const label = document.createElement("span");
    label.className = "tokidx";
    row.append(label, probe);
    win.append(row);
    charW = (probe.getBoundingClientRect().width || 140) / 20;
    const lab = label.getBoundingClientRect().width || 64;
    row.remove();
    idW = 52;
    const avail = Math.max(200, scroll.clientWidth - lab - 24);
    layout(avail);
    space.style.height = `${rows * ROW_H}px`;
    drawn = [-1, -1];
  };
  const cellW = (i) => {
    if (!showText) return idW;
    return Math.ceil(Math.min(MAX_CH, viewOf(seq.ids[i]).width) * charW) + PAD;
  };
  const layout = (avail) => {
    const starts = [0];
    let x = 0;
    for (let i = 0; i < seq.length; i++) {
      const w = cellW(i) + 1;
      if (x > 0 && x + w > avail) {
        starts.push(i);
        x = 0;
      }
      x += w;
      if (showText && viewOf(seq.ids[i]).nl && i + 1 < seq.length) {
        starts.push(i + 1);
        x = 0;
      }
    }
    starts.push(seq.length);
    rowStart = Int32Array.from(starts);
    rows = Math.max(1, rowStart.length - 1);
  };
  const rowOf = (i) => {
    let lo = 0;
    let hi = rows - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (rowStart[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    return lo;
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

  const fill = (t, i) => {
    const id = seq.ids[i];
    if (!showText) {
      t.textContent = String(id);
      return;
    }
    const v = viewOf(id);
    t.style.width = `${cellW(i)}px`;
    t.classList.add("tx");
    if (!v.runs) {
      t.classList.add("unk");
      t.textContent = String(id);
      t.title = `id ${id}: not in the tokenizer's vocabulary`;
      return;
    }
    if (v.piece.special) t.classList.add("sp");
    if (v.piece.lossy) t.classList.add("lossy");
    for (const r of v.runs) {
      if (r.text !== undefined) t.append(r.text);
      else {
        const s = document.createElement("span");
        if (r.ws !== undefined) {
          s.className = "ws";
          s.dataset.mark = r.ws;
          s.textContent = r.ch;
        } else {
          s.className = "bytes";
          s.dataset.hex = r.hex;
          s.dataset.bytes = r.bytes.join(",");
        }
        t.append(s);
      }
    }
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
      label.textContent = String(rowStart[r]);
      row.append(label);
      for (let i = rowStart[r]; i < rowStart[r + 1]; i++) {
        const t = document.createElement("span");
        t.className = cellClass(i);
        t.dataset.i = String(i);
        fill(t, i);
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
  const relayout = () => {
    // Keep the token at the top in view when the layout changes.
    const top = rowStart[Math.min(rows - 1, Math.floor(scroll.scrollTop / ROW_H))];
    measure();
    scroll.scrollTop = rowOf(top) * ROW_H;
    draw(true);
  };
  const resize = new ResizeObserver(relayout);
  resize.observe(scroll);
  measure();
  draw(true);

  return {
    element: scroll,
    setMode(m) {
      mode = m;
      draw(true);
    },
    /** Text (when the server sent pieces) or ids. */
    setText(on) {
      showText = on && !!seq.pieces;
      relayout();
    },
    /** Scrolls so that token `i` is in view and selects it. */
    reveal(i) {
      selected = i;
      scroll.scrollTop = Math.max(0, rowOf(i) * ROW_H - scroll.clientHeight / 3);
      draw(true);
    },
    /** The piece of token `i` (null: no text for it). */
    pieceAt(i) {
      return seq.pieces ? seq.pieces[seq.ids[i]] || null : null;
    },
    destroy() {
      resize.disconnect();
    },
  };
}
