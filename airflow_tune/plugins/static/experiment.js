// The Experiment view: fetches experiment/data with the page's own query and draws the header, the curves (uPlot)
// and the trial table. Every text from the server goes in with textContent, never as HTML.
(function () {
  "use strict";

  var BEST_COLOR = "#d9480f";
  var PALETTE = [
    "#1c7ed6", "#2f9e44", "#ae3ec9", "#0c8599", "#e64980", "#5f3dc4", "#66a80f", "#364fc7", "#087f5b", "#c2255c",
    "#1098ad", "#862e9c", "#74b816", "#4263eb", "#a61e4d", "#0b7285", "#5c940d", "#9c36b5", "#3b5bdb", "#099268",
  ];
  var state = { data: null, plot: null, colors: [], loads: 0, timer: null };
  window.experimentView = state;

  // Several objectives: the best trial goes by the first; the Pareto front lists every trial no other beats in all.
  function showObjectives(data) {
    var objectives = data.objectives || [];
    var box = byId("objectives");
    box.hidden = byId("objectives-label").hidden = objectives.length < 2;
    box.textContent = "";
    if (objectives.length < 2) return;
    var names = objectives.map(function (o) { return o.metric + " (" + o.mode + ")"; });
    box.appendChild(el("div", null, names.join(", ") + ": the best trial goes by the first, " + names[0] + "."));
    if (!data.pareto_front) return;
    var size = data.pareto_front_size, front = data.pareto_front;
    box.appendChild(el("div", null, "Pareto front (each trial's last result): " + size + " trial" + (size === 1 ? "" : "s") +
      (front.length < size ? ", the first " + front.length + " by " + objectives[0].metric + " listed" : "")));
    front.forEach(function (t) {
      box.appendChild(el("div", null, t.trial_id + " · " + objectives.map(function (o, i) {
        return o.metric + " = " + fmt(t.values[i]);
      }).join(", ") + " · " + t.config));
    });
  }

  function byId(id) { return document.getElementById(id); }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmt(value) {
    if (value === null || value === undefined) return "–";
    if (typeof value === "number") {
      if (Number.isInteger(value)) return String(value);
      return String(Number(value.toPrecision(6)));
    }
    return String(value);
  }

  function showMessage(text, pageState) {
    var message = byId("message");
    message.textContent = text;
    message.hidden = false;
    byId("experiment").hidden = true;
    document.body.dataset.state = pageState || "message";
  }

  function schedule(seconds) {
    if (state.timer) clearTimeout(state.timer);
    state.timer = setTimeout(load, seconds * 1000);
  }

  function load() {
    fetch("experiment/data" + window.location.search, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      cache: "no-store",
    }).then(function (resp) {
      if (resp.status === 401) { showMessage("Your session has ended: sign in to Airflow again.", "error"); return null; }
      if (resp.status === 403) { showMessage("You may not read this DAG's task instances.", "error"); return null; }
      if (!resp.ok) {
        showMessage("The experiment's data could not be loaded (HTTP " + resp.status + ").", "error");
        schedule(15);
        return null;
      }
      return resp.json();
    }).then(function (data) {
      if (!data) return;
      render(data);
      if (data.refresh_s) schedule(data.refresh_s);
    }).catch(function (err) {
      showMessage("The Airflow API server did not answer: " + err, "error");
      schedule(15);
    });
  }

  function render(data) {
    state.data = data;
    state.loads += 1;
    if (data.state !== "experiment") {
      // A file that could not be used is named even when there is nothing else to show.
      var problems = (data.problems || []).length ? " (" + data.problems.join("; ") + ")" : "";
      showMessage(data.message + problems, data.state);
      return;
    }
    byId("message").hidden = true;
    byId("experiment").hidden = false;
    renderHeader(data);
    renderTable(data);
    renderPlot(data);
    var updated = data.updated_at ? new Date(data.updated_at * 1000).toLocaleString() : "–";
    byId("footer").textContent = "Files at " + data.experiment_uri + " · updated " + updated +
      (data.refresh_s ? " · refreshing every " + data.refresh_s + " s" : "");
    document.body.dataset.state = "ready";
  }

  function renderHeader(data) {
    byId("name").textContent = data.experiment;
    var status = byId("status");
    status.textContent = data.status;
    status.className = "badge " + data.status;
    var counts = byId("counts");
    counts.textContent = "";
    counts.appendChild(document.createTextNode((data.num_trials === null ? "?" : data.num_trials) + " trials  "));
    Object.keys(data.counts || {}).sort().forEach(function (name) {
      counts.appendChild(el("span", "badge " + name, name + " " + data.counts[name]));
    });
    var best = data.best;
    byId("best").textContent = best
      ? best.trial_id + " · " + data.metric + " = " + fmt(best.value) + " (" + data.mode + ")" +
        (best.iteration !== null && best.iteration !== undefined ? " at iteration " + fmt(best.iteration) : "")
      : "none yet";
    byId("best-config").textContent = best ? best.config : "–";
    byId("checkpoint").textContent = data.best_checkpoint_uri || (data.status === "running" ? "when it finishes" : "none");
    showObjectives(data);
    var job = byId("job");
    job.textContent = "";
    if (data.ray_job_url) {
      var link = el("a", null, data.ray_job_url);
      link.href = data.ray_job_url;
      link.rel = "noopener noreferrer";
      job.appendChild(link);
    } else {
      job.textContent = "–";
    }
    renderTracking(data.mlflow);
    var promotion = data.promotion;
    byId("promotion-label").hidden = byId("promotion").hidden = !promotion;
    if (promotion) {
      byId("promotion").textContent = (promotion.promoted ? "promoted as version " + promotion.version : "not promoted") +
        " by " + promotion.task_id + ": " + promotion.reason;
    }
    var problems = byId("problems");
    problems.hidden = !(data.problems && data.problems.length);
    problems.textContent = (data.problems || []).join("; ");
  }

  // A link the server built and checked (http(s) only); its text set as text.
  function link(url, text) {
    var a = el("a", null, text);
    a.href = url;
    a.rel = "noopener noreferrer";
    a.target = "_blank";
    return a;
  }

  function renderTracking(tracking) {
    var box = byId("mlflow");
    box.textContent = "";
    byId("mlflow-label").hidden = box.hidden = !(tracking && tracking.experiment_url);
    if (box.hidden) return;
    box.appendChild(link(tracking.experiment_url, "experiment"));
    if (tracking.parent_run_url) {
      box.appendChild(document.createTextNode(" · "));
      box.appendChild(link(tracking.parent_run_url, "parent run"));
    }
    if (tracking.errors) {
      box.appendChild(el("span", "error", " · " + tracking.errors + " tracking call(s) failed" +
        (tracking.last_error ? ": " + tracking.last_error : "")));
    }
  }

  function renderTable(data) {
    var table = data.table;
    var head = byId("trials").tHead;
    var body = byId("trials").tBodies[0];
    head.textContent = "";
    body.textContent = "";
    var hasErrors = table.rows.some(function (r) { return r.error; });
    var hasRuns = table.rows.some(function (r) { return r.mlflow_url; });
    var headRow = el("tr");
    headRow.appendChild(el("th", null, "Trial"));
    headRow.appendChild(el("th", null, "Status"));
    headRow.appendChild(el("th", "num", "Iter"));
    headRow.appendChild(el("th", "num", data.metric + (data.mode === "max" ? " ↓ (max)" : " ↑ (min)")));
    table.columns.forEach(function (c) { headRow.appendChild(el("th", null, c)); });
    if (hasRuns) headRow.appendChild(el("th", null, "MLflow"));
    if (hasErrors) headRow.appendChild(el("th", null, "Error"));
    head.appendChild(headRow);
    table.rows.forEach(function (r) {
      var tr = el("tr", r.best ? "best" : null);
      tr.dataset.trialId = r.trial_id;
      tr.appendChild(el("td", null, r.trial_id));
      var statusCell = el("td");
      statusCell.appendChild(el("span", "badge " + r.status, r.status));
      tr.appendChild(statusCell);
      tr.appendChild(el("td", "num", fmt(r.iteration)));
      tr.appendChild(el("td", "num", fmt(r.value)));
      table.columns.forEach(function (c) {
        tr.appendChild(el("td", null, c in r.config ? r.config[c] : ""));
      });
      if (hasRuns) {
        var runCell = el("td", "mlflow");
        if (r.mlflow_url) runCell.appendChild(link(r.mlflow_url, "run"));
        tr.appendChild(runCell);
      }
      if (hasErrors) tr.appendChild(el("td", "error", r.error || ""));
      body.appendChild(tr);
    });
    var notes = [];
    if (table.note) notes.push(table.note);
    if (table.hidden_columns) notes.push(table.hidden_columns + " more config keys are not shown.");
    if (!table.rows.length) notes.push("No trial has reported yet.");
    byId("table-note").textContent = notes.join(" ");
  }

  function renderPlot(data) {
    var curves = data.curves || [];
    var box = byId("plot");
    if (state.plot) { state.plot.destroy(); state.plot = null; }
    box.textContent = "";
    state.colors = [];
    byId("plot-title").textContent = data.metric + " by training_iteration";
    var note = [];
    if (data.history_note) note.push(data.history_note);
    if (!curves.length) {
      if (!data.history_note) note.push("No trial has reported " + data.metric + " yet.");
      byId("plot-note").textContent = note.join(" ");
      return;
    }
    var running = curves.filter(function (c) { return c.status === "RUNNING"; }).length;
    note.push("Curves of the best " + (curves.length - running) + " trials" +
      (running ? " and of " + running + " running ones" : "") + "; the best trial's is thick and orange.");
    byId("plot-note").textContent = note.join(" ");

    var xs = [];
    var seen = new Set();
    curves.forEach(function (c) { c.points.forEach(function (p) { if (!seen.has(p[0])) { seen.add(p[0]); xs.push(p[0]); } }); });
    xs.sort(function (a, b) { return a - b; });
    var index = new Map(xs.map(function (x, i) { return [x, i]; }));
    var columns = [xs];
    var fg = getComputedStyle(document.body).color;
    var series = [{ label: "training_iteration" }];
    var paletteAt = 0;
    curves.forEach(function (c) {
      var ys = new Array(xs.length).fill(null);
      c.points.forEach(function (p) { ys[index.get(p[0])] = p[1]; });
      columns.push(ys);
      var color = c.best ? BEST_COLOR : PALETTE[paletteAt++ % PALETTE.length];
      state.colors.push(color);
      series.push({
        label: c.trial_id + (c.best ? " (best)" : c.status === "RUNNING" ? " (running)" : ""),
        stroke: color,
        width: c.best ? 3.5 : 2,
        spanGaps: true,
        points: { show: c.points.length === 1 || xs.length <= 40, size: c.best ? 8 : 6, fill: color, stroke: color },
      });
    });
    var axis = { stroke: fg, grid: { stroke: "rgba(128,128,128,0.18)" }, ticks: { stroke: "rgba(128,128,128,0.3)" } };
    var xAxis = Object.assign({ label: "training_iteration" }, axis);
    if (xs.every(Number.isInteger)) {  // iterations: no tick at 1.5
      xAxis.incrs = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000, 100000];
    }
    var opts = {
      width: Math.max(320, box.clientWidth || 800),
      height: 320,
      scales: { x: { time: false } },
      series: series,
      axes: [xAxis, Object.assign({ label: data.metric, size: 70 }, axis)],
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
    };
    state.plot = new uPlot(opts, columns, box);
  }

  window.addEventListener("resize", function () {
    if (state.plot) state.plot.setSize({ width: Math.max(320, byId("plot").clientWidth), height: 320 });
  });

  load();
})();
