// The support view's fork form. The page is made on the server with every value escaped; this
// script only fills the form and posts it as JSON with the page's request header (CSRF check).
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("fork");
  if (!form) return;
  const field = document.getElementById("fork-field");
  const text = document.getElementById("fork-text");
  const status = document.getElementById("fork-status");
  const prefill = JSON.parse(form.dataset.prefill || "{}");
  const fill = () => { text.value = prefill[field.value] || ""; };
  field.addEventListener("change", fill);
  fill();
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    status.textContent = "Forking…";
    const body = {
      field: field.value,
      text: text.value,
      path: document.getElementById("fork-path").value,
      reason: document.getElementById("fork-reason").value,
    };
    try {
      const response = await fetch(form.dataset.url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Cairn-Request": "1" },
        body: JSON.stringify(body),
      });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) {
        const detail = typeof data.detail === "string" ? data.detail : "The fork was refused.";
        throw new Error(detail);
      }
      status.textContent = "Forked (" + data.status + "): new checkpoint " + data.new_checkpoint_id;
      status.dataset.newCheckpoint = data.new_checkpoint_id || "";
      status.dataset.reply = data.reply || "";
    } catch (error) {
      status.textContent = error.message;
      status.classList.add("error");
    }
  });
});
