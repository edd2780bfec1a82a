// Progressive enhancement: pages marked data-refresh="N" reload their main
// content every N seconds while the tab is visible and no form field has
// focus. Without JavaScript the page is complete; reload it by hand.
(function () {
  "use strict";
  var main = document.querySelector("main[data-refresh]");
  if (!main || !window.fetch || !window.DOMParser) return;
  var every = parseInt(main.getAttribute("data-refresh"), 10) * 1000;
  if (!(every >= 5000)) return;
  function busy() {
    var a = document.activeElement;
    return document.hidden || (a && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(a.tagName));
  }
  setInterval(function () {
    if (busy()) return;
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok && !r.redirected ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main[data-refresh]");
        if (fresh && !busy()) main.replaceWith(fresh), (main = fresh);
      })
      .catch(function () {});
  }, every);
})();
