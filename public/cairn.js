// Cairn additions to Chainlit's UI: "Delete conversation" in an open conversation's header,
// with the choice to also forget what was learned from it; Cairn's own sign-in entry.
"use strict";

(function () {
  const BUTTON_ID = "cairn-delete-conversation";

  function currentThread() {
    const match = window.location.pathname.match(/^\/thread\/([^/]+)\/?$/);
    return match ? decodeURIComponent(match[1]) : null;
  }

  function ensureButton() {
    const threadId = currentThread();
    const existing = document.getElementById(BUTTON_ID);
    const header = document.getElementById("header");
    if (!threadId || !header) {
      if (existing) existing.remove();
      return;
    }
    if (existing) return;
    const button = document.createElement("button");
    button.id = BUTTON_ID;
    button.type = "button";
    button.className = "cairn-header-button";
    button.title = "Delete conversation";
    const icon = document.createElement("span");
    icon.className = "cairn-icon cairn-icon-trash";
    icon.setAttribute("aria-hidden", "true");
    const label = document.createElement("span");
    label.className = "cairn-label";
    label.textContent = "Delete conversation";
    button.append(icon, label);
    button.addEventListener("click", openDialog);
    const right = header.lastElementChild || header;
    right.prepend(button);
  }

  function openDialog() {
    const threadId = currentThread();
    if (!threadId) return;
    const dialog = document.createElement("dialog");
    dialog.className = "cairn-dialog";
    dialog.id = "cairn-delete-dialog";
    const title = document.createElement("h2");
    title.textContent = "Delete this conversation?";
    const text = document.createElement("p");
    text.textContent =
      "Its messages and everything the agent saved for it are erased now. This cannot be undone.";
    const label = document.createElement("label");
    const forget = document.createElement("input");
    forget.type = "checkbox";
    forget.id = "cairn-also-forget";
    label.append(forget, " Also forget what Cairn learned from it");
    const error = document.createElement("p");
    error.className = "cairn-error";
    const actions = document.createElement("div");
    actions.className = "cairn-dialog-actions";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.textContent = "Cancel";
    cancel.addEventListener("click", () => dialog.remove());
    const confirm = document.createElement("button");
    confirm.type = "button";
    confirm.textContent = "Delete";
    confirm.className = "cairn-destructive";
    confirm.addEventListener("click", async () => {
      confirm.disabled = true;
      try {
        const response = await fetch(
          "/api/conversations/" + encodeURIComponent(threadId) + "/delete",
          {
            method: "POST",
            credentials: "same-origin",
            headers: { "Content-Type": "application/json", "X-Cairn-Request": "1" },
            body: JSON.stringify({ forget: forget.checked }),
          }
        );
        if (!response.ok) {
          const data = await response.json().catch(() => ({}));
          throw new Error(data.detail || "The conversation could not be deleted.");
        }
        window.location.href = "/";
      } catch (e) {
        error.textContent = e.message;
        confirm.disabled = false;
      }
    });
    actions.append(cancel, confirm);
    dialog.append(title, text, label, error, actions);
    document.body.append(dialog);
    dialog.showModal();
  }

  // Chainlit's UI moves a signed-out user to /login within the page; the server's /login is
  // Cairn's own sign-in entry (ui/chainlit/sign_in.py), so that address is loaded for real. A UI
  // that was itself served at /login (no such route in front of it) is left alone.
  const servedAt = window.location.pathname;
  function leaveChainlitLogin() {
    if (window.location.pathname === "/login" && servedAt !== "/login") {
      window.location.replace("/login" + window.location.search);
    }
  }
  for (const name of ["pushState", "replaceState"]) {
    const original = window.history[name];
    window.history[name] = function (...args) {
      const result = original.apply(this, args);
      leaveChainlitLogin();
      return result;
    };
  }
  window.addEventListener("popstate", leaveChainlitLogin);

  // The upload box refuses a file type with the browser library's own words ("File type must be
  // one of text/plain, text/markdown, text/csv"): say it as people name their files instead.
  const KINDS = {
    "text/plain": "text (.txt)",
    "text/markdown": "Markdown (.md)",
    "text/csv": "CSV (.csv)",
    "application/pdf": "PDF (.pdf)",
    "application/json": "JSON (.json)",
  };
  const REFUSED = /^File type must be (?:one of )?(.+)$/;
  function friendlier(node) {
    const match = REFUSED.exec((node.nodeValue || "").trim());
    if (!match) return;
    // The library lists MIME types and, when given, their extensions: name each kind once.
    const listed = match[1].split(/,\s*/).map((type) => type.trim()).filter(Boolean);
    const named = listed.filter((type) => KINDS[type]).map((type) => KINDS[type]);
    const others = listed.filter(
      (type) => !KINDS[type] && !named.some((kind) => kind.includes(`(${type})`))
    );
    const kinds = [...new Set([...named, ...others])];
    node.nodeValue =
      "Cairn cannot read that kind of file (images are not supported yet). You can attach " +
      kinds.join(", ") + ".";
  }
  function rewrite(root) {
    if (root.nodeType === Node.TEXT_NODE) return friendlier(root);
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) friendlier(walker.currentNode);
  }
  new MutationObserver((changes) => {
    for (const change of changes) {
      if (change.type === "characterData") friendlier(change.target);
      for (const node of change.addedNodes) rewrite(node);
    }
  }).observe(document.documentElement, { childList: true, subtree: true, characterData: true });

  // Enter in the sidebar's rename dialog confirms it, as in any one-field form (Chainlit's
  // dialog only has buttons). The confirm button is the last of the footer's buttons.
  document.addEventListener("keydown", (event) => {
    const input = event.target;
    if (event.key !== "Enter" || event.isComposing || event.shiftKey) return;
    if (!(input instanceof HTMLInputElement) || input.id !== "name") return;
    const dialog = input.closest('[role="dialog"]');
    if (!dialog || !input.value.trim()) return;
    const footer = [...dialog.querySelectorAll("div")].find(
      (div) => div.querySelectorAll(":scope > button").length >= 2
    );
    const buttons = footer ? footer.querySelectorAll(":scope > button") : [];
    if (!buttons.length) return;
    event.preventDefault();
    buttons[buttons.length - 1].click();
  });

  window.setInterval(ensureButton, 500);
})();
