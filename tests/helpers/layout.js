// The layout check of the sample apps' browser tests (apps_helpers.layout_problems): run in the
// page, it returns what a person would see as broken — the page scrolling sideways, an element
// outside the window or clipped, two elements on top of each other, a text area too narrow.
() => {
  const W = window.innerWidth, problems = [];
  const root = document.documentElement;
  if (root.scrollWidth > W + 1) problems.push(`the page scrolls sideways (${root.scrollWidth}px in ${W}px)`);
  const name = (el) => el.id ? `#${el.id}` : `${el.tagName.toLowerCase()}.${[...el.classList].join(".")}`
    + ` "${(el.textContent || el.value || "").trim().slice(0, 30)}"`;
  // the part of an element its scrolling ancestors let through (null: none of it)
  const seen = (el) => {
    if (el.closest("[hidden]") || !el.getClientRects().length) return null;
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || style.display === "none") return null;
    let r = el.getBoundingClientRect(), box = { l: r.left, t: r.top, r: r.right, b: r.bottom };
    for (let a = el.parentElement; a; a = a.parentElement) {
      const o = getComputedStyle(a);
      if (a.tagName === "DETAILS" && !a.open && el.tagName !== "SUMMARY") return null;
      if (o.overflowX !== "visible" || o.overflowY !== "visible") {
        const c = a.getBoundingClientRect();
        box = { l: Math.max(box.l, c.left), t: Math.max(box.t, c.top), r: Math.min(box.r, c.right),
                b: Math.min(box.b, c.bottom) };
      }
    }
    return box.r - box.l > 1 && box.b - box.t > 1 ? box : null;
  };
  const els = [...document.querySelectorAll(
    "button, input, select, textarea, label, summary, h1, h2, .badge, .brand, .count, .banner, "
    + "#status-line, .prepared, #suggestion-state, .legend .tok, .frames .type, .frames .bytes, "
    + ".messages .who, .messages .date, .messages .subj, .note-list .t, .guard")]
    .map((el) => [el, seen(el)]).filter(([, box]) => box);
  for (const [el, box] of els) {
    if (box.l < -1 || box.r > W + 1) problems.push(`${name(el)} is outside the window (${Math.round(box.l)} to ${Math.round(box.r)} of ${W}px)`);
    const text = !["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName);
    if (text && el.scrollWidth > el.clientWidth + 1) problems.push(`${name(el)} is clipped (${el.scrollWidth}px of content in ${el.clientWidth}px)`);
  }
  for (let i = 0; i < els.length; i++) {
    for (let j = i + 1; j < els.length; j++) {
      const [a, p] = els[i], [b, q] = els[j];
      if (a.contains(b) || b.contains(a)) continue;
      const w = Math.min(p.r, q.r) - Math.max(p.l, q.l), h = Math.min(p.b, q.b) - Math.max(p.t, q.t);
      if (w > 2 && h > 2) problems.push(`${name(a)} overlaps ${name(b)}`);
    }
  }
  // the places a person reads and writes are wide enough to do so
  for (const id of ["body", "c-body", "suggestion-text", "frames", "m-body"]) {
    const el = document.getElementById(id);
    const box = el && seen(el);
    if (box && box.r - box.l < Math.min(300, W - 64)) problems.push(`#${id} is ${Math.round(box.r - box.l)}px wide in a ${W}px window`);
  }
  return problems;
}
