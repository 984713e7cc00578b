// The pages beside the chat (memory, tokens, support) wear the chat's theme: the one chosen with
// Chainlit's toggle (kept in localStorage "vite-ui-theme"), else the system's, as the chat does.
"use strict";

(function () {
  let theme = null;
  try {
    theme = window.localStorage.getItem("vite-ui-theme");
  } catch (e) {
    theme = null; // storage refused (privacy settings): follow the system
  }
  if (theme !== "light" && theme !== "dark") {
    theme = window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }
  document.documentElement.dataset.theme = theme;
})();
