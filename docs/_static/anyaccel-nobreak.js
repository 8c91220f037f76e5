/* Lines break between words only, never inside one, in tables, titles and code blocks: a browser may
   break "GPT-2", "2026-11-28" or "--index-url" after a hyphen (and a URL after a slash). Each such word
   (up to MAX characters; a longer one may still wrap where it must) is put in a span that does not wrap
   (.anyaccel-nobreak in anyaccel.css). The text stays as it was: copying a command copies what is shown.
   tests/test_site.py checks every page it looks at, at 1400 px and 400 px. */
(() => {
  const MAX = 30;
  // Sphinx's general and module index tables are left as they are: fixed columns that break anywhere
  const ZONES = "article table:not(.indextable):not(.domainindex-table), article h1, article h2, article h3, article h4, article pre";
  const BLOCKS = "td, th, p, li, dt, dd, h1, h2, h3, h4, pre, div";

  // the text nodes of the zones, grouped by the block they are laid out in (a cell, a title, a code block)
  function groups() {
    const byBlock = new Map();
    for (const zone of document.querySelectorAll(ZONES)) {
      const walker = document.createTreeWalker(zone, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        if (node.parentElement.closest(".headerlink, .anyaccel-nobreak, script, style")) continue;
        const block = node.parentElement.closest(BLOCKS);
        if (!byBlock.has(block)) byBlock.set(block, []);
        if (!byBlock.get(block).includes(node)) byBlock.get(block).push(node);
      }
    }
    return byBlock.values();
  }

  // the words of one block that can break inside: [start node, offset, end node, offset]
  function words(nodes) {
    const found = [];
    let text = "", starts = [];
    for (const node of nodes) { starts.push(text.length); text += node.textContent; }
    const at = (i) => { let k = starts.length - 1; while (starts[k] > i) k--; return [nodes[k], i - starts[k]]; };
    for (const m of text.matchAll(/\S{2,}/gu)) {
      if (m[0].length > MAX || !/[^\p{L}\p{N}]/u.test(m[0].slice(0, -1))) continue;
      found.push([...at(m.index), ...at(m.index + m[0].length - 1)]);
    }
    return found;
  }

  function keep() {
    for (const nodes of groups()) {
      for (const [startNode, start, endNode, end] of words(nodes).reverse()) {
        const range = document.createRange();
        range.setStart(startNode, start);
        range.setEnd(endNode, end + 1);
        const span = document.createElement("span");
        span.className = "anyaccel-nobreak";
        span.appendChild(range.extractContents());
        range.insertNode(span);
        // a word that starts or ends inside an element (".item()," starts in inline code) leaves that
        // element emptied beside the span: remove it, or it shows as an empty code box
        for (const side of [span.previousSibling, span.nextSibling]) {
          if (side && side.nodeType === Node.ELEMENT_NODE && side.textContent === "" && !side.querySelector("img, svg, br"))
            side.remove();
        }
      }
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", keep);
  else keep();
})();
