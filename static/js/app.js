// Small helpers for the pages' 2-second refreshes (htmx polling of #run-body, #task-body).
(function () {
  "use strict";

  // Do not replace a part of the page under an operator who is typing a note or has an action open.
  window.orchestratorMayRefresh = function (id) {
    var body = document.getElementById(id || "run-body");
    if (!body) return true;
    var active = document.activeElement;
    if (active && body.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return false;
    if (body.querySelector("details.confirm[open]")) return false;
    var notes = body.querySelectorAll("input[name=note]");
    for (var i = 0; i < notes.length; i++) {
      if (notes[i].value) return false;
    }
    return true;
  };

  // A refresh that was already on its way when the operator opened an action or typed a note
  // must not replace the form under them: drop that refresh (the next one comes in 2 s).
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var config = evt.detail.requestConfig || {};
    var target = evt.detail.target;
    if (config.verb === "get" && target && target.id && !window.orchestratorMayRefresh(target.id)) {
      evt.detail.shouldSwap = false;
    }
  });

  // Keep expanded <details> (attempts, logs) open across refreshes.
  var open = [];
  document.addEventListener("htmx:beforeSwap", function () {
    open = Array.prototype.map.call(document.querySelectorAll("details[open][id]:not(.confirm)"), function (d) {
      return d.id;
    });
  });
  document.addEventListener("htmx:afterSwap", function () {
    open.forEach(function (id) {
      var d = document.getElementById(id);
      if (d) d.open = true;
    });
  });
})();
