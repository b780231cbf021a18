// netq monitor: the browser side of netq.widgets.MonitorWidget (an anywidget ES module).
//
// Python computes every text and number people read (netq.display: units, tick labels, names,
// the badge, the order of the rows); this module only lays them out and draws the charts as
// SVG. Synced traits: `view` (title, table rows, waits, notes, live or snapshot), `frame` (the
// charts' axes and plotted peers) and `point` (the newest sample of every plotted peer). The
// history of points is kept once per model (not per view): appended from each `point`,
// bounded to `frame.history` points, and filled in once by asking the kernel for the whole
// window (a custom message {type: "history"}).
// No imports, no network: it runs wherever anywidget does (JupyterLab, Notebook 7, Voila,
// VS Code, Colab, marimo).

const SVG = "http://www.w3.org/2000/svg";
// The chart geometry in pixels: the same numbers as netq.display.charts (CHART_HEIGHT,
// CHART_LEFT, CHART_RIGHT, CHART_TOP, CHART_BOTTOM), so the static form's charts look the same.
const HEIGHT = 150, LEFT = 66, RIGHT = 10, TOP = 10, BOTTOM = 20;
const MIN_CHART_WIDTH = 190, GAP = 8; // three charts side by side from 602 px

const stores = new WeakMap();

function element(tag, attributes = {}, text) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgElement(tag, attributes = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

// ------------------------------------------------------------------------ the point history

function historyLength(model) {
  const frame = model.get("frame") || {};
  return frame.history || 600;
}

function appendPoint(store, point, history) {
  if (!point || typeof point.t !== "number") return false;
  const last = store.t.length ? store.t[store.t.length - 1] : -Infinity;
  if (point.t <= last) return false; // already held (the history answer had it)
  const values = point.values || {};
  const length = store.t.length;
  store.t.push(point.t);
  const series = new Map();
  for (const [key, sample] of Object.entries(values)) {
    const past = store.series.get(key) || new Array(length).fill(null);
    past.push(sample);
    series.set(key, past);
  }
  store.series = series; // peers no longer plotted drop out here
  const excess = store.t.length - history;
  if (excess > 0) {
    store.t.splice(0, excess);
    for (const samples of store.series.values()) samples.splice(0, excess);
  }
  return true;
}

function notify(store) {
  for (const listener of store.listeners) listener();
}

function storeOf(model) {
  let store = stores.get(model);
  if (store) return store;
  store = { t: [], series: new Map(), listeners: new Set(), cleanup: null };
  stores.set(model, store);
  const onPoint = () => {
    if (appendPoint(store, model.get("point"), historyLength(model))) notify(store);
  };
  const onMessage = (message) => {
    if (!message || message.type !== "history") return;
    store.t = (message.t || []).slice();
    store.series = new Map(Object.entries(message.series || {}));
    appendPoint(store, model.get("point"), historyLength(model));
    notify(store);
  };
  model.on("change:point", onPoint);
  model.on("msg:custom", onMessage);
  store.cleanup = () => {
    model.off("change:point", onPoint);
    model.off("msg:custom", onMessage);
    stores.delete(model);
  };
  appendPoint(store, model.get("point"), historyLength(model));
  model.send({ type: "history" }); // the points sampled before this page had the model
  return store;
}

// ------------------------------------------------------------------------------- the charts

function chartWidth(width) {
  if (width >= 3 * MIN_CHART_WIDTH + 2 * GAP) return Math.floor((width - 2 * GAP) / 3);
  return Math.max(MIN_CHART_WIDTH, Math.floor(width));
}

function drawChart(chart, frame, store, hidden, width) {
  const innerW = width - LEFT - RIGHT, innerH = HEIGHT - TOP - BOTTOM;
  const start = frame.x.start, end = frame.x.end;
  const span = end - start || 1;
  const top = chart.top || 1;
  const x = (t) => LEFT + ((t - start) / span) * innerW;
  const y = (v) => TOP + innerH - Math.min(Math.max(v / top, 0), 1) * innerH;
  const svg = svgElement("svg", {
    class: "netq-chart", "data-metric": chart.metric, width, height: HEIGHT,
    viewBox: `0 0 ${width} ${HEIGHT}`,
  });
  for (const [value, label] of chart.ticks) {
    const at = y(value);
    svg.appendChild(svgElement("line", {
      class: "netq-grid", x1: LEFT, x2: width - RIGHT, y1: at.toFixed(1), y2: at.toFixed(1),
    }));
    svg.appendChild(svgElement("text", {
      class: "netq-tick", x: LEFT - 5, y: (at + 3.5).toFixed(1), "text-anchor": "end",
    }, label));
  }
  for (const [value, label] of frame.x.ticks) {
    svg.appendChild(svgElement("text", {
      class: "netq-tick", x: x(value).toFixed(1), y: HEIGHT - 5, "text-anchor": "middle",
    }, label));
  }
  for (const entry of frame.plotted) {
    if (hidden.has(entry.key)) continue;
    const samples = store.series.get(entry.key);
    if (!samples) continue;
    for (const [index, dash] of chart.lines) {
      const path = [];
      let pen = "M";
      for (let i = 0; i < store.t.length; i++) {
        const t = store.t[i], sample = samples[i];
        if (t < start || t > end || !sample || sample[index] === null) {
          pen = "M";
          continue;
        }
        path.push(`${pen}${x(t).toFixed(1)},${y(sample[index]).toFixed(1)}`);
        pen = "L";
      }
      if (!path.length) continue;
      const line = svgElement("path", {
        class: "netq-series", "data-peer": entry.peer, "data-line": index, fill: "none",
        stroke: entry.colour, "stroke-width": entry.width, d: path.join(" "),
      });
      if (dash) line.setAttribute("stroke-dasharray", dash);
      line.appendChild(svgElement("title", {}, entry.label));
      svg.appendChild(line);
    }
  }
  svg.appendChild(svgElement("rect", {
    class: "netq-frame", x: LEFT, y: TOP, width: innerW, height: innerH, fill: "none",
  }));
  return svg;
}

// ------------------------------------------------------------------------------ the view

function compare(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b));
}

// The view as drawn when the kernel has gone quiet while it said it was live (the kernel died,
// or a frontend stopped relaying updates): its last figures, and a badge that says so.
function staleView(view) {
  return Object.assign({}, view, {
    live: false,
    snapshot: `snapshot taken ${view.taken}, not live: no update from the kernel since then`,
    title: Object.assign({}, view.title, { state: "snapshot", label: "snapshot" }),
  });
}

function render({ model, el }) {
  const store = storeOf(model);
  const root = element("div", { class: "netq-view netq-monitor", "data-live": "0" });
  const title = element("div", { class: "netq-title" });
  const snapshot = element("div", { class: "netq-snapshot" });
  const charts = element("div", { class: "netq-charts" });
  const legend = element("div", { class: "netq-legend" });
  const tools = element("div", { class: "netq-tools" });
  const filter = element("input", {
    class: "netq-filter", type: "search", placeholder: "filter peers by name",
    "aria-label": "filter peers by name",
  });
  const shown = element("span", { class: "netq-shown" });
  tools.append(filter, shown);
  const tableBox = element("div", { class: "netq-table-box" });
  const table = element("table", { class: "netq-peers" });
  const head = element("thead");
  const body = element("tbody");
  table.append(head, body);
  tableBox.appendChild(table);
  const waiting = element("ul", { class: "netq-waiting" });
  const notes = element("div", { class: "netq-notes" });
  root.append(title, charts, legend, tools, tableBox, waiting, notes);
  el.appendChild(root);

  const hidden = new Set(); // peers whose lines a click on their legend entry hid
  let lastChange = performance.now(), stale = false; // see staleView()
  let sortKey = null, sortOrder = "desc", width = 0, frameRequest = 0;
  let headerKeys = "";

  function drawTitle(view) {
    const t = view.title;
    const parts = [
      element("span", { class: "netq-role" }, t.role),
      element("span", { class: "netq-address" }, t.address),
      element("span", { class: "netq-badge", "data-state": t.state }, t.label),
      element("span", { class: "netq-uptime" }, t.uptime),
      ...t.facts.map((fact) => element("span", { class: "netq-fact" }, fact)),
      ...t.alerts.map((alert) => element("span", { class: "netq-alert" }, alert)),
    ];
    title.replaceChildren(...parts);
    root.setAttribute("data-live", view.live ? "1" : "0");
    if (view.snapshot) {
      snapshot.textContent = view.snapshot;
      if (!snapshot.isConnected) root.insertBefore(snapshot, charts);
    } else {
      snapshot.remove();
    }
  }

  function drawHeader(view) {
    const keys = view.columns.map((c) => c[0]).join(",");
    if (keys === headerKeys) return;
    headerKeys = keys;
    const row = element("tr");
    for (const [key, header, numeric] of view.columns) {
      const cell = element("th", { "data-sort": key, class: numeric ? "netq-num" : "netq-text",
                                   title: "sort by " + header }, header);
      cell.addEventListener("click", () => {
        if (sortKey === key) sortOrder = sortOrder === "desc" ? "asc" : "desc";
        else { sortKey = key; sortOrder = numeric ? "desc" : "asc"; }
        drawTable(model.get("view"));
      });
      row.appendChild(cell);
    }
    head.replaceChildren(row);
  }

  function cells(view, texts, marks, colour) {
    const out = [];
    view.columns.forEach(([key], index) => {
      const cell = element("td", { "data-key": key });
      if (key === "peer" && colour) {
        cell.appendChild(element("span", { class: "netq-swatch", style: `background:${colour}` }));
      }
      cell.appendChild(document.createTextNode(texts[index]));
      const mark = marks && marks[key];
      if (mark) {
        cell.appendChild(element("sup", { class: "netq-mark", title: view.notes[mark] || "" },
                                 "*"));
      }
      out.push(cell);
    });
    return out;
  }

  function drawTable(view) {
    if (!view || !view.columns) return;
    drawHeader(view);
    for (const cell of head.querySelectorAll("th")) {
      if (cell.dataset.sort === sortKey) cell.setAttribute("data-order", sortOrder);
      else cell.removeAttribute("data-order");
    }
    let rows = view.rows.slice(); // the kernel's order: busiest first
    if (sortKey !== null) {
      const index = view.columns.findIndex((c) => c[0] === sortKey);
      const sign = sortOrder === "desc" ? -1 : 1;
      rows.sort((a, b) => sign * compare(a.sort[index], b.sort[index]));
    }
    const needle = filter.value.trim().toLowerCase();
    const visible = needle ? rows.filter((r) => r.peer.toLowerCase().includes(needle)) : rows;
    const out = visible.map((row) => {
      const tr = element("tr", { class: row.blocked ? "netq-peer netq-blocked" : "netq-peer",
                                 "data-peer": row.peer });
      if (row.blocked) tr.setAttribute("title", row.blocked);
      tr.append(...cells(view, row.cells, row.marks, row.colour));
      return tr;
    });
    if (view.others) {
      const tr = element("tr", { class: "netq-others" });
      tr.append(...cells(view, view.others.cells));
      out.push(tr);
    }
    const total = element("tr", { class: "netq-total" });
    total.append(...cells(view, view.total));
    out.push(total);
    body.replaceChildren(...out);
    const all = view.rows.length + (view.others ? view.others.count : 0);
    shown.textContent = needle ? `${visible.length} of ${view.rows.length} rows match`
      : (view.others ? `${view.rows.length} busiest of ${all} peers` : "");
  }

  function drawNotes(view) {
    waiting.replaceChildren(...view.waiting.map((text) => element("li", {}, text)));
    waiting.style.display = view.waiting.length ? "" : "none";
    notes.replaceChildren(...Object.values(view.notes).map(
      (text) => element("div", { class: "netq-note" }, `* ${text}`)));
  }

  function drawView() {
    let view = model.get("view");
    if (!view || !view.title) return;
    if (stale) view = staleView(view);
    drawTitle(view);
    drawTable(view);
    drawNotes(view);
  }

  function drawLegend(frame) {
    legend.replaceChildren(...frame.plotted.map((entry) => {
      const item = element("span", {
        class: hidden.has(entry.key) ? "netq-legend-entry netq-hidden" : "netq-legend-entry",
        "data-peer": entry.peer, title: "show or hide this peer's lines",
      });
      item.append(element("span", { class: "netq-swatch", style: `background:${entry.colour}` }),
                  document.createTextNode(entry.label));
      item.addEventListener("click", () => {
        if (hidden.has(entry.key)) hidden.delete(entry.key);
        else hidden.add(entry.key);
        drawCharts();
      });
      return item;
    }));
  }

  function drawCharts() {
    const frame = model.get("frame");
    if (!frame || !frame.charts) return;
    const plotted = frame.plotted.length > 0;
    charts.style.display = plotted ? "" : "none";
    legend.style.display = plotted ? "" : "none";
    drawLegend(frame);
    if (!plotted) return;
    const each = chartWidth(width || root.clientWidth || 900);
    charts.replaceChildren(...frame.charts.map((chart) => {
      const box = element("div", { class: "netq-chart-box" });
      box.append(element("div", { class: "netq-chart-title" }, chart.title),
                 drawChart(chart, frame, store, hidden, each));
      return box;
    }));
  }

  function schedule() {
    if (frameRequest) return;
    frameRequest = requestAnimationFrame(() => {
      frameRequest = 0;
      drawCharts();
    });
  }

  filter.addEventListener("input", () => drawTable(model.get("view")));
  const onView = () => {
    lastChange = performance.now();
    stale = false;
    drawView();
  };
  model.on("change:view", onView);
  const watchdog = setInterval(() => {
    const view = model.get("view") || {};
    const quiet = view.stale_after_ms || 10000;
    if (view.live && !stale && performance.now() - lastChange > quiet) {
      stale = true;
      drawView();
    }
  }, 1000);
  model.on("change:frame", schedule);
  store.listeners.add(schedule);
  const resize = new ResizeObserver((entries) => {
    const next = Math.floor(entries[0].contentRect.width);
    if (next > 0 && next !== width) {
      width = next;
      schedule();
    }
  });
  resize.observe(root);
  drawView();
  drawCharts();
  return () => {
    clearInterval(watchdog);
    model.off("change:view", onView);
    model.off("change:frame", schedule);
    store.listeners.delete(schedule);
    resize.disconnect();
    if (frameRequest) cancelAnimationFrame(frameRequest);
  };
}

function initialize({ model }) {
  const store = storeOf(model);
  return () => store.cleanup();
}

export default { initialize, render };
