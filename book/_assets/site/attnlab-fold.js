// Sections for researchers fold behind one labelled control. A chapter marks such a section with
//   <div class="attnlab-fold" data-summary="For researchers: ..."></div>
// right under its heading (an empty div: invisible in Jupyter and Colab, where everything stays open). On the
// site, everything after the marker in that section (prose, cells, subsections) moves into one closed
// <details class="attnlab-fold-box"> whose summary is the label; a link to an anchor inside opens it.
// A fold that covers part of a section only ends at <div class="attnlab-fold-end"></div>.
(function () {
  function fold() {
    document.querySelectorAll("div.attnlab-fold[data-summary]").forEach(function (marker) {
      var box = document.createElement("details"), summary = document.createElement("summary");
      box.className = "attnlab-fold-box";
      summary.textContent = marker.getAttribute("data-summary");
      box.appendChild(summary);
      for (var n = marker.nextSibling; n; n = marker.nextSibling) {
        if (n.nodeType === 1 && n.classList.contains("attnlab-fold-end")) { n.remove(); break; }
        box.appendChild(n);
      }
      marker.replaceWith(box);
    });
    openTarget();
  }
  function openTarget() {
    var id = decodeURIComponent(window.location.hash.slice(1)), target = id && document.getElementById(id);
    for (var e = target; e; e = e.parentElement) if (e.tagName === "DETAILS") e.open = true;
    if (target) target.scrollIntoView();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fold); else fold();
  window.addEventListener("hashchange", openTarget);
})();
