// Live job progress for the dashboard: polls /v1/jobs and rewrites the jobs table.
// Everything is written with textContent, so a job's fields can never become markup.
(function () {
  "use strict";
  var POLL_MS = 2000;

  function cell(row, text, cls) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function casesLabel(cases) {
    if (!Array.isArray(cases)) return "";
    var parts = cases.slice(0, 4).map(function (c) {
      return Object.keys(c).sort().map(function (k) { return k + "=" + c[k]; }).join(", ");
    });
    var more = cases.length > 4 ? " (+" + (cases.length - 4) + ")" : "";
    return parts.join("; ") + more;
  }

  function render(jobs) {
    var body = document.getElementById("jobs-body");
    if (!body) return;
    var rows = document.createDocumentFragment();
    if (jobs.length === 0) {
      var empty = document.createElement("tr");
      empty.className = "empty";
      var td = cell(empty, "No jobs yet.", "muted");
      td.colSpan = 8;
      rows.appendChild(empty);
    }
    jobs.forEach(function (j) {
      var nCases = Array.isArray(j.cases) ? j.cases.length : 0;
      var total = Math.max(1, (j.n_trials || 0) * Math.max(1, nCases));
      var row = document.createElement("tr");
      row.setAttribute("data-job", String(j.id));
      row.className = "status-" + String(j.status).replace(/[^a-z]/g, "");
      cell(row, j.id);
      cell(row, j.status);
      cell(row, j.kernel);
      cell(row, casesLabel(j.cases));
      var p = document.createElement("progress");
      p.max = 100;
      p.value = Math.min(100, 100 * (j.trials_done || 0) / total);
      var ptd = document.createElement("td");
      ptd.appendChild(p);
      row.appendChild(ptd);
      cell(row, (j.trials_done || 0) + " / " + (j.n_trials || 0) * nCases);
      cell(row, j.device);
      cell(row, j.error, "error");
      rows.appendChild(row);
    });
    body.replaceChildren(rows);
  }

  function poll() {
    var status = document.getElementById("jobs-status");
    fetch("/v1/jobs?limit=20", { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (jobs) {
        render(jobs);
        if (status) status.textContent = "Updated " + new Date().toLocaleTimeString() + ".";
        document.body.setAttribute("data-jobs-polled", String(Date.now()));
      })
      .catch(function (e) {
        if (status) status.textContent = "Cannot reach the service (" + e.message + ").";
      })
      .finally(function () { setTimeout(poll, POLL_MS); });
  }

  document.addEventListener("DOMContentLoaded", poll);
})();
