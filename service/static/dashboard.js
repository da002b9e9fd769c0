// Live jobs for the dashboard: polls /v1/jobs (or one job on its page) and rewrites the jobs
// table; cancels a job with the bearer token the user typed (KS_API_TOKEN), which stays in this
// tab's sessionStorage. Everything is written with textContent, so a job's fields can never
// become markup. The cells are the ones templates/_jobs.html renders on the server.
(function () {
  "use strict";
  var POLL_MS = 2000;
  var TOKEN_KEY = "ks-api-token";
  var PREFIXES = { "-9": "n", "-6": "\u00b5", "-3": "m", "0": "" };

  function cell(row, text, cls) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function axesLabel(c) {
    return Object.keys(c).sort().map(function (k) { return k + "=" + c[k]; }).join(", ");
  }

  function casesLabel(cases) {
    if (!Array.isArray(cases)) return "";
    var more = cases.length > 4 ? " (+" + (cases.length - 4) + ")" : "";
    return cases.slice(0, 4).map(axesLabel).join("; ") + more;
  }

  // A latency in microseconds as seconds with an SI prefix (charts.microseconds).
  function fmtUs(us) {
    if (typeof us !== "number" || !isFinite(us)) return "";
    var s = Number((us * 1e-6).toPrecision(4));
    if (s === 0) return "0 s";
    var e = Math.max(-9, Math.min(0, 3 * Math.floor(Math.log10(Math.abs(s)) / 3)));
    return String(Number((s / Math.pow(10, e)).toPrecision(4))) + " " + PREFIXES[String(e)] + "s";
  }

  // dashboard.job_row's elapsed time.
  function fmtDuration(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    function two(n) { return (n < 10 ? "0" : "") + n; }
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + two(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + two(Math.floor((s % 3600) / 60)) + " min";
  }

  function elapsed(j) {
    if (!j.started_at) return "";
    var end = j.finished_at ? Date.parse(j.finished_at) : Date.now();
    return fmtDuration((end - Date.parse(j.started_at)) / 1000);
  }

  function bestSoFar(j) {
    var found = [];
    var cases = (j.best && Array.isArray(j.best.cases)) ? j.best.cases : [];
    cases.forEach(function (c) {
      if (typeof c.best_latency_us === "number") found.push(c.best_latency_us);
    });
    var cur = j.current_case || {};
    if (typeof cur.best_latency_us === "number") found.push(cur.best_latency_us);
    return found.length ? Math.min.apply(null, found) : null;
  }

  function cancelEnabled() {
    return document.body.getAttribute("data-cancel") === "on";
  }

  function link(td, href, text, cls) {
    var a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    if (cls) a.className = cls;
    td.appendChild(a);
    return a;
  }

  function jobRow(j) {
    var nCases = Array.isArray(j.cases) ? j.cases.length : 0;
    var total = Math.max(1, (j.n_trials || 0) * Math.max(1, nCases));
    var id = Number(j.id);
    var row = document.createElement("tr");
    row.setAttribute("data-job", String(id));
    row.className = "status-" + String(j.status).replace(/[^a-z]/g, "");
    link(cell(row, ""), "/jobs/" + id, String(id));
    cell(row, j.status);
    cell(row, j.kernel);
    cell(row, casesLabel(j.cases));
    var cur = j.current_case || {};
    cell(row, j.status === "running" && cur.axes ? axesLabel(cur.axes) : "");
    var ptd = cell(row, "", "progress");
    var p = document.createElement("progress");
    p.max = 100;
    p.value = Math.min(100, 100 * (j.trials_done || 0) / total);
    ptd.appendChild(p);
    ptd.appendChild(document.createTextNode(" " + (j.trials_done || 0) + " / " + (j.n_trials || 0) * nCases));
    cell(row, fmtUs(bestSoFar(j)), "num");
    cell(row, elapsed(j), "num");
    cell(row, j.device);
    var err = cell(row, j.error, "error");
    if (j.status === "failed") {
      err.appendChild(document.createTextNode(" "));
      link(err, "/jobs/" + id + "#failed", "failed trials", "failed-trials");
    }
    var act = cell(row, "");
    if (cancelEnabled() && (j.status === "queued" || j.status === "running")) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = "cancel";
      b.setAttribute("data-job", String(id));
      b.textContent = "cancel";
      act.appendChild(b);
    }
    return row;
  }

  function render(jobs) {
    var body = document.getElementById("jobs-body");
    if (!body) return;
    var rows = document.createDocumentFragment();
    if (jobs.length === 0) {
      var empty = document.createElement("tr");
      empty.className = "empty";
      cell(empty, "No jobs yet.", "muted").colSpan = 11;
      rows.appendChild(empty);
    }
    jobs.forEach(function (j) { rows.appendChild(jobRow(j)); });
    body.replaceChildren(rows);
  }

  function jobsUrl() {
    var one = document.body.getAttribute("data-page") === "job" && document.body.getAttribute("data-job");
    return one ? "/v1/jobs/" + encodeURIComponent(one) : "/v1/jobs?limit=20";
  }

  function refresh() {
    var status = document.getElementById("jobs-status");
    return fetch(jobsUrl(), { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (data) {
        render(Array.isArray(data) ? data : [data]);
        if (status) status.textContent = "Updated " + new Date().toLocaleTimeString() + ".";
        document.body.setAttribute("data-jobs-polled", String(Date.now()));
      })
      .catch(function (e) {
        if (status) status.textContent = "Cannot reach the service (" + e.message + ").";
      });
  }

  function poll() {
    refresh().finally(function () { setTimeout(poll, POLL_MS); });
  }

  function token() {
    var input = document.getElementById("api-token");
    return input ? input.value : "";
  }

  function say(text) {
    var s = document.getElementById("cancel-status");
    if (s) s.textContent = text;
  }

  function cancel(id) {
    var headers = { Accept: "application/json" };
    var t = token();
    if (t) headers.Authorization = "Bearer " + t;
    say("cancelling job " + id + " ...");
    return fetch("/v1/jobs/" + encodeURIComponent(id) + "/cancel", { method: "POST", headers: headers })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          if (!r.ok) {
            var detail = body && body.detail;
            if (typeof detail !== "string") detail = detail && detail.message ? detail.message : "HTTP " + r.status;
            throw new Error(detail);
          }
          say("job " + id + " cancelled.");
        });
      })
      .catch(function (e) { say("cancel of job " + id + " refused: " + e.message); })
      .finally(refresh);
  }

  function setup() {
    var input = document.getElementById("api-token");
    if (input) {
      try { input.value = sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { /* storage off */ }
      input.addEventListener("input", function () {
        try { sessionStorage.setItem(TOKEN_KEY, input.value); } catch (e) { /* storage off */ }
      });
      var form = document.getElementById("token-form");
      if (form) form.addEventListener("submit", function (ev) { ev.preventDefault(); });
    }
    document.addEventListener("click", function (ev) {
      var b = ev.target.closest ? ev.target.closest("button.cancel") : null;
      if (b && cancelEnabled()) cancel(b.getAttribute("data-job"));
    });
    if (document.getElementById("jobs-body")) poll();
  }

  document.addEventListener("DOMContentLoaded", setup);
})();
