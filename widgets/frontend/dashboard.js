// netq dashboard: the live view of netq.widgets.Dashboard (an anywidget ES module).
//
// It draws one synced trait, `view`: a JSON document the kernel computes every sample
// (Dashboard.view in widgets/dashboard.py), every figure already formatted there. The DOM is
// the one Dashboard.static_html writes without a script (same classes, same CSS):
// div.netq-view.netq-dashboard[data-live], .netq-title with .netq-badge[data-state] and
// .netq-uptime, .netq-snapshot when not live, svg.netq-map, tr.netq-communicator[data-name],
// tr.netq-link[data-link] with svg.netq-sparkline, .netq-stalls.
//
// A view that hears nothing from the kernel for a while (five intervals, at least 10 s) stops
// claiming to be live: it says since when its figures are, with the badge `snapshot`.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const esc = (value) => String(value ?? "").replace(/[&<>"']/g, (c) => ESCAPES[c]);
const SPARK_SCALE = 100; // sparkline points arrive as integers 0..SPARK_SCALE
const COMMUNICATOR_HEADERS = ["communicator", "transport", "state", "peers", "in", "out",
  "history (in, out)", "received, not taken", "memory held"];
const LINK_HEADERS = ["link", "state", "→", "←", "queued → / ←", "credit",
  "history (→ ←, queued)", "waiting"];

// Long names keep their start and their end (where workers' numbers usually are).
function clip(text, limit) {
  text = String(text ?? "");
  if (text.length <= limit) return text;
  const tail = Math.min(10, Math.floor(limit / 3));
  return text.slice(0, limit - tail - 1) + "…" + text.slice(text.length - tail);
}
const NAME_CHARS = 28; // a name in a table cell (the whole name is in the cell's title)

function sparkPath(values, size, width, height) {
  if (!values || values.length === 0) return "";
  const step = width / Math.max(size - 1, values.length - 1, 1);
  const start = width - step * (values.length - 1);
  const parts = [];
  let penUp = true;
  values.forEach((value, index) => {
    if (value === null || value === undefined) {
      penUp = true;
      return;
    }
    const x = start + index * step;
    const y = height - 1 - (value / SPARK_SCALE) * (height - 2);
    parts.push(`${penUp ? "M" : "L"}${x.toFixed(1)} ${y.toFixed(1)}`);
    penUp = false;
  });
  return parts.join(" ");
}

function sparkline(spark, metric, width, height) {
  const series = (spark && spark.series) || [];
  const size = (spark && spark.size) || 2;
  const paths = series.map((values, index) => {
    const d = sparkPath(values, size, width, height);
    return d ? `<path class="netq-spark-line netq-spark-${index}" d="${d}"/>` : "";
  }).join("");
  const samples = Math.max(0, ...series.map((values) => values.length));
  return `<svg class="netq-sparkline" data-metric="${metric}" viewBox="0 0 ${width} ${height}"` +
    ` width="${width}" height="${height}" preserveAspectRatio="none">` +
    `<title>${esc(`last ${samples} samples, top ${(spark && spark.max) || ""}`)}</title>` +
    `${paths}</svg>`;
}

function mapSvg(layout) {
  if (!layout) return "";
  const { width, height, box_w: boxW, box_h: boxH } = layout;
  const out = [`<svg class="netq-map" viewBox="0 0 ${width} ${height}" ` +
    'preserveAspectRatio="xMinYMid meet" role="img" aria-label="links">'];
  for (const edge of layout.edges || []) {
    out.push(`<g class="netq-edge" data-tone="${esc(edge.tone)}"><title>${esc(edge.title)}` +
      `</title><line x1="${edge.x1}" y1="${edge.y1}" x2="${edge.x2}" y2="${edge.y2}" ` +
      `stroke-width="${edge.width}"/>` +
      (edge.label ? `<text x="${edge.label_x}" y="${edge.label_y}">${esc(edge.label)}</text>`
        : "") + "</g>");
  }
  for (const node of layout.nodes || []) {
    const outside = node.outside ? ' data-outside="1"' : "";
    out.push(`<g class="netq-node" data-state="${esc(node.state)}"${outside}>` +
      `<title>${esc(node.name)}: ${esc(node.detail)}</title>` +
      `<rect class="netq-node-box" x="${node.x}" y="${node.y}" width="${boxW}" ` +
      `height="${boxH}" rx="4"/><rect class="netq-node-mark" x="${node.x}" y="${node.y}" ` +
      `width="5" height="${boxH}"/><text class="netq-node-name" x="${node.x + 10}" ` +
      `y="${node.y + 12}">${esc(clip(node.name, 26))}</text><text class="netq-node-detail" ` +
      `x="${node.x + 10}" y="${node.y + 25}">${esc(clip(node.detail, 30))}</text></g>`);
  }
  out.push("</svg>");
  return out.join("");
}

function cell(text, small = "", cls = "") {
  const klass = cls ? ` class="${cls}"` : "";
  const below = small ? `<small>${esc(small)}</small>` : "";
  return `<td${klass} title="${esc(`${text} ${small}`.trim())}"><span>${esc(text)}</span>` +
    `${below}</td>`;
}

function bar(budget) {
  const high = budget && budget.high ? " netq-high" : "";
  const percent = Math.round(((budget && budget.fraction) || 0) * 100);
  return `<span class="netq-bar${high}"><span style="width:${percent}%"></span></span>` +
    `<span class="netq-bar-text">${esc(budget && budget.text)}</span>`;
}

// Columns a narrow view (under 860 px, e.g. marimo's default width) folds away (the CSS).
const COMMUNICATOR_OPTIONAL = new Set([1, 6]);
const LINK_OPTIONAL = new Set([1]);

function head(headers, optional) {
  const cols = headers.map((_, index) => `<col class="netq-col-${index}">`).join("");
  const cells = headers.map((h, index) => {
    const klass = optional.has(index) ? ' class="netq-optional"' : "";
    return `<th${klass} title="${esc(h)}">${esc(h)}</th>`;
  }).join("");
  return `<colgroup>${cols}</colgroup><thead><tr>${cells}</tr></thead>`;
}

function communicatorsTable(view) {
  const rows = (view.communicators || []).map((row) => {
    const note = row.note
      ? `<small class="netq-row-note" title="${esc(row.note)}">${esc(row.note)}</small>` : "";
    return `<tr class="netq-communicator" data-name="${esc(row.name)}" ` +
      `data-state="${esc(row.state)}">` +
      `<td title="${esc(`${row.name} (${row.role}, up ${row.uptime})`)}">` +
      `<span>${esc(clip(row.name, NAME_CHARS))}</span>` +
      `<small>${esc(row.role)} · up ${esc(row.uptime)}</small></td>` +
      cell(row.transport, row.address, "netq-optional") +
      `<td><span class="netq-badge" data-state="${esc(row.state)}">` +
      `${esc(row.state_label)}</span>${note}</td>` +
      cell(String(row.peers), "", "netq-num") +
      cell(row.in_rate, row.in_msgs, "netq-num") +
      cell(row.out_rate, row.out_msgs, "netq-num") +
      `<td class="netq-optional">${sparkline(row.spark, "rate", 120, 24)}</td>` +
      `<td>${bar(row.received)}</td><td>${bar(row.memory)}</td></tr>`;
  });
  const more = view.communicators_more;
  if (more) {
    rows.push(`<tr class="netq-others"><td colspan="4">+${more.count} more communicators ` +
      `(${more.open} open)</td>${cell(more.in_rate, "", "netq-num")}` +
      `${cell(more.out_rate, "", "netq-num")}<td colspan="3"></td></tr>`);
  }
  return `<table class="netq-table netq-communicators">${head(COMMUNICATOR_HEADERS, COMMUNICATOR_OPTIONAL)}<tbody>` +
    `${rows.join("")}</tbody></table>`;
}

function linksTable(view) {
  const links = view.links || [];
  if (links.length === 0) return '<div class="netq-note">No links yet.</div>';
  const rows = links.map((row) => {
    const mark = row.credit_negative ? "*" : "";
    const creditTitle = mark ? ` title="${esc(view.credit_note)}"` : "";
    const waiting = row.waiting
      ? `<span class="netq-reason" title="${esc(row.reason)}">waiting ${esc(row.waited)}: ` +
        `${esc(row.reason)}</span>` : "-";
    return `<tr class="netq-link" data-link="${esc(row.key)}" ` +
      `data-waiting="${row.waiting ? "1" : "0"}">` +
      `<td title="${esc(`${row.a} → ${row.b}`)}"><span>${esc(clip(row.a, NAME_CHARS))}</span>` +
      `<span>→ ${esc(clip(row.b, NAME_CHARS))}${row.outside ? " (other process)" : ""}` +
      "</span></td>" +
      cell(row.state, "", "netq-optional") +
      cell(row.forward_rate, `${row.forward_msgs} · ${row.forward_total}`, "netq-num") +
      cell(row.back_rate, `${row.back_msgs} · ${row.back_total}`, "netq-num") +
      cell(row.queued, "", "netq-num") +
      `<td class="netq-num netq-credit"${creditTitle}><span>→ ${esc(row.credit_forward)}` +
      `${mark}</span><small>← ${esc(row.credit_back)}</small></td>` +
      `<td class="netq-history">${sparkline(row.spark_rate, "rate", 90, 24)}` +
      `${sparkline(row.spark_queued, "queued", 44, 24)}</td>` +
      `<td class="netq-waiting-cell">${waiting}</td></tr>`;
  });
  const more = view.links_more;
  if (more) {
    rows.push(`<tr class="netq-others"><td colspan="2">+${more.count} more links ` +
      `(${more.waiting} waiting)</td>${cell(more.forward_rate, "", "netq-num")}` +
      `${cell(more.back_rate, "", "netq-num")}${cell(more.queued, "", "netq-num")}` +
      `<td colspan="3"></td></tr>`);
  }
  const note = view.credit_note
    ? `<div class="netq-note netq-credit-note">* ${esc(view.credit_note)}</div>` : "";
  return `<table class="netq-table netq-links">${head(LINK_HEADERS, LINK_OPTIONAL)}<tbody>${rows.join("")}` +
    `</tbody></table>${note}`;
}

function stallsBlock(stalls) {
  const active = (stalls && stalls.active) || [];
  const ended = (stalls && stalls.ended) || [];
  const out = ['<div class="netq-stalls">'];
  if (active.length === 0 && ended.length === 0) {
    out.push('<div class="netq-note">No waits: every link\'s traffic flows.</div>');
  }
  for (const line of active) {
    out.push(`<details class="netq-stall" data-active="1" data-key="${esc(line.key)}">` +
      `<summary><span class="netq-stall-head">waiting ${esc(line.lasted)} · ` +
      `${esc(line.link)}</span><span class="netq-stall-text">${esc(line.reason)}</span>` +
      `</summary><div class="netq-stall-full">since ${esc(line.since)}: ${esc(line.reason)}` +
      `</div></details>`);
  }
  if (stalls && stalls.active_more) {
    out.push(`<div class="netq-note">and ${stalls.active_more} more waiting</div>`);
  }
  for (const line of ended) {
    out.push(`<details class="netq-stall" data-active="0" data-key="${esc(line.key)}">` +
      `<summary><span class="netq-stall-head">ended · ${esc(line.since)} for ` +
      `${esc(line.lasted)} · ${esc(line.link)}</span><span class="netq-stall-text">` +
      `${esc(line.reason)}</span></summary><div class="netq-stall-full">${esc(line.reason)}` +
      `</div></details>`);
  }
  out.push("</div>");
  return out.join("");
}

function body(view) {
  const facts = (view.facts || []).map((f) => `<span class="netq-fact">${esc(f)}</span>`);
  const title = '<div class="netq-title"><span class="netq-role">netq dashboard</span>' +
    `<span class="netq-badge" data-state="${esc(view.state)}">${esc(view.state_label)}</span>` +
    `${facts.join("")}<span class="netq-uptime">${esc(view.clock)}</span></div>`;
  const snapshot = view.snapshot ? `<div class="netq-snapshot">${esc(view.snapshot)}</div>` : "";
  if (view.empty) return `${title}${snapshot}<div class="netq-note">${esc(view.empty)}</div>`;
  return title + snapshot + mapSvg(view.map) + communicatorsTable(view) + linksTable(view) +
    stallsBlock(view.stalls);
}

// The view as drawn when the kernel has gone quiet: its last figures, saying so.
function staleView(view) {
  return Object.assign({}, view, {
    live: false, state: "snapshot", state_label: "snapshot",
    snapshot: `snapshot taken ${view.taken}, not live: no update from the kernel since then`,
  });
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "netq-view netq-dashboard";
  el.appendChild(root);
  let lastChange = performance.now();
  let stale = false;

  function draw() {
    let view = model.get("view") || {};
    if (stale) view = staleView(view);
    const open = new Set();
    for (const details of root.querySelectorAll("details[data-key][open]")) {
      open.add(details.dataset.key);
    }
    root.dataset.live = view.live ? "1" : "0";
    root.innerHTML = body(view);
    for (const details of root.querySelectorAll("details[data-key]")) {
      if (open.has(details.dataset.key)) details.open = true;
    }
  }

  const changed = () => {
    lastChange = performance.now();
    stale = false;
    draw();
  };
  model.on("change:view", changed);
  const watchdog = setInterval(() => {
    const view = model.get("view") || {};
    const quiet = view.stale_after_ms || Math.max(10000, 5 * (view.interval_ms || 1000));
    if (view.live && !stale && performance.now() - lastChange > quiet) {
      stale = true;
      draw();
    }
  }, 1000);
  draw();
  return () => {
    clearInterval(watchdog);
    if (typeof model.off === "function") model.off("change:view", changed);
  };
}

export default { render };
