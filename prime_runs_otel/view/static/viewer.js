// prime-runs-otel viewer: the one script of the pages. Pages work without it;
// with it, a page of a run still recording (and the runs list) follows the
// run live, polling a small JSON status and swapping in the server's own
// HTML; the runs list (an empty store too) loads again when a run arrives.
"use strict";

(function () {
  const every = 2000;
  const status = document.getElementById("live-status");

  const source = document.body.dataset.live;
  if (!source) return;
  let last = null;

  function setText(root, field, value) {
    const element = root.querySelector('[data-field="' + field + '"]');
    if (element && value !== undefined && value !== null) element.textContent = String(value);
  }

  async function refreshPart() {
    const part = document.getElementById("live-part");
    if (!part) return;
    const url = new URL(window.location.href);
    url.searchParams.set("part", "live");
    const answer = await fetch(url, { headers: { Accept: "text/html" } });
    if (answer.ok) {
      part.innerHTML = await answer.text();
      document.dispatchEvent(new CustomEvent("viewer:redrawn"));
    }
  }

  async function poll() {
    try {
      const answer = await fetch(source, { headers: { Accept: "application/json" } });
      if (!answer.ok) throw new Error("status " + answer.status);
      const found = await answer.json();
      const runs = Array.isArray(found) ? found : [found];
      let recording = false;
      for (const run of runs) {
        const row = Array.isArray(found)
          ? document.querySelector('tr[data-run="' + CSS.escape(run.id) + '"]')
          : document;
        if (row) {
          setText(row, "episodes", run.episodes);
          setText(row, "pending", run.pending);
          setText(row, "not_pushed", run.not_pushed);
          setText(row, "status", run.status);
          setText(row, "state", run.state);
        }
        if (run.state === "recording" || run.unread > 0) recording = true;
      }
      if (Array.isArray(found)) {
        const shown = document.querySelectorAll("tr[data-run]").length;
        if (found.length !== shown) {
          window.location.reload();
          return;
        }
      } else {
        const key = found.episodes + "/" + found.state + "/" + found.unread;
        if (last !== null && key !== last) await refreshPart();
        last = key;
      }
      status.textContent = (recording ? "live · " : "") + "updated " + new Date().toLocaleTimeString();
      if (recording || Array.isArray(found)) window.setTimeout(poll, every);
    } catch (error) {
      status.textContent = "viewer unreachable (" + error.message + "); retrying";
      window.setTimeout(poll, every * 2);
    }
  }

  poll();
})();
