// arpo view: the task list, the lazily drawn rollout trees and the trajectory reader. No network, no libraries.
"use strict";
(function () {
  const PAGE = 40; // cards added per page; more are added as the end of the list scrolls into view
  const SVGNS = "http://www.w3.org/2000/svg";
  const TAG = /<(\/?)(think|python|search|browse|result|answer)>/g;
  const index = JSON.parse(document.getElementById("index").textContent);
  const rows = index.rows;
  const emax = index.emax || 0.3;
  const list = document.getElementById("list");
  const sentinel = document.getElementById("more");
  const $ = (id) => document.getElementById(id);
  let filtered = rows;
  let shown = 0;

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  const fmt = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
  const signed = (x) => (x !== null && x >= 0 ? "+" : "") + fmt(x);
  const mean = (xs) => {
    const ys = xs.filter((x) => x !== null);  // a NaN reward is null in the page's JSON
    return ys.length ? ys.reduce((a, b) => a + b, 0) / ys.length : 0;
  };
  const heat = (e) => `rgba(214,39,40,${(0.85 * Math.min(1, Math.max(0, e / emax))).toFixed(3)})`;
  const rewardClass = (r) => (r > 0 ? "good" : r < 0 ? "poor" : "");

  // Parsed only when a card is drawn: a report of thousands of trees parses a few at a time.
  const parsed = new Map();
  function tree(i) {
    if (!parsed.has(i)) parsed.set(i, JSON.parse(document.getElementById("tree-" + i).textContent));
    return parsed.get(i);
  }

  // Filters ---------------------------------------------------------------------------------------------------------
  function bounds() {
    const lo = parseFloat($("f-min").value), hi = parseFloat($("f-max").value);
    return [Number.isNaN(lo) ? -Infinity : lo, Number.isNaN(hi) ? Infinity : hi];
  }
  const inRange = (r) => { const [lo, hi] = bounds(); return r >= lo && r <= hi; };

  function fillSelect(select, values) {
    for (const v of values) select.append(el("option", { value: String(v), text: String(v) }));
  }
  fillSelect($("f-source"), [...new Set(rows.map((r) => r.source).filter(Boolean))].sort());
  fillSelect($("f-step"), [...new Set(rows.map((r) => r.step).filter((s) => s !== null && s !== undefined))]
    .sort((a, b) => a - b));
  $("emax").textContent = `0 … ${fmt(emax)}+`;

  function apply() {
    const text = $("f-text").value.trim().toLowerCase();
    const source = $("f-source").value, step = $("f-step").value, sort = $("f-sort").value;
    filtered = rows.filter((r) =>
      (!text || (r.id + " " + r.source + " " + r.q).toLowerCase().includes(text)) &&
      (!source || r.source === source) && (!step || String(r.step) === step) && r.rewards.some(inRange));
    if (sort === "reward-asc") filtered = [...filtered].sort((a, b) => mean(a.rewards) - mean(b.rewards));
    if (sort === "reward-desc") filtered = [...filtered].sort((a, b) => mean(b.rewards) - mean(a.rewards));
    if (sort === "branches") filtered = [...filtered].sort((a, b) => b.branches - a.branches);
    list.replaceChildren();
    shown = 0;
    more();
  }
  function more() {
    const next = filtered.slice(shown, shown + PAGE);
    for (const r of next) list.append(card(r));
    shown += next.length;
    const trajs = filtered.reduce((n, r) => n + r.rewards.length, 0);
    $("count").textContent = `showing ${shown} of ${filtered.length} tasks (${trajs} trajectories; ` +
      `${rows.length} tasks in the file)`;
  }
  for (const id of ["f-text", "f-source", "f-step", "f-min", "f-max", "f-sort"]) $(id).addEventListener("input", apply);

  // Cards: drawn when they scroll into view --------------------------------------------------------------------------
  const drawer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      drawer.unobserve(entry.target);
      draw(entry.target);
    }
  }, { rootMargin: "400px" });
  new IntersectionObserver((entries) => {
    if (entries.some((e) => e.isIntersecting) && shown < filtered.length) more();
  }, { rootMargin: "600px" }).observe(sentinel);

  function card(r) {
    const m = mean(r.rewards);
    const head = el("div", { class: "card-head" },
      el("span", { class: "id", text: r.id }),
      r.source ? el("span", { class: "chip", text: r.source }) : null,
      r.step !== null && r.step !== undefined ? el("span", { class: "chip", text: "step " + r.step }) : null,
      el("span", { class: "q", text: r.q, title: r.q }),
      el("span", { class: "chip " + rewardClass(m), text: `reward ${signed(m)}` }),
      el("span", { class: "chip", text: `${r.correct}/${r.rewards.length} correct` }),
      el("span", { class: "chip", text: `${r.branches} branches` }),
      el("span", { class: "chip", text: `${r.tools} tool calls` }));
    const c = el("div", { class: "card", "data-i": String(r.i) }, head,
      el("div", { class: "placeholder", text: "…" }));
    drawer.observe(c);
    return c;
  }

  function order(t) {
    // Depth first, children in the order they branched, so a branch sits under its parent.
    const kids = new Map();
    for (const n of t.nodes) {
      const p = n.parent === null || n.parent === undefined ? null : n.parent;
      if (!kids.has(p)) kids.set(p, []);
      kids.get(p).push(n);
    }
    for (const v of kids.values()) v.sort((a, b) => a.start - b.start || a.id - b.id);
    const out = [];
    const walk = (n, depth) => { out.push([n, depth]); for (const k of kids.get(n.id) || []) walk(k, depth + 1); };
    for (const root of kids.get(null) || []) walk(root, 0);
    const seen = new Set(out.map(([n]) => n.id));
    for (const n of t.nodes) if (!seen.has(n.id)) out.push([n, 0]); // a parent missing from the file
    return out;
  }

  function draw(c) {
    const t = tree(Number(c.dataset.i));
    const byNode = new Map(t.trajs.map((x) => [x.node, x]));
    const rowsOrdered = order(t);
    const H = 24, L = 120, W = 640, R = 150, top = 16;
    const maxLen = Math.max(1, ...t.trajs.map((x) => x.len));
    const X = (tok) => L + (W * tok) / maxLen;
    const rowY = new Map(rowsOrdered.map(([n], k) => [n.id, top + k * H + H / 2]));
    const s = svg("svg", { class: "tree", width: L + W + R, height: top + rowsOrdered.length * H + 4,
      viewBox: `0 0 ${L + W + R} ${top + rowsOrdered.length * H + 4}` });
    const axis = svg("text", { x: L, y: 10, class: "lbl" });
    axis.textContent = `0 … ${maxLen} completion tokens`;
    s.append(axis);
    const details = el("div", { class: "details" });
    for (const [n, depth] of rowsOrdered) {
      const traj = byNode.get(n.id);
      const y = rowY.get(n.id);
      const g = svg("g", { class: "node", "data-node": String(n.id) });
      if (traj && !inRange(traj.reward)) g.classList.add("out");
      g.append(svg("rect", { class: "hit", x: 0, y: y - H / 2, width: L + W + R, height: H, fill: "transparent" }));
      const label = svg("text", { x: 4 + 8 * Math.min(depth, 6), y: y + 4, class: "lbl" });
      label.textContent = `#${n.id} ${n.kind}`;
      g.append(label);
      const end = traj ? traj.len : n.start;
      if (n.start > 0) g.append(svg("line", { class: "shared", x1: X(0), x2: X(n.start), y1: y, y2: y }));
      g.append(svg("line", { class: "own", x1: X(n.start), x2: X(Math.max(end, n.start)), y1: y, y2: y }));
      if (traj) {
        for (const seg of traj.segs) {
          if (seg.k !== "t" || seg.b <= n.start || seg.b === seg.a) continue;
          const r = svg("rect", { class: "toolseg", x: X(seg.a), y: y - 5, height: 10,
            width: Math.max(2, X(seg.b) - X(seg.a)) });
          r.append(svgTitle(`tool result, tokens ${seg.a}–${seg.b}`));
          g.append(r);
        }
        for (const d of traj.decisions) {
          const tick = svg("line", { class: "tick" + (d.branched ? " branched" : ""), x1: X(d.token),
            x2: X(d.token), y1: y - 8, y2: y + 8 });
          tick.append(svgTitle(`tool step ${d.step}: ΔH ${signed(d.delta_h)}, P ${fmt(d.p)}` +
            (d.branched ? " → branched" : " → no branch")));
          g.append(tick);
        }
        const badge = svg("text", { x: L + W + 10, y: y + 4, class: "reward " + rewardClass(traj.reward) });
        badge.textContent = `${signed(traj.reward)}  ${traj.tools} tools${traj.truncated ? " (cut)" : ""}`;
        badge.append(svgTitle(Object.entries(traj.parts).map(([k, v]) => `${k}: ${v}`).join("\n")));
        g.append(badge);
      }
      if (n.parent !== null && n.parent !== undefined && rowY.has(n.parent)) {
        const py = rowY.get(n.parent);
        g.append(svg("path", { class: "link", d: `M${X(n.start)},${py} L${X(n.start)},${y}` }));
        g.append(svg("circle", { class: "bp", cx: X(n.start), cy: py, r: 4 }));
        const bl = svg("text", { x: X(n.start) + 6, y: py - 5, class: "bpl" });
        bl.textContent = `ΔH ${signed(n.delta_h)} · P ${fmt(n.p)}`;
        g.append(bl);
      }
      g.addEventListener("click", () => toggle(t, n, traj, g, details));
      s.append(g);
    }
    c.querySelector(".placeholder").replaceWith(s, details);
  }
  function svgTitle(text) { const e = svg("title"); e.textContent = text; return e; }

  // The trajectory reader ------------------------------------------------------------------------------------------
  function toggle(t, n, traj, g, details) {
    const open = details.querySelector(`.traj[data-node="${n.id}"]`);
    if (open) { open.remove(); g.classList.remove("open"); return; }
    g.classList.add("open");
    details.append(reader(t, n, traj));
  }

  function reader(t, n, traj) {
    const box = el("div", { class: "traj", "data-node": String(n.id) });
    if (!traj) { box.append(el("div", { text: `node #${n.id}: its trajectory is not in the file` })); return box; }
    box.append(el("div", { class: "traj-head" },
      `#${n.id} ${n.kind}` + (n.parent !== null && n.parent !== undefined ? ` (from #${n.parent} at token ${n.start})` : ""),
      " · reward ", el("span", { class: "reward " + rewardClass(traj.reward), text: signed(traj.reward) }),
      ` · ${traj.tools} tool calls · ${traj.len} tokens` + (traj.truncated ? " · truncated" : "")));
    const parts = el("table", { class: "parts" });
    const names = Object.keys(traj.parts);
    parts.append(el("tr", {}, ...names.map((k) => el("td", { text: k }))));
    parts.append(el("tr", {}, ...names.map((k) => el("td", { text: String(traj.parts[k]) }))));
    box.append(parts);
    if (traj.decisions.length) {
      box.append(el("div", { class: "decisions", text: "branching decisions: " + traj.decisions.map((d) =>
        `step ${d.step} @${d.token}: ΔH ${signed(d.delta_h)}, P ${fmt(d.p)} ${d.branched ? "branched" : "kept"}`)
        .join(" · ") }));
    }
    if (t.task.question) box.append(el("div", { class: "seg tool" }, el("span", { class: "label", text: "task" }),
      String(t.task.question) + (t.task.answer !== undefined && t.task.answer !== null ?
        "\n\ngold: " + JSON.stringify(t.task.answer) : "")));
    let sharedNote = false;
    for (const seg of traj.segs) {
      const shared = n.start > 0 && seg.b <= n.start && seg.b > seg.a;
      const div = el("div", { class: "seg " + (seg.k === "m" ? "model" : "tool") + (shared ? " sharedseg" : "") });
      const what = seg.k === "m" ? "model" : "tool output (masked from the loss)";
      div.append(el("span", { class: "label", text: what + (shared && !sharedNote ? ` · shared with #${n.parent}` : "") +
        (seg.k === "m" && seg.ent && seg.ent.length ? ` · mean entropy of first ${seg.ent.length} tokens ` +
          fmt(mean(seg.ent), 3) : "") }));
      if (shared) sharedNote = true;
      if (seg.k === "m") modelText(div, seg); else div.append(seg.text);
      box.append(div);
    }
    return box;
  }

  function modelText(div, seg) {
    let rest = seg.text;
    let state = null;
    if (seg.pieces && seg.pieces.length) {
      const joined = seg.pieces.join("");
      seg.pieces.forEach((p, j) => {
        const span = el("span", { class: "tok", text: p, title: `entropy ${fmt(seg.ent[j], 3)}` });
        span.style.background = heat(seg.ent[j]);
        div.append(span);
      });
      rest = rest.startsWith(joined) ? rest.slice(joined.length) : "";
      state = openTag(joined);
    } else if (seg.ent && seg.ent.length) {
      // No token text in the file (an older rollout): the measured entropies as a strip.
      const strip = el("span", { class: "strip", title: "entropy of the first tokens" });
      for (const e of seg.ent) { const i = el("i", { title: fmt(e, 3) }); i.style.background = heat(e); strip.append(i); }
      div.append(strip);
    }
    highlight(div, rest, state);
  }
  function openTag(text) {
    let state = null;
    for (const m of text.matchAll(TAG)) state = m[1] ? null : m[2];
    return state;
  }
  function highlight(div, text, state) {
    let last = 0;
    for (const m of text.matchAll(TAG)) {
      if (m.index > last) div.append(el("span", { class: state ? "in-" + state : "", text: text.slice(last, m.index) }));
      div.append(el("span", { class: "tag", text: m[0] }));
      state = m[1] ? null : m[2];
      last = m.index + m[0].length;
    }
    if (last < text.length) div.append(el("span", { class: state ? "in-" + state : "", text: text.slice(last) }));
  }

  window.arpoView = { rows, tree, apply };
  apply();
})();
