// Progressive enhancement of the lease view. Without JavaScript the page works the same; the
// Refresh link reloads it.
//
// Live: the server streams an event whenever the namespace's holders, waiters or counters
// change (GET /events, server-sent events from the live API's watches); the page then fetches
// its content again and puts it in place, without a reload, unless someone is using a control
// on it (then it waits). Where the stream is not available, an opt-in timer reloads the page.
(function () {
  "use strict";
  var label = document.getElementById("autorefresh");
  var box = document.getElementById("autorefresh-box");
  var live = document.getElementById("live");
  if (!label || !box) { return; }

  var idle = function () {
    var a = document.activeElement;
    return a === null || a === document.body || a === box || a === document.getElementById("main");
  };

  var streaming = false;
  if (window.EventSource && window.fetch && window.DOMParser && live) {
    var pending = false;
    var update = function () {
      if (!pending) { return; }
      if (document.visibilityState !== "visible" || !idle()) {
        window.setTimeout(update, 1000);
        return;
      }
      pending = false;
      window.fetch("/", { credentials: "same-origin", cache: "no-store" }).then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      }).then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        var cur = document.getElementById("main");
        if (next && cur) { cur.innerHTML = next.innerHTML; }
      }).catch(function () { /* the next change tries again; Refresh still works */ });
    };
    var events = new EventSource("/events");
    events.addEventListener("open", function () {
      streaming = true;
      live.hidden = false;
      label.hidden = true;
    });
    events.addEventListener("change", function () {
      pending = true;
      update();
    });
    events.addEventListener("error", function () {
      streaming = false;
      live.hidden = true;
      label.hidden = false;
    });
  }

  label.hidden = streaming;
  var key = "leaseViewAutoRefresh";
  try { box.checked = window.localStorage.getItem(key) === "on"; } catch (e) { /* storage off */ }
  box.addEventListener("change", function () {
    try { window.localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) { /* storage off */ }
  });
  window.setInterval(function () {
    // Not while live, nor while the page is hidden, nor while someone is using a control.
    if (!streaming && box.checked && document.visibilityState === "visible" && idle()) {
      window.location.reload();
    }
  }, 10000);
}());
