// Progressive enhancement of the lease view: an opt-in automatic refresh. Without
// JavaScript the page works the same; the Refresh link reloads it.
(function () {
  "use strict";
  var label = document.getElementById("autorefresh");
  var box = document.getElementById("autorefresh-box");
  if (!label || !box) { return; }
  var key = "leaseViewAutoRefresh";
  label.hidden = false;
  try { box.checked = window.localStorage.getItem(key) === "on"; } catch (e) { /* storage off */ }
  box.addEventListener("change", function () {
    try { window.localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) { /* storage off */ }
  });
  window.setInterval(function () {
    // Not while the page is hidden, nor while someone is using a control on it.
    if (box.checked && document.visibilityState === "visible" &&
        (document.activeElement === document.body || document.activeElement === box)) {
      window.location.reload();
    }
  }, 10000);
}());
