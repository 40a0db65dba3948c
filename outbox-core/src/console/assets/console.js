// The outbox console's only script: "select all" and the count on the selection buttons.
// Everything works without it.
document.addEventListener("DOMContentLoaded", function () {
  var form = document.getElementById("dead-form");
  if (!form) return;
  var all = document.getElementById("select-all");
  var boxes = function () { return form.querySelectorAll("input[name=id]"); };
  var update = function () {
    var n = form.querySelectorAll("input[name=id]:checked").length;
    form.querySelectorAll("button.needs-selection").forEach(function (b) {
      b.disabled = n === 0;
      b.textContent = b.textContent.replace(/ selected.*$/, " selected" + (n ? " (" + n + ")" : ""));
    });
    if (all) {
      var total = boxes().length;
      all.checked = total > 0 && n === total;
      all.indeterminate = n > 0 && n < total;
    }
  };
  if (all) {
    all.addEventListener("change", function () {
      boxes().forEach(function (b) { b.checked = all.checked; });
      update();
    });
  }
  form.addEventListener("change", function (e) {
    if (e.target.name === "id") update();
  });
  update();
});
