// attnlab book: loaded after require.js and before embed-amd.js (see nb_ipywidgets_js in _config.yml).
// Copied to _static/attnlab/ by scripts/vendor_assets.py.
(function () {
  "use strict";
  // Folder this script was served from (.../_static/attnlab/), whatever the page depth.
  var here = document.currentScript && document.currentScript.src;
  var base = here ? here.slice(0, here.lastIndexOf("/") + 1) : "_static/attnlab/";

  // 1. Font Awesome: embed-amd.js finds its font files next to the URL require.js gives its module
  //    "@jupyter-widgets/html-manager/dist/libembed-amd"; point that module path at our copy.
  if (window.require && window.require.config) {
    window.require.config({ paths: { "@jupyter-widgets/html-manager/dist": base + "widgets" } });
  }

  // 2. @jupyter-widgets/base typesets descriptions with the MathJax 2 API
  //    (MathJax.Hub.Queue(["Typeset", MathJax.Hub, element])); map it onto MathJax 3.
  function queue() {
    var elements = [];
    for (var i = 0; i < arguments.length; i++) {
      var job = arguments[i];
      if (Array.isArray(job) && job[0] === "Typeset" && job[2]) elements.push(job[2]);
    }
    if (!elements.length) return;
    var mj = window.MathJax;
    // Before MathJax 3 has loaded (only its configuration object exists), wait for the page load.
    var ready = mj && mj.startup && mj.startup.promise ? mj.startup.promise
      : new Promise(function (resolve) { window.addEventListener("load", resolve); });
    ready.then(function () {
      var m = window.MathJax;
      if (m && typeof m.typesetPromise === "function") return m.typesetPromise(elements);
    }).catch(function (err) {
      console.warn("attnlab: MathJax typeset of a widget description failed", err);
    });
  }
  var hub = { Queue: queue };
  function withHub(value) {
    // The shim is non-enumerable, so MathJax never reads it as a configuration key.
    if (value && typeof value === "object" && !value.Hub) {
      Object.defineProperty(value, "Hub", { value: hub, configurable: true, enumerable: false });
    }
    return value;
  }
  // MathJax 3 replaces window.MathJax when it loads: catch that assignment.
  var current = window.MathJax;
  try {
    Object.defineProperty(window, "MathJax", {
      configurable: true,
      enumerable: true,
      get: function () { return current; },
      set: function (value) { current = withHub(value); },
    });
  } catch (err) {
    console.warn("attnlab: cannot install the MathJax 2 shim", err);
  }
  withHub(current);
})();
