// Tracebacks in ```pycon blocks: Pygments marks only the "Traceback" line (.gt) and the error
// name (.gr); the rest of the traceback is ordinary text. Mark everything from a .gt up to the
// next >>> prompt (.gp) as output (.go), so that css/copy.css hides it from the copy button too.
document$.subscribe(function () {
  document.querySelectorAll(".language-pycon code").forEach(function (code) {
    let output = false;
    Array.from(code.childNodes).forEach(function (node) {
      const isElement = node.nodeType === Node.ELEMENT_NODE;
      if (isElement && node.classList.contains("gp")) output = false;
      if (isElement && node.classList.contains("gt")) output = true;
      if (!output) return;
      if (isElement) {
        node.classList.add("go");
      } else if (node.nodeType === Node.TEXT_NODE) {
        const span = document.createElement("span");
        span.className = "go";
        node.replaceWith(span);
        span.appendChild(node);
      }
    });
  });
});
