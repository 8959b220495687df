// The admin's Events page: subscribe to /api/v1/events (SSE) and prepend each event to the table.
(function () {
  "use strict";
  const table = document.getElementById("vk-events");
  if (!table) return;
  const body = table.querySelector("tbody");
  const state = document.getElementById("vk-events-state");
  const taskUrl = table.dataset.taskUrl;
  const KEEP = 500;

  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text == null ? "" : String(text);
    if (cls) td.className = cls;
    return td;
  }

  function badge(status) {
    const td = document.createElement("td");
    if (status) {
      const span = document.createElement("span");
      span.className = "vk-badge vk-badge-" + status.toLowerCase();
      span.textContent = status;
      td.appendChild(span);
    }
    return td;
  }

  function show(event) {
    const tr = document.createElement("tr");
    tr.appendChild(cell(new Date(event.timestamp_ms).toLocaleTimeString()));
    const taskCell = document.createElement("td");
    const link = document.createElement("a");
    link.href = taskUrl.replace("00000000-0000-0000-0000-000000000000", event.task_id);
    link.textContent = event.task_id;
    taskCell.appendChild(link);
    tr.appendChild(taskCell);
    tr.appendChild(cell(event.queue_name));
    tr.appendChild(badge(event.previous_status));
    tr.appendChild(badge(event.new_status));
    tr.appendChild(cell(event.attempt_number));
    tr.appendChild(cell(event.worker_id));
    tr.appendChild(cell(event.node_id));
    tr.appendChild(cell(event.error_message, "vk-error"));
    body.insertBefore(tr, body.firstChild);
    while (body.rows.length > KEEP) body.deleteRow(body.rows.length - 1);
  }

  const source = new EventSource(table.dataset.stream, { withCredentials: true });
  source.addEventListener("open", function () { state.textContent = "live"; });
  source.addEventListener("error", function () { state.textContent = "reconnecting…"; });
  source.addEventListener("task", function (message) { show(JSON.parse(message.data)); });
  source.addEventListener("lagged", function () { state.textContent = "reconnecting (this page fell behind)"; });
})();
