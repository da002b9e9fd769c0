// Live jobs for the dashboard: polls /v1/jobs (the URL in the jobs table's data-poll, or one job
// on its page) and rewrites the jobs table; cancels a job and queues a tuning job (a kernel's
// page) with the bearer token the user typed (KS_API_TOKEN), which stays in this tab's
// sessionStorage; sorts the tables marked "sortable" by a click on a heading. Everything is
// written with textContent, so a job's fields can never become markup. The cells are the ones
// templates/_jobs.html renders on the server.
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
    var name = String(j.kernel);
    link(cell(row, ""), name.indexOf("helion:") === 0 ? "/helion?kernel=" + encodeURIComponent(name)
      : "/kernels/" + encodeURIComponent(name), name);
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
    if (one) return "/v1/jobs/" + encodeURIComponent(one);
    var body = document.getElementById("jobs-body");
    return body ? body.getAttribute("data-poll") : null;
  }

  function refresh() {
    var status = document.getElementById("jobs-status");
    var url = jobsUrl();
    if (!url) return Promise.resolve();
    return fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" })
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
    if (jobsUrl()) poll();
    setupSort();
    setupTune();
  }

  // ------------------------------------------------------------------ sortable tables

  // A cell's sort key: its data-value when it has one (numbers: latencies in us, ids), else its
  // text; empty values sort last either way.
  function sortKey(td, numeric) {
    if (!td) return null;
    var raw = td.hasAttribute("data-value") ? td.getAttribute("data-value") : td.textContent.trim();
    if (raw === "") return null;
    if (!numeric) return raw.toLowerCase();
    var v = Number(raw.replace(/,/g, ""));
    return isNaN(v) ? null : v;
  }

  function sortTable(table, th) {
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var numeric = th.getAttribute("data-sort") === "num";
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.filter.call(body.rows, function (r) { return !r.classList.contains("empty"); });
    rows.sort(function (a, b) {
      var x = sortKey(a.cells[col], numeric), y = sortKey(b.cells[col], numeric);
      if (x === y) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : 1) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  function setupSort() {
    document.querySelectorAll("table.sortable th[data-sort]").forEach(function (th) {
      th.tabIndex = 0;
      th.classList.add("sort");
      var table = th.closest("table");
      th.addEventListener("click", function () { sortTable(table, th); });
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sortTable(table, th); }
      });
    });
  }

  // ------------------------------------------------------------------ tune (a kernel's page)

  function tuneBody(form) {
    var chosen = document.getElementById("tune-case").value;
    return {
      kernel: form.getAttribute("data-kernel"),
      cases: chosen === "all" ? "all" : [JSON.parse(chosen)],
      n_trials: Number(document.getElementById("tune-trials").value),
      sampler: document.getElementById("tune-sampler").value
    };
  }

  // The shell commands the page shows, for the job the form would queue (dashboard._tune_commands).
  function showCommands(form) {
    var b = tuneBody(form);
    var auth = form.getAttribute("data-auth") === "on" ? ' -H "Authorization: Bearer $KS_API_TOKEN"' : "";
    var curl = document.getElementById("tune-curl");
    if (curl) {
      curl.textContent = "curl -X POST " + form.getAttribute("data-base") + "/v1/jobs -H 'Content-Type: application/json'" +
        auth + " -d '" + JSON.stringify(b).replace(/,"/g, ', "').replace(/":/g, '": ') + "'";
    }
    var cli = document.getElementById("tune-cli");
    if (cli) {
      var which = b.cases === "all" ? "--all" : "--case " + Object.keys(b.cases[0]).map(function (k) {
        return k + "=" + b.cases[0][k];
      }).join(",");
      cli.textContent = "kernelsearch tune " + b.kernel + " " + which + " --trials " + b.n_trials +
        (b.sampler !== "tpe" ? " --sampler " + b.sampler : "");
    }
  }

  function tuneSay(text, jobId) {
    var s = document.getElementById("tune-status");
    if (!s) return;
    s.textContent = text;
    if (jobId !== undefined) {
      s.appendChild(document.createTextNode(" "));
      var a = document.createElement("a");
      a.href = "/jobs/" + encodeURIComponent(jobId);
      a.textContent = "job " + jobId;
      s.appendChild(a);
    }
  }

  function setupTune() {
    var form = document.getElementById("tune-form");
    if (!form) return;
    ["tune-case", "tune-trials", "tune-sampler"].forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.addEventListener("input", function () { showCommands(form); });
      if (el) el.addEventListener("change", function () { showCommands(form); });
    });
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      if (form.getAttribute("data-auth") !== "on") return;
      var t = token();
      if (!t) {
        tuneSay("Enter the API token to queue from this page, or run the command below.");
        return;
      }
      tuneSay("queuing ...");
      fetch("/v1/jobs", {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/json", Authorization: "Bearer " + t },
        body: JSON.stringify(tuneBody(form))
      }).then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          if (!r.ok) {
            var detail = body && body.detail;
            if (typeof detail !== "string") detail = detail && detail.message ? detail.message : "HTTP " + r.status;
            throw new Error(detail);
          }
          tuneSay("Queued:", body.id);
        });
      }).catch(function (e) { tuneSay("Refused: " + e.message); });
    });
  }

  document.addEventListener("DOMContentLoaded", setup);
})();
