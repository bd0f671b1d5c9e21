// amflow: a refused trigger or backfill, seen where the user is looking.
// amflow.trigger_refusal writes the reason in plain words; Airflow's dialog shows it in a
// red box at its top, while the user, at the Trigger button at the bottom of a dialog
// taller than the window, sees only a toast with the HTTP status ("Bad Request"). This
// scrolls the box into view and puts the reason's first line in that toast.
(function () {
  "use strict";
  var MARK = "This run was not triggered";
  var STATUS_ONLY = /^(Bad Request|Unprocessable Content|Validation Error)$/;
  var scrolled = new WeakSet();

  // the innermost element of an open dialog whose text starts with the refusal
  function reasonElement() {
    var path = '//*[@role="dialog"]//*[starts-with(normalize-space(.), "' + MARK + '")' +
      ' and not(*[starts-with(normalize-space(.), "' + MARK + '")])]';
    return document.evaluate(path, document, null,
      XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
  }

  function showReason() {
    var reason = reasonElement();
    if (!reason) return;
    var box = reason.closest('[role="alert"]') || reason;
    if (!scrolled.has(box)) {
      scrolled.add(box);
      box.scrollIntoView({block: "center"});
    }
    var first = reason.textContent.trim().split("\n")[0];
    document.querySelectorAll('[data-scope="toast"][data-part="description"]')
      .forEach(function (toast) {
        if (STATUS_ONLY.test(toast.textContent.trim())) {
          toast.textContent = first + " The reasons are at the top of the dialog.";
        }
      });
  }

  // at most once a frame, and only while a dialog is open: the pages poll and re-render
  var queued = false;
  function onChange() {
    if (queued || !document.querySelector('[role="dialog"]')) return;
    queued = true;
    requestAnimationFrame(function () { queued = false; showReason(); });
  }

  function start() {
    new MutationObserver(onChange).observe(document.body,
      {childList: true, subtree: true, characterData: true});
  }
  if (document.body) start(); else document.addEventListener("DOMContentLoaded", start);
})();
