// poslens explorer: unpacks the page's data and Plotly (gzip, base64) and draws the views.
// window.poslens holds the state and the readers the browser tests use.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("poslens-data").textContent);
  const $ = (id) => document.getElementById(id);
  const SEQ = "Viridis";  // sequential: lightness rises monotonically (reads in greyscale, colour-blind safe)
  const DIV = [[0, "#2d004b"], [0.25, "#8073ac"], [0.5, "#f7f7f7"], [0.75, "#e08214"], [1, "#7f3b08"]];  // PuOr
  const GREY = [[0, "#bdbdbd"], [1, "#bdbdbd"]];
  const CFG = {displaylogo: false, responsive: false, modeBarButtonsToRemove: ["sendDataToCloud", "lasso2d", "select2d"]};
  const state = {run: 0, view: null, layer: 0, head: 0, reading: null, creading: null, clength: null,
                 cell: null, layerSel: 0, lreading: null};
  let F16 = null, U16 = null;

  // ---- unpacking ------------------------------------------------------------------------
  function b64bytes(id) {
    const s = atob(document.getElementById(id).textContent.trim());
    const out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  async function gunzip(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).arrayBuffer();
  }
  function f16table() {
    const t = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) {
      const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
      t[h] = e === 0 ? s * Math.pow(2, -14) * (f / 1024) : e === 31 ? (f ? NaN : s * Infinity)
        : s * Math.pow(2, e - 15) * (1 + f / 1024);
    }
    return t;
  }
  function arr(ref) {  // a float16 array of the blob as a Float32Array (NaN kept)
    const n = ref.shape.reduce((a, b) => a * b, 1);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = F16[U16[ref.offset + i]];
    return out;
  }
  function slice2d(ref, index) {  // matrix `index` (flat over the leading dims) of an array [..., m, m] as rows
    const sh = ref.shape, m = sh[sh.length - 1], r = sh[sh.length - 2];
    const base = ref.offset + index * m * r, rows = [];
    for (let i = 0; i < r; i++) {
      const row = new Array(m);
      for (let j = 0; j < m; j++) { const v = F16[U16[base + i * m + j]]; row[j] = Number.isNaN(v) ? null : v; }
      rows.push(row);
    }
    return rows;
  }
  function vec(ref, index) {  // row `index` (flat over the leading dims) of an array [..., S]
    const S = ref.shape[ref.shape.length - 1], out = new Array(S);
    for (let j = 0; j < S; j++) { const v = F16[U16[ref.offset + index * S + j]]; out[j] = Number.isNaN(v) ? null : v; }
    return out;
  }

  // ---- helpers --------------------------------------------------------------------------
  const run = () => D.runs[state.run];
  const fmt = (v, d = 4) => v === null || v === undefined || Number.isNaN(v) ? "—"
    : Math.abs(v) >= 1000 || Number.isInteger(v) ? String(Math.round(v * 1e6) / 1e6) : Number(v).toPrecision(d);
  function range(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) if (v !== null && Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    return lo === Infinity ? [0, 1] : (lo === hi ? [lo, lo + (Math.abs(lo) || 1) * 1e-6] : [lo, hi]);
  }
  function grid(values, L, H) { const z = []; for (let l = 0; l < L; l++) z.push(values.slice(l * H, (l + 1) * H)); return z; }
  function positions(m, step) { const out = []; for (let i = 0; i < m; i++) out.push(i * step); return out; }
  function table(id, head, rows) {
    const t = $(id).querySelector("tbody");
    t.innerHTML = "";
    const tr = document.createElement("tr");
    for (const h of head) { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); }
    t.appendChild(tr);
    for (const r of rows) {
      const row = document.createElement("tr");
      r.forEach((c, i) => {
        const td = document.createElement(i === 0 ? "th" : "td");
        if (c && typeof c === "object") { td.textContent = c.text; for (const k in c.data) td.dataset[k] = c.data[k]; }
        else td.textContent = c;
        row.appendChild(td);
      });
      t.appendChild(row);
    }
  }
  function mapPlot(id, z, step, title, opts = {}) {  // z: rows of a map whose blocks hold `step` positions each
    const el = $(id);
    if (!z) { Plotly.purge(el); el.hidden = true; return; }
    el.hidden = false;
    const m = z.length, pos = positions(m, step || 1);
    const trace = {type: "heatmap", z: z, x: pos, y: pos, colorscale: opts.colorscale || SEQ, hoverongaps: false,
                   colorbar: {title: {text: opts.unit || "weight", side: "right"}, thickness: 12},
                   hovertemplate: "query %{y}, key %{x}: %{z:.4g}<extra></extra>"};
    if (opts.zmid !== undefined) { trace.zmid = opts.zmid; }
    else if (!opts.unit || opts.unit === "weight") {  // weights: the colour range of the keys after key 0 (the sink
      // would flatten everything else); key 0 is clipped to the top colour, its value on hover and in the table
      const [lo, hi] = range(z.flatMap((row) => row.slice(1)));
      trace.zmin = lo; trace.zmax = hi;
      trace.colorbar.title.text = "weight (key 0 clipped)";
    }
    Plotly.react(el, [trace], {title: {text: title, font: {size: 12}}, margin: {l: 50, r: 10, t: 30, b: 40},
      xaxis: {title: {text: "key position"}}, yaxis: {title: {text: "query position"}, autorange: "reversed"}}, CFG);
    el.setAttribute("aria-label", title);
  }

  // ---- tabs and runs --------------------------------------------------------------------
  function views(r) {
    if (r.kind === "scan") return ["heads", "layers"].concat(lengthGroup(r).length > 1 ? ["lengths"] : []);
    return ["compare"].concat(r.lengths.length > 1 ? ["lengths"] : []);
  }
  function lengthGroup(r) {  // scans of the same model (and data) at different lengths
    if (r.kind !== "scan") return [];
    const seen = new Map();
    D.runs.forEach((o, i) => { if (o.kind === "scan" && o.model === r.model && o.data === r.data && !seen.has(o.seq_len)) seen.set(o.seq_len, i); });
    return [...seen.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
  }
  function showView(v) {
    const allowed = views(run());
    if (!allowed.includes(v)) v = allowed[0];
    state.view = v;
    for (const b of document.querySelectorAll("#tabs button")) {
      b.hidden = !allowed.includes(b.dataset.view);
      b.setAttribute("aria-selected", String(b.dataset.view === v));
    }
    for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === "view-" + v);
    ({heads: drawHeads, layers: drawLayers, compare: drawCompare, lengths: drawLengths})[v]();
  }
  function setRun(i) {
    state.run = i;
    const r = run();
    $("run-select").value = String(i);
    $("run-info").textContent = r.kind === "scan"
      ? `${r.model}: ${r.layers.length} layers × ${r.num_heads} heads, ${r.num_seqs} × ${r.seq_len} tokens of ${r.data} data` +
        (r.trained_context ? `, trained context ${r.trained_context}` : "") + (r.beyond_context ? " (past the trained context)" : "") +
        `; ${r.convention}. Run directory ${r.path.split("/").pop()}`
      : `${r.model}${r.model_b && r.model_b !== r.model ? " vs " + r.model_b : ""}: ${r.variant || "A vs B"}, lengths ` +
        `${r.lengths.join(", ")}, ${r.num_layers} layers × ${r.num_heads} heads, ${r.noise_groups} sequence groups; ${r.convention}. ` +
        `Run directory ${r.path.split("/").pop()}`;
    $("run-info").title = r.path;
    $("notes").textContent = (r.notes || []).join(". ") + ((r.notes || []).length ? "." : "");
    fillSelects(r);
    state.layer = Math.min(state.layer, (r.layers || []).length - 1);
    state.head = Math.min(state.head, (r.num_heads || 1) - 1);
    showView(state.view);
  }
  function options(sel, items, value) {
    const el = $(sel);
    el.innerHTML = "";
    for (const [v, label] of items) { const o = document.createElement("option"); o.value = v; o.textContent = label; el.appendChild(o); }
    if (items.some(([v]) => v === value)) el.value = value; else if (items.length) el.value = items[0][0];
    return el.value;
  }
  function fillSelects(r) {
    if (r.kind === "scan") {
      state.reading = options("head-reading", D.head_readings.filter(([k]) => r.heads[k]).map(([k, l]) => [k, l]), state.reading);
      state.lreading = options("layer-reading", Object.keys(r.layer_readings).map((k) => [k, k]), state.lreading);
      const kinds = [["probs", "mean attention weights"], ["scores", "mean scores"]].filter(([k]) => r.maps["layer_" + k]);
      options("layer-map-kind", kinds, $("layer-map-kind").value);
      const lr = Object.keys(r.layer_readings).map((k) => [k, k]).concat(
        D.head_readings.filter(([k]) => r.heads[k]).map(([k, l]) => ["head:" + k, l + " (mean over heads)"]));
      options("length-reading", lr, $("length-reading").value);
      options("length-layer", [["mean", "mean over layers"]].concat(r.layers.map((l, i) => [String(i), "layer " + l])), $("length-layer").value);
    } else {
      state.creading = options("compare-reading", r.head_readings.map((k) => [k, k]), state.creading);
      state.clength = options("compare-length", r.lengths.map((S) => [String(S), S + " tokens" + (r.beyond_context[String(S)] ? " (past the trained context)" : "")]), state.clength);
      options("length-reading", Object.keys(r.readings).map((k) => [k, k + (r.head_readings.includes(k) ? " (mean over heads)" : "")]), $("length-reading").value);
      options("length-layer", [["mean", "mean over layers"]].concat(r.layers.map((l) => [String(l), "layer " + l])), $("length-layer").value);
    }
  }

  // ---- heads ----------------------------------------------------------------------------
  function drawHeads() {
    const r = run(), L = r.layers.length, H = r.num_heads, key = state.reading;
    const el = $("head-grid");
    if (!key || !r.heads[key]) { Plotly.purge(el); el.dataset.reading = ""; return drawHead(); }
    const values = r.heads[key], [lo, hi] = range(values);
    const label = (D.head_readings.find(([k]) => k === key) || [key, key, ""]);
    Plotly.react(el, [{type: "heatmap", z: grid(values, L, H), x: [...Array(H).keys()], y: [...Array(L).keys()],
      colorscale: SEQ, zmin: lo, zmax: hi, xgap: 1, ygap: 1, hoverongaps: false,
      colorbar: {title: {text: label[2], side: "right"}, thickness: 12},
      customdata: grid(r.layers.map((l) => Array(H).fill(l)).flat(), L, H),
      hovertemplate: "layer %{customdata}, head %{x}: %{z:.4g}<extra></extra>"}],
      {title: {text: label[1], font: {size: 12}}, margin: {l: 50, r: 10, t: 30, b: 40},
       xaxis: {title: {text: "head"}, dtick: 1}, yaxis: layerAxis(r.layers),
       shapes: [selShape(state.head, state.layer)]}, CFG);
    el.dataset.reading = key; el.dataset.zmin = String(lo); el.dataset.zmax = String(hi);
    el.setAttribute("aria-label", `${label[1]} of every head, layers ${r.layers[0]} to ${r.layers[L - 1]} by heads 0 to ${H - 1}; range ${fmt(lo)} to ${fmt(hi)}`);
    if (!el._poslens) {
      el._poslens = true;
      el.on("plotly_click", (ev) => { const p = ev.points[0]; select(p.y, p.x); el.focus(); });
    }
    drawHead();
  }
  function layerAxis(layers) {  // rows are the captured layers in order, labelled by their decoder-layer number
    const step = layers.length > 16 ? 2 : 1, idx = [...Array(layers.length).keys()].filter((i) => i % step === 0);
    return {title: {text: "layer"}, autorange: "reversed", tickmode: "array", tickvals: idx, ticktext: idx.map((i) => String(layers[i]))};
  }
  function selShape(x, y) {
    return {type: "rect", x0: x - 0.5, x1: x + 0.5, y0: y - 0.5, y1: y + 0.5, line: {color: "#ff1493", width: 3}};
  }
  function select(li, h) {
    const r = run();
    state.layer = Math.max(0, Math.min(r.layers.length - 1, li));
    state.head = Math.max(0, Math.min(r.num_heads - 1, h));
    Plotly.relayout($("head-grid"), {shapes: [selShape(state.head, state.layer)]});
    drawHead();
  }
  function headIndex(r) { return state.layer * r.num_heads + state.head; }
  function drawHead() {
    const r = run(), li = state.layer, h = state.head, layer = r.layers[li], i = headIndex(r);
    const panel = $("head-numbers");
    panel.dataset.layer = String(layer); panel.dataset.head = String(h);
    $("head-title").textContent = `layer ${layer}, head ${h}`;
    const ctrl = r.control !== null && r.control !== undefined ? D.runs[r.control] : null;
    const rows = D.head_readings.filter(([k]) => r.heads[k]).map(([k, label]) => {
      const v = r.heads[k][i];
      const chance = k === "slash_score" ? (r.maps.uniform_profile && r.heads.slash_offset[i] !== null ? r.maps.uniform_profile[r.heads.slash_offset[i]] : null)
        : r.chance[k];
      const row = [label, {text: fmt(v), data: {key: k, value: v === null ? "" : String(v)}}, fmt(chance)];
      if (ctrl) row.push(ctrl.heads[k] ? fmt(ctrl.heads[k][i]) : "—");
      return row;
    });
    table("head-numbers", ["reading", "value", "uniform causal attention"].concat(ctrl ? ["random-token control"] : []), rows);
    const m = r.maps, notes = [];
    const ref = m.head_probs || (m.selected_head_probs && m.selected_head_probs[li + "." + h]);
    if (!ref) notes.push("this scan kept no map of this head: scan with --heads all for every head's map");
    mapPlot("head-map", ref ? slice2d(ref, m.head_probs ? i : 0) : null, ref && ref.step,
            `mean attention weights, layer ${layer}, head ${h}`);
    const sc = m.selected_head_scores && m.selected_head_scores[li + "." + h];
    mapPlot("head-scores", sc ? slice2d(sc, 0) : null, sc && sc.step, `mean scores, layer ${layer}, head ${h}`, {unit: "score"});
    const cref = ctrl && ctrl.maps.head_probs;
    mapPlot("head-control", cref ? slice2d(cref, i) : null, cref && cref.step, `random-token control, layer ${layer}, head ${h}`);
    $("head-note").textContent = notes.join(". ");
    drawProfile(r, ctrl, i, layer, h);
  }
  function drawProfile(r, ctrl, i, layer, h) {
    const el = $("head-profile");
    if (!r.maps.profiles) { Plotly.purge(el); el.hidden = true; return; }
    el.hidden = false;
    const p = vec(r.maps.profiles, i), S = p.length, x = [...Array(S).keys()].slice(1);
    const traces = [{type: "scatter", mode: "lines", x: x, y: p.slice(1), name: "this head", line: {color: "#21918c", width: 2}},
      {type: "scatter", mode: "lines", x: x, y: r.maps.uniform_profile.slice(1), name: "uniform causal attention",
       line: {color: "#444", dash: "dash", width: 1}}];
    if (ctrl && ctrl.maps.profiles) {
      const c = vec(ctrl.maps.profiles, i);
      traces.push({type: "scatter", mode: "lines", x: x, y: c.slice(1), name: "random-token control", line: {color: "#e08214", dash: "dot", width: 2}});
    }
    Plotly.react(el, traces, {title: {text: `mean weight by offset Δ, layer ${layer}, head ${h}`, font: {size: 12}},
      margin: {l: 60, r: 10, t: 30, b: 40}, xaxis: {title: {text: "offset Δ = query − key"}, type: "log"},
      yaxis: {title: {text: "SlashScore(Δ)"}, type: "log"}, legend: {orientation: "h", y: -0.3}}, CFG);
  }
  function onKey(ev) {
    if (ev.target && ev.target.tagName === "SELECT") return;
    const d = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]}[ev.key];
    if (!d) return;
    if (state.view === "heads") { ev.preventDefault(); select(state.layer + d[0], state.head + d[1]); }
    else if (state.view === "compare" && state.cell) { ev.preventDefault(); selectCell(state.cell[0] + d[0], state.cell[1] + d[1]); }
    else if (state.view === "layers") { ev.preventDefault(); selectLayer(state.layerSel + d[0] + d[1]); }
  }

  // ---- layers ---------------------------------------------------------------------------
  function drawLayers() {
    const r = run(), key = state.lreading, el = $("layer-plot");
    const rec = r.layer_readings[key];
    if (!rec) { Plotly.purge(el); return; }
    const x = r.layers, traces = [];
    if (rec.floor && rec.floor_kind === "band") {
      const up = rec.values.map((v, i) => v === null || rec.floor[i] === null ? null : v + 1.96 * rec.floor[i]);
      const dn = rec.values.map((v, i) => v === null || rec.floor[i] === null ? null : v - 1.96 * rec.floor[i]);
      traces.push({type: "scatter", mode: "lines", x: x, y: dn, line: {width: 0}, hoverinfo: "skip", showlegend: false});
      traces.push({type: "scatter", mode: "lines", x: x, y: up, fill: "tonexty", fillcolor: "rgba(33,145,140,0.2)",
                   line: {width: 0}, name: "± 1.96 standard errors", hoverinfo: "skip"});
    }
    traces.push({type: "scatter", mode: "lines+markers", x: x, y: rec.values, name: key, line: {color: "#21918c", width: 2}});
    if (rec.floor && rec.floor_kind !== "band") {
      traces.push({type: "scatter", mode: "lines", x: x, y: rec.floor, name: rec.floor_kind === "chance" ? "uniform causal attention" : "noise floor",
                   line: {color: "#444", dash: "dash", width: 1}});
    }
    Plotly.react(el, traces, {title: {text: `${key} by layer`, font: {size: 12}}, margin: {l: 60, r: 10, t: 30, b: 40},
      xaxis: {title: {text: "decoder layer (from 0)"}}, yaxis: {title: {text: key}}, legend: {orientation: "h", y: -0.25},
      shapes: [{type: "line", x0: x[state.layerSel], x1: x[state.layerSel], yref: "paper", y0: 0, y1: 1, line: {color: "#ff1493", width: 2}}]}, CFG);
    if (!el._poslens) {
      el._poslens = true;
      el.on("plotly_click", (ev) => selectLayer(r.layers.indexOf(ev.points[0].x)));
    }
    table("layer-numbers", ["layer"].concat(r.layers.map(String)),
          [[key].concat(rec.values.map((v) => fmt(v)))].concat(rec.floor ? [[rec.floor_kind === "band" ? "standard error" : rec.floor_kind === "chance" ? "uniform causal attention" : "noise floor"].concat(rec.floor.map((v) => fmt(v)))] : []));
    drawLayerMap();
  }
  function selectLayer(li) {
    const r = run();
    state.layerSel = Math.max(0, Math.min(r.layers.length - 1, li));
    drawLayers();
  }
  function drawLayerMap() {
    const r = run(), kind = $("layer-map-kind").value, ref = r.maps["layer_" + kind];
    mapPlot("layer-map", ref ? slice2d(ref, state.layerSel) : null, ref && ref.step,
            `${kind === "scores" ? "mean scores" : "mean attention weights"}, layer ${r.layers[state.layerSel]}`,
            {unit: kind === "scores" ? "score" : "weight"});
  }

  // ---- compare --------------------------------------------------------------------------
  function compareCells(r) { return ((r.readings[state.creading] || {})[state.clength] || {}).heads; }
  function drawCompare() {
    const r = run(), L = r.num_layers, H = r.num_heads, c = compareCells(r), el = $("change-grid");
    if (!state.cell) state.cell = [0, 0];
    if (!c) { Plotly.purge(el); $("compare-note").textContent = "no per-head cells for this reading"; return; }
    const delta = c.delta, changed = c.changed;
    const col = delta.map((v, i) => changed[i] === 1 ? v : null);
    const grey = delta.map((v, i) => changed[i] === 0 ? 0 : null);
    const m = Math.max(1e-12, ...col.filter((v) => v !== null).map(Math.abs), ...delta.filter((v) => v !== null).map(Math.abs));
    const sign = col.map((v) => v === null ? "" : v > 0 ? "+" : "−");
    const hover = delta.map((v, i) => `a ${fmt(c.a[i])}, b ${fmt(c.b[i])}, Δ ${fmt(v)}, floor ${fmt(c.floor[i])}, p ${fmt(c.p[i], 3)}: ${changed[i] === 1 ? "changed" : "unchanged"}`);
    Plotly.react(el, [
      {type: "heatmap", name: "unchanged", z: grid(grey, L, H), colorscale: GREY, showscale: false, zmin: 0, zmax: 1,
       xgap: 1, ygap: 1, hoverongaps: false, customdata: grid(hover, L, H), hovertemplate: "layer %{y}, head %{x}: %{customdata}<extra></extra>"},
      {type: "heatmap", name: "changed", z: grid(col, L, H), colorscale: DIV, zmin: -m, zmax: m, zmid: 0, xgap: 1, ygap: 1,
       hoverongaps: false, text: grid(sign, L, H), texttemplate: "%{text}", customdata: grid(hover, L, H),
       colorbar: {title: {text: "B − A", side: "right"}, thickness: 12}, hovertemplate: "layer %{y}, head %{x}: %{customdata}<extra></extra>"}],
      {title: {text: `${state.creading}: B − A at ${state.clength} tokens`, font: {size: 12}}, margin: {l: 50, r: 10, t: 30, b: 40},
       xaxis: {title: {text: "head"}, dtick: 1}, yaxis: layerAxis(r.layers),
       shapes: state.cell ? [selShape(state.cell[1], state.cell[0])] : []}, CFG);
    el.dataset.reading = state.creading; el.dataset.length = state.clength;
    el.setAttribute("aria-label", `${state.creading}: change B − A per head, ${changed.filter((v) => v === 1).length} of ${L * H} cells changed`);
    if (!el._poslens) {
      el._poslens = true;
      el.on("plotly_click", (ev) => { const p = ev.points[0]; selectCell(p.y, p.x); el.focus(); });
    }
    drawCell();
  }
  function selectCell(li, h) {
    const r = run();
    state.cell = [Math.max(0, Math.min(r.num_layers - 1, li)), Math.max(0, Math.min(r.num_heads - 1, h))];
    Plotly.relayout($("change-grid"), {shapes: [selShape(state.cell[1], state.cell[0])]});
    drawCell();
  }
  function drawCell() {
    const r = run(), c = compareCells(r), [li, h] = state.cell, i = li * r.num_heads + h;
    $("compare-title").textContent = `layer ${li}, head ${h}: ${state.creading} at ${state.clength} tokens`;
    table("compare-numbers", ["", "value"], [["A", fmt(c.a[i])], ["B", fmt(c.b[i])], ["B − A", fmt(c.delta[i])],
      ["noise floor (z·se)", fmt(c.floor[i])], ["p (sign-flip, before correction)", fmt(c.p[i], 3)],
      ["verdict", {text: c.changed[i] === 1 ? "changed" : "unchanged", data: {verdict: c.changed[i] === 1 ? "changed" : "unchanged"}}]]);
    const mp = r.maps[state.clength];
    if (!mp) {
      $("compare-note").textContent = "";  // the run's note, at the top, says what would add the maps
      for (const id of ["compare-a", "compare-b", "compare-diff"]) mapPlot(id, null);
      return;
    }
    $("compare-note").textContent = "";
    const a = slice2d(mp.a, i), b = slice2d(mp.b, i), S = mp.a.step;
    const diff = a.map((row, y) => row.map((v, x) => v === null || b[y][x] === null ? null : b[y][x] - v));
    const [lo, hi] = range(a.flatMap((row) => row.slice(1)).concat(b.flatMap((row) => row.slice(1))));  // key 0 clipped
    const dm = Math.max(1e-12, ...diff.flat().filter((v) => v !== null).map(Math.abs));
    mapPlot("compare-a", a, S, `A, layer ${li}, head ${h}`);
    mapPlot("compare-b", b, S, `B, layer ${li}, head ${h}`);
    Plotly.restyle($("compare-a"), {zmin: [lo], zmax: [hi]});
    Plotly.restyle($("compare-b"), {zmin: [lo], zmax: [hi]});
    mapPlot("compare-diff", diff, S, "B − A", {colorscale: DIV, zmid: 0, unit: "B − A"});
    Plotly.restyle($("compare-diff"), {zmin: [-dm], zmax: [dm]});
  }

  // ---- lengths --------------------------------------------------------------------------
  function drawLengths() {
    const r = run(), key = $("length-reading").value, layer = $("length-layer").value, el = $("length-plot");
    const traces = [];
    let xs = [];
    const mean = (v) => { const f = v.filter((x) => x !== null); return f.length ? f.reduce((a, b) => a + b, 0) / f.length : null; };
    const rows = [];
    if (r.kind === "compare") {
      xs = r.lengths;
      const rec = r.readings[key] || {};
      for (const side of ["a", "b"]) {
        const y = [], err = [];
        for (const S of xs) {
          const lay = (rec[String(S)] || {}).layers;
          if (!lay) { y.push(null); err.push(null); continue; }
          if (layer === "mean") { y.push(mean(lay[side])); err.push(null); }
          else { const k = lay.layer.indexOf(Number(layer)); y.push(k < 0 ? null : lay[side][k]); err.push(k < 0 || side === "a" ? null : lay.floor[k]); }
        }
        traces.push({type: "scatter", mode: "lines+markers", x: xs, y: y, name: side === "a" ? "A" : "B",
                     error_y: side === "b" ? {type: "data", array: err, visible: true} : undefined,
                     line: {color: side === "a" ? "#21918c" : "#e08214", dash: side === "a" ? "solid" : "dash"}});
        rows.push([side === "a" ? "A" : "B"].concat(y.map((v) => fmt(v))));
      }
    } else {
      const group = lengthGroup(r);
      xs = group.map((j) => D.runs[j].seq_len);
      const y = group.map((j) => {
        const o = D.runs[j];
        const vals = key.startsWith("head:") ? headLayerMeans(o, key.slice(5)) : ((o.layer_readings[key] || {}).values || []);
        return layer === "mean" ? mean(vals) : (vals[Number(layer)] === undefined ? null : vals[Number(layer)]);
      });
      traces.push({type: "scatter", mode: "lines+markers", x: xs, y: y, name: key, line: {color: "#21918c"}});
      rows.push([key].concat(y.map((v) => fmt(v))));
    }
    const tc = r.trained_context;
    const shapes = tc ? [{type: "line", x0: tc, x1: tc, yref: "paper", y0: 0, y1: 1, line: {color: "#a00", dash: "dot", width: 2}}] : [];
    Plotly.react(el, traces, {title: {text: `${key} against length` + (layer === "mean" ? " (mean over layers)" : `, layer ${layer}`), font: {size: 12}},
      margin: {l: 60, r: 10, t: 30, b: 40}, xaxis: {title: {text: "sequence length (tokens)"}, type: "log"},
      yaxis: {title: {text: key}}, shapes: shapes, legend: {orientation: "h", y: -0.25},
      annotations: tc ? [{x: Math.log10(tc), y: 1, yref: "paper", text: `trained context ${tc}`, showarrow: false, xanchor: "right", font: {color: "#a00"}}] : []}, CFG);
    table("length-numbers", ["tokens"].concat(xs.map(String)), rows);
  }
  function headLayerMeans(o, k) {
    const v = o.heads[k] || [], H = o.num_heads, out = [];
    for (let l = 0; l < o.layers.length; l++) { const s = v.slice(l * H, (l + 1) * H).filter((x) => x !== null); out.push(s.length ? s.reduce((a, b) => a + b, 0) / s.length : null); }
    return out;
  }

  // ---- start ----------------------------------------------------------------------------
  async function start() {
    const t0 = performance.now();
    const code = new TextDecoder().decode(await gunzip(b64bytes("poslens-plotly")));
    const s = document.createElement("script");
    s.textContent = code;
    document.head.appendChild(s);
    F16 = f16table();
    U16 = new Uint16Array(await gunzip(b64bytes("poslens-blob")));
    document.body.dataset.unpackMs = String(Math.round(performance.now() - t0));  // Plotly and the data unpacked
    $("plotly-version").textContent = D.plotly;
    const sel = $("run-select");
    D.runs.forEach((r, i) => { const o = document.createElement("option"); o.value = String(i); o.textContent = r.label; sel.appendChild(o); });
    sel.addEventListener("change", () => { state.cell = null; state.layerSel = 0; setRun(Number(sel.value)); });
    for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showView(b.dataset.view));
    $("head-reading").addEventListener("change", (e) => { state.reading = e.target.value; drawHeads(); });
    $("layer-reading").addEventListener("change", (e) => { state.lreading = e.target.value; drawLayers(); });
    $("layer-map-kind").addEventListener("change", drawLayerMap);
    $("compare-reading").addEventListener("change", (e) => { state.creading = e.target.value; drawCompare(); });
    $("compare-length").addEventListener("change", (e) => { state.clength = e.target.value; drawCompare(); });
    $("length-reading").addEventListener("change", drawLengths);
    $("length-layer").addEventListener("change", drawLengths);
    document.addEventListener("keydown", onKey);
    setRun(0);
    document.body.dataset.loadMs = String(Math.round(performance.now() - t0));
    document.body.dataset.ready = "1";
  }
  window.poslens = {data: D, state: state, select: select, selectCell: selectCell, setRun: setRun, showView: showView,
                    headMap: (li, h) => { const r = run(); return r.maps.head_probs ? slice2d(r.maps.head_probs, li * r.num_heads + h) : null; }};
  start().catch((e) => { $("error").textContent = "the explorer could not start: " + e; document.body.dataset.ready = "error"; throw e; });
})();
