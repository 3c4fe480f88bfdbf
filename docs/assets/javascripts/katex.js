// Typesets the math pymdownx.arithmatex marked (generic mode): inline as
// <span class="arithmatex">\(...\)</span>, display as <div class="arithmatex">\[...\]</div>.
// Runs on every page Material loads (document$ also fires on instant navigation).
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex")) {
    const tex = element.textContent.trim();
    katex.render(tex.slice(2, -2), element, {
      displayMode: element.tagName === "DIV",
      throwOnError: false, // a TeX error shows in red where it is, the rest of the page renders
    });
  }
});
