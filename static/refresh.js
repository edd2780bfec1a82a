// Progressive enhancement: pages marked data-refresh="N" reload their main
// content every N seconds while the tab is visible, no form field has
// focus and no disclosure (an action's form in a <details>) is open: a
// refresh must never take a form from under an operator about to fill
// it in. A page also marked data-live="PATH" listens there (Server-Sent
// Events) and reloads its main content as soon as a view it shows
// changes, at most once a second; the interval stays as the fallback.
// Without JavaScript the page is complete; reload it by hand.
(function () {
  "use strict";
  var main = document.querySelector("main[data-refresh]");
  if (!main || !window.fetch || !window.DOMParser) return;
  var every = parseInt(main.getAttribute("data-refresh"), 10) * 1000;
  if (!(every >= 5000)) return;
  var live = main.getAttribute("data-live");
  var loading = false, again = false;
  function busy() {
    var a = document.activeElement;
    return document.hidden || (a && /^(INPUT|SELECT|TEXTAREA|BUTTON|SUMMARY)$/.test(a.tagName)) ||
      main.querySelector("details[open]") !== null;
  }
  function refresh() {
    if (busy()) { again = true; return; }
    if (loading) { again = true; return; }
    loading = true; again = false;
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok && !r.redirected ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main[data-refresh]");
        if (fresh && !busy()) main.replaceWith(fresh), (main = fresh);
      })
      .catch(function () {})
      .then(function () {
        loading = false;
        if (again) setTimeout(refresh, 1000);
      });
  }
  setInterval(refresh, every);
  if (live && window.EventSource) {
    var events = new EventSource(live);
    events.addEventListener("change", refresh);
  }
})();
