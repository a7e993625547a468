// Runs the inline script of a page `cupool report --html` wrote under node,
// against a minimal DOM and canvas written here (no browser, no npm package),
// then drives the plots as a user would (hover, drag to zoom, wheel, reset).
// Prints one JSON line: the markers the script set on <body> and on each
// canvas, the number of canvas calls, how long the script took to parse its
// data and draw the page (script_ms), and what the first tooltip said.
//   node tests/support/html-stub.js PAGE.html
// Exits non-zero if the script throws. It checks that the script runs and what
// it computes, not what a browser would show.
"use strict";
const fs = require("fs");
const vm = require("vm");

const html = fs.readFileSync(process.argv[2], "utf8");
const blob = /<script type="application\/json" id="cupool-data">([\s\S]*?)<\/script>/.exec(html);
if (!blob) { throw new Error("no data blob"); }
const scripts = [...html.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
if (scripts.length !== 1) { throw new Error(`expected one inline script, found ${scripts.length}`); }

let calls = 0;
const canvases = [];
function context() {
  // Any drawing call is counted, and none may get a number that is not finite.
  const state = { font: "", fillStyle: "", strokeStyle: "", lineWidth: 1 };
  return new Proxy(state, {
    get(target, key) {
      if (key in target) { return target[key]; }
      if (key === "measureText") { return (t) => ({ width: String(t).length * 6 }); }
      return (...args) => {
        calls++;
        for (const a of args) { if (typeof a === "number" && !Number.isFinite(a)) { throw new Error(`${String(key)}: ${args}`); } }
      };
    },
    set(target, key, v) { target[key] = v; return true; },
  });
}
function element(tag) {
  const e = {
    tagName: tag.toUpperCase(), children: [], attributes: {}, style: {}, className: "", listeners: {}, _text: "",
    width: 300, height: 150,
    appendChild(c) { this.children.push(c); return c; },
    setAttribute(k, v) { this.attributes[k] = String(v); },
    getAttribute(k) { return k in this.attributes ? this.attributes[k] : null; },
    addEventListener(k, f) { (this.listeners[k] = this.listeners[k] || []).push(f); },
    fire(k, ev) { for (const f of this.listeners[k] || []) { f(Object.assign({ preventDefault() {} }, ev)); } },
    getBoundingClientRect() { return { left: 0, top: 0, width: 1000, height: 300 }; },
    get textContent() { return this._text + this.children.map((c) => c.textContent).join(""); },
    set textContent(v) { this._text = String(v); this.children = []; },
  };
  if (tag === "canvas") {
    const ctx = context();
    e.getContext = () => ctx;
    canvases.push(e);
  }
  return e;
}
const body = element("body");
const app = element("div");
const data = element("script");
data._text = blob[1];
const document = {
  body,
  createElement: element,
  getElementById: (id) => (id === "app" ? app : id === "cupool-data" ? data : null),
};
const window = { devicePixelRatio: 2, addEventListener() {} };
const started = process.hrtime.bigint();
vm.runInNewContext(scripts[0], { document, window, Math, JSON, String, Number, Array, Object, Float64Array });
const scriptMs = Number(process.hrtime.bigint() - started) / 1e6;

// Drive the first plot: hover, drag to zoom, wheel, reset.
let tip = null;
if (canvases.length) {
  const c = canvases[0];
  c.fire("mousemove", { clientX: 500, clientY: 100 });
  c.fire("mousedown", { clientX: 300 });
  c.fire("mousemove", { clientX: 600 });
  c.fire("mouseup", { clientX: 600 });
  c.fire("wheel", { clientX: 400, deltaY: -1 });
  c.fire("wheel", { clientX: 400, deltaY: 1 });
  c.fire("dblclick", {});
  c.fire("mousemove", { clientX: 700, clientY: 12 });
  // The tooltip is the element after the canvas in its box.
  const find = (e) => {
    if (e.className === "tip") { return e; }
    for (const k of e.children) { const f = find(k); if (f) { return f; } }
    return null;
  };
  tip = find(app);
}
console.log(JSON.stringify({
  body: body.attributes,
  canvases: canvases.map((c) => c.attributes),
  calls,
  script_ms: Math.round(scriptMs),
  tip: tip ? tip.textContent : null,
  text: app.textContent.length,
}));
