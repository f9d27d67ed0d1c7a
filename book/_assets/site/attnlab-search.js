// Sphinx's search skips every query term made only of digits, so "6%" (the paper's "6% rule") found
// nothing. On the search page, before the search reads the address, "6%" becomes "6% percent": the
// chapters spell the rule "6% (six percent)" where they introduce it.
(function () {
  if (!/\/search\.html$/.test(window.location.pathname)) return;
  var params = new URLSearchParams(window.location.search), q = params.get("q") || "";
  if (!/\d\s*%/.test(q) || /percent/i.test(q)) return;
  params.set("q", q.replace(/(\d+(?:\.\d+)?)\s*%/g, "$1% percent"));
  window.history.replaceState(null, "", window.location.pathname + "?" + params.toString() + window.location.hash);
})();
