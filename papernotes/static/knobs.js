// The static knob panel of the HTML book: every setting of the knobs was drawn when the chapter
// ran, and this script only swaps the picture that matches the controls. It is inlined in each
// panel by papernotes/knobs.py, so a panel needs nothing else: no kernel, no CDN, no require.js.
(function (panel) {
  if (!panel) return;
  var data = JSON.parse(panel.querySelector("script.pn-knob-data").textContent);
  var image = panel.querySelector("img.pn-knob-frame");
  // Each frame is stored once: the default's slot in the data is null, its picture is the <img>.
  var defaultSource = image.getAttribute("src");
  var controls = Array.prototype.slice.call(panel.querySelectorAll("[data-knob-control]"));

  function position(control) {
    return control.type === "checkbox" ? (control.checked ? 1 : 0) : Number(control.value);
  }

  function update() {
    var index = 0;
    controls.forEach(function (control, k) {
      var i = position(control);
      index = index * data.sizes[k] + i;
      panel.querySelector('[data-knob-readout="' + k + '"]').textContent = data.labels[k][i];
    });
    var frame = data.frames[index];
    image.src = frame === null ? defaultSource : "data:image/png;base64," + frame;
    image.setAttribute("data-frame", String(index));
  }

  controls.forEach(function (control) {
    control.addEventListener("input", update);
    control.addEventListener("change", update);
  });
  panel.classList.add("pn-knobs-ready");
})(document.currentScript && document.currentScript.parentElement);
