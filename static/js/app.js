// Small helpers for the run page's 2-second refresh (htmx polling of #run-body).
(function () {
  "use strict";

  // Do not replace the page under an operator who is typing a note or holding a form.
  window.orchestratorMayRefresh = function () {
    var body = document.getElementById("run-body");
    if (!body) return true;
    var active = document.activeElement;
    if (active && body.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return false;
    var notes = body.querySelectorAll("input[name=note]");
    for (var i = 0; i < notes.length; i++) {
      if (notes[i].value) return false;
    }
    return true;
  };

  // Keep expanded <details> (attempts, logs) open across refreshes.
  var open = [];
  document.addEventListener("htmx:beforeSwap", function () {
    open = Array.prototype.map.call(document.querySelectorAll("#run-body details[open][id]"), function (d) {
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
