// Exercises answered on the page with no kernel. attnlab.book.checks renders each checkable exercise as
//   <div class="attnlab-check" data-attnlab-check="number|choice"> hint, form, verdict, <script type=application/json>
// whose JSON holds the answer the chapter computed at build time (the number its solution prints), its
// tolerance and why. This script reads the learner's answer and says right or wrong, and why, in the
// aria-live verdict. The same rule as attnlab.book.checks.verdict.
(function () {
  function verdict(spec, box) {
    var ok;
    if (spec.kind === "number") {
      var text = box.querySelector("input").value.trim().replace(/,/g, "").replace(/%$/, "");
      var x = Number(text);
      if (text === "" || !isFinite(x)) return [false, "Type a number (e.g. 0.25)."];
      ok = Math.abs(x - spec.answer) <= spec.tol;
    } else {
      var picked = box.querySelector("input[type=radio]:checked");
      if (!picked) return [false, "Pick one of the options."];
      ok = Number(picked.value) === spec.answer;
    }
    return [ok, (ok ? "Right. " : "Not quite. ") + (ok ? spec.why : spec.wrong)];
  }
  function setup() {
    document.querySelectorAll("[data-attnlab-check]").forEach(function (box) {
      var spec = JSON.parse(box.querySelector("script[type='application/json']").textContent);
      var form = box.querySelector("form"), out = box.querySelector(".attnlab-check-verdict");
      form.removeAttribute("onsubmit");
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        var v = verdict(spec, box);
        out.textContent = v[1];
        out.className = "attnlab-check-verdict " + (v[0] ? "attnlab-check-right" : "attnlab-check-wrong");
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setup); else setup();
})();
