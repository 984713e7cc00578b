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
    headerButton(header, BUTTON_ID, "Delete conversation", "Delete conversation", "trash", openDialog);
  }

  // A button at the start of the header's right-hand group: an icon, and a label that a
  // phone's width hides (public/cairn.css) but screen readers and the tooltip keep.
  function headerButton(header, id, text, title, icon, onClick) {
    const button = document.createElement("button");
    button.id = id;
    button.type = "button";
    button.className = "cairn-header-button";
    button.title = title;
    const mark = document.createElement("span");
    mark.className = "cairn-icon cairn-icon-" + icon;
    mark.setAttribute("aria-hidden", "true");
    const label = document.createElement("span");
    label.className = "cairn-label";
    label.textContent = text;
    button.append(mark, label);
    button.addEventListener("click", onClick);
    (header.lastElementChild || header).prepend(button);
    return button;
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

  // "Share" in a team conversation's header: a read-only link for the team (auth/shares.py).
  // Shown only when the server says the conversation is the user's and belongs to a team.
  const SHARE_ID = "cairn-share-conversation";
  let shareChecked = null;
  async function ensureShareButton() {
    const threadId = currentThread();
    const existing = document.getElementById(SHARE_ID);
    const header = document.getElementById("header");
    if (!threadId || !header) {
      if (existing) existing.remove();
      shareChecked = null;
      return;
    }
    if (shareChecked === threadId) return;
    shareChecked = threadId;
    if (existing) existing.remove();
    const response = await fetch(
      "/api/threads/" + encodeURIComponent(threadId) + "/sharing",
      { credentials: "same-origin" }
    ).catch(() => null);
    const data = response && response.ok ? await response.json().catch(() => null) : null;
    if (!data || !data.shareable || currentThread() !== threadId) return;
    headerButton(header, SHARE_ID, "Share", "Share with your team", "share", () =>
      openShareDialog(threadId, data.shares, data.members || [])
    );
  }

  function openShareDialog(threadId, existing, members) {
    const dialog = document.createElement("dialog");
    dialog.className = "cairn-dialog";
    dialog.id = "cairn-share-dialog";
    const title = document.createElement("h2");
    title.textContent = "Share this conversation with your team?";
    const text = document.createElement("p");
    text.textContent =
      "Members of the team who sign in can read it; nobody else. Memory notes, recall details " +
      "and attachments stay hidden unless you include them. You can revoke the link on the " +
      "Memory & data page.";
    const options = document.createElement("div");
    const boxes = {};
    for (const [key, name] of [
      ["memory_notes", "Include memory notes"],
      ["attachments", "Include attachments"],
    ]) {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      boxes[key] = box;
      label.append(box, " " + name);
      options.append(label, document.createElement("br"));
    }
    // With whom: the whole team, or the members ticked here.
    const audience = document.createElement("fieldset");
    const legend = document.createElement("legend");
    legend.textContent = "Share with (none ticked: the whole team)";
    audience.append(legend);
    const chosen = [];
    for (const member of members) {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.value = member.user_id;
      chosen.push(box);
      label.append(box, " " + member.name);
      audience.append(label, document.createElement("br"));
    }
    if (members.length) options.append(audience);
    const link = document.createElement("p");
    link.className = "cairn-share-link";
    if (existing && existing.length) link.textContent = "Already shared: " + location.origin + existing[0];
    const error = document.createElement("p");
    error.className = "cairn-error";
    const actions = document.createElement("div");
    actions.className = "cairn-dialog-actions";
    const close = document.createElement("button");
    close.type = "button";
    close.textContent = "Close";
    close.addEventListener("click", () => dialog.remove());
    const share = document.createElement("button");
    share.type = "button";
    share.textContent = "Share";
    share.addEventListener("click", async () => {
      share.disabled = true;
      error.textContent = "";
      try {
        const response = await fetch("/api/threads/" + encodeURIComponent(threadId) + "/shares", {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": "application/json", "X-Cairn-Request": "1" },
          body: JSON.stringify({
            audience: chosen.some((box) => box.checked) ? "members" : "workspace",
            members: chosen.filter((box) => box.checked).map((box) => box.value),
            include: {
              memory_notes: boxes.memory_notes.checked,
              attachments: boxes.attachments.checked,
            },
          }),
        });
        const made = await response.json().catch(() => ({}));
        if (!response.ok) throw new Error(made.detail || "The conversation could not be shared.");
        const url = location.origin + made.url;
        link.textContent = "Shared. Link: " + url;
        shareChecked = null;
        navigator.clipboard?.writeText(url).catch(() => {});
      } catch (e) {
        error.textContent = e.message;
      } finally {
        share.disabled = false;
      }
    });
    actions.append(close, share);
    dialog.append(title, text, options, link, error, actions);
    document.body.append(dialog);
    dialog.showModal();
  }

  // The server ended this session (signed out elsewhere, disabled in a team, account wiped):
  // Chainlit relays its last word to the page as a window message; go to the sign-in page
  // rather than sit on a chat that can no longer connect.
  window.addEventListener("message", (event) => {
    if (event.origin !== window.location.origin || event.source !== window) return;
    if (event.data && event.data.cairn === "signed_out") window.location.replace("/login");
  });

  window.setInterval(ensureButton, 500);
  window.setInterval(() => ensureShareButton().catch(() => {}), 1000);
})();
