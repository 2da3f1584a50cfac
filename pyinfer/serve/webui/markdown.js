// A small Markdown renderer for model replies that builds DOM nodes and never parses HTML: every piece of the
// model's text reaches the page through textContent, so `<script>` or `<img onerror=…>` in a reply is shown as
// text. Covers what chat models write: fenced code, headings, lists, paragraphs, `code`, **bold**, *italic* and
// [links](https://…) (http and https only). A fence still open while streaming renders as code so far.
"use strict";

const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*|_[^_\s][^_\n]*_)|(\[[^\]\n]+\]\([^)\s]+\))/;

function appendInline(parent, text) {
  while (text) {
    const m = INLINE.exec(text);
    if (!m) { parent.appendChild(document.createTextNode(text)); return; }
    if (m.index) parent.appendChild(document.createTextNode(text.slice(0, m.index)));
    const tok = m[0];
    let node;
    if (m[1]) {
      node = document.createElement("code");
      node.textContent = tok.slice(1, -1);
    } else if (m[2]) {
      node = document.createElement("strong");
      appendInline(node, tok.slice(2, -2));
    } else if (m[3]) {
      node = document.createElement("em");
      appendInline(node, tok.slice(1, -1));
    } else {
      const close = tok.indexOf("](");
      const label = tok.slice(1, close), url = tok.slice(close + 2, -1);
      if (/^https?:\/\//i.test(url)) {
        node = document.createElement("a");
        node.href = url;  // a property, not markup: only http(s) URLs get here (no javascript:)
        node.rel = "noopener noreferrer nofollow";
        node.target = "_blank";
        node.textContent = label;
      } else {
        node = document.createTextNode(tok);
      }
    }
    parent.appendChild(node);
    text = text.slice(m.index + tok.length);
  }
}

function appendBlocks(parent, text) {
  let list = null, para = null;
  const endBlocks = () => { list = null; para = null; };
  for (const line of text.split("\n")) {
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    const item = /^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/.exec(line);
    if (!line.trim()) { endBlocks(); continue; }
    if (heading) {
      endBlocks();
      const h = document.createElement("h" + Math.min(6, heading[1].length + 2));  // replies sit under the page's
      appendInline(h, heading[2]);                                                  // own headings
      parent.appendChild(h);
    } else if (item) {
      para = null;
      const kind = item[1] ? "OL" : "UL";
      if (!list || list.tagName !== kind) { list = document.createElement(kind); parent.appendChild(list); }
      const li = document.createElement("li");
      appendInline(li, item[2]);
      list.appendChild(li);
    } else {
      list = null;
      if (para) para.appendChild(document.createElement("br"));
      else { para = document.createElement("p"); parent.appendChild(para); }
      appendInline(para, line);
    }
  }
}

// Replaces the children of `el` with `text` rendered.
function renderMarkdown(el, text) {
  el.replaceChildren();
  const parts = text.split(/^```[^\n]*$/m);  // even parts are prose, odd parts are code (the last may be unclosed)
  parts.forEach((part, i) => {
    if (i % 2) {
      const pre = document.createElement("pre"), code = document.createElement("code");
      code.textContent = part.replace(/^\n/, "").replace(/\n$/, "");
      pre.appendChild(code);
      el.appendChild(pre);
    } else {
      appendBlocks(el, part);
    }
  });
}
