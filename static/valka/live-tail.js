// Live tail of a RUNNING run's logs on the task page.
//
// Polls the REST logs endpoint once a second with the staff session cookie,
// asking only for lines after the last id shown, and stops (with a last fetch)
// once the task is no longer RUNNING. Served from the project's own static
// files: the page needs nothing from the internet.
(function () {
  "use strict";
  var PAGE = 500;

  function line(entry) {
    var div = document.createElement("div");
    div.className = "vk-log vk-log-" + entry.level;
    div.dataset.id = entry.id;
    var time = document.createElement("time");
    time.textContent = (entry.timestamp || "").slice(11, 23);
    var level = document.createElement("span");
    level.className = "lvl";
    level.textContent = entry.level;
    div.appendChild(time);
    div.appendChild(level);
    div.appendChild(document.createTextNode(entry.message));
    var meta = entry.metadata;
    if (meta && typeof meta === "object" && typeof meta.span_id === "string") {
      var traced = document.createElement("span");
      traced.className = "vk-log-span";
      traced.title = "trace " + meta.trace_id;
      traced.textContent = "span " + meta.span_id;
      div.appendChild(traced);
    }
    return div;
  }

  function getJSON(url) {
    return fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}}).then(function (r) {
      if (!r.ok) { throw new Error(r.status + " " + r.statusText); }
      return r.json();
    });
  }

  function tail(box) {
    var after = parseInt(box.dataset.after || "0", 10) || 0;
    var status = document.querySelector('[data-tail-status="' + box.dataset.runId + '"]');
    var stopped = false;

    function say(text, live) {
      if (!status) { return; }
      status.textContent = text;
      status.classList.toggle("live", !!live);
    }

    function fetchLines() {
      var url = box.dataset.logsUrl + "?limit=" + PAGE + (after ? "&after=" + after : "");
      return getJSON(url).then(function (page) {
        var results = page.results || [];
        if (results.length) {
          var empty = box.querySelector("[data-empty]");
          if (empty) { empty.remove(); }
          var atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
          results.forEach(function (entry) { box.appendChild(line(entry)); after = entry.id; });
          if (atBottom) { box.scrollTop = box.scrollHeight; }
        }
        return results.length === PAGE;  // a full page: more lines are waiting
      });
    }

    function tick() {
      if (stopped) { return; }
      fetchLines().then(function (more) {
        if (more) { return tick(); }
        return getJSON(box.dataset.taskUrl).then(function (task) {
          if (task.status === "RUNNING") {
            say("live", true);
            setTimeout(tick, 1000);
          } else {
            stopped = true;
            fetchLines().then(function () { say("run ended: task is " + task.status + " (reload for details)"); });
          }
        });
      }).catch(function (err) {
        say("live tail paused: " + err.message + "; retrying");
        setTimeout(tick, 3000);
      });
    }
    box.scrollTop = box.scrollHeight;
    tick();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-tail]").forEach(tail);
  });
})();
