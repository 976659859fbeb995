// Figures of several panels side by side, on a narrow screen: mark them (a picture much wider
// than tall), so that papernotes.css keeps them at a legible size in a container that scrolls
// sideways, instead of shrinking every label below reading size.
(function () {
  // A container that scrolls must be reachable by the keyboard too (a tab stop, named).
  function reachable(container) {
    if (container.scrollWidth > container.clientWidth + 1) {
      container.setAttribute("tabindex", "0");
      container.setAttribute("role", "region");
      container.setAttribute("aria-label", "figure: scroll sideways to see every panel");
    } else if (container.getAttribute("role") === "region") {
      container.removeAttribute("tabindex");
      container.removeAttribute("role");
      container.removeAttribute("aria-label");
    }
  }
  // The box that scrolls: the nearest one around the picture that lets its content overflow.
  function scroller(image) {
    for (var box = image.parentElement; box; box = box.parentElement) {
      var overflow = getComputedStyle(box).overflowX;
      if (overflow === "auto" || overflow === "scroll") return box;
      if (box.classList.contains("cell_output")) return box;
    }
    return null;
  }
  function mark(image) {
    if (image.naturalHeight > 0 && image.naturalWidth / image.naturalHeight >= 1.8) {
      image.classList.add("pn-wide-figure");
      var container = scroller(image);
      if (container) {
        reachable(container);
        window.addEventListener("resize", function () { reachable(container); });
      }
    }
  }
  function markAll() {
    document.querySelectorAll(".cell_output img").forEach(function (image) {
      if (image.complete) mark(image);
      else image.addEventListener("load", function () { mark(image); });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", markAll);
  else markAll();
})();
