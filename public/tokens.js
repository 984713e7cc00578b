// The access tokens page. Server values go in with textContent only (never innerHTML).
"use strict";

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "never");
const numberOrNull = (id) => ($(id).value ? Number($(id).value) : null);

function row(token) {
  const item = el("li", undefined, "token");
  item.dataset.id = token.id;
  item.append(el("div", `${token.name} (${token.hint})`, "text"));
  const state = token.revoked
    ? "revoked"
    : token.membership_ended
      ? "stopped: you are no longer a member of its workspace"
      : token.active
        ? "active"
        : "expired";
  item.append(
    el(
      "div",
      `${state} · acts in ${token.personal ? "your personal workspace" : token.workspace} · ` +
        `agents: ${token.scopes.join(", ")} · expires ${when(token.expires_at)} · ` +
        `last used ${when(token.last_used_at)} · ${token.max_concurrent} at once, ` +
        `${token.max_runs_per_hour}/hour, ${token.max_model_calls} model calls per run` +
        (token.pre_approve ? " · may pre-approve low-risk approvals" : ""),
      "meta",
    ),
  );
  if (!token.revoked) {
    const actions = el("div", undefined, "actions");
    const revoke = el("button", "Revoke", "revoke destructive");
    revoke.type = "button";
    revoke.addEventListener("click", async () => {
      try {
        await api("POST", `/api/tokens/${encodeURIComponent(token.id)}/revoke`);
        say(`Revoked ${token.name}.`);
        await load();
      } catch (error) {
        say(error.message, true);
      }
    });
    actions.append(revoke);
    item.append(actions);
  }
  return item;
}

// One checkbox per agent offered over MCP (all ticked), kept as the user left them on reload.
function scopeBoxes(agents) {
  const fieldset = $("token-scopes");
  if (fieldset.querySelector("input[name=scope]")) return;
  for (const agent of agents) {
    const label = el("label", undefined, "check");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.name = "scope";
    box.value = agent.scope;
    box.checked = true;
    label.append(box, ` ${agent.label}`);
    fieldset.append(label);
  }
}

async function load() {
  const data = await api("GET", "/api/tokens");
  $("endpoint").textContent = data.endpoint;
  $("token-workspace").textContent = data.workspace.personal
    ? "your personal workspace"
    : `the ${data.workspace.name} workspace`;
  scopeBoxes(data.agents);
  // Only agents whose questions can be pre-approved are named (none: no switch).
  $("preapprove-agents").textContent = data.pre_approvable.join(", ");
  $("preapprove-switch").hidden = !data.pre_approvable.length;
  $("token-days").max = data.limits.max_days;
  $("token-concurrent").placeholder = data.limits.max_concurrent;
  $("token-hourly").placeholder = data.limits.max_runs_per_hour;
  $("token-calls").placeholder = data.limits.max_model_calls;
  const list = $("tokens");
  list.replaceChildren(...data.tokens.map(row));
  if (!data.tokens.length) list.append(el("li", "No tokens yet.", "meta"));
}

$("create-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const scopes = [...document.querySelectorAll("input[name=scope]:checked")].map((i) => i.value);
  try {
    const made = await api("POST", "/api/tokens", {
      name: $("token-name").value,
      scopes,
      days: Number($("token-days").value),
      pre_approve: $("token-preapprove").checked,
      max_concurrent: numberOrNull("token-concurrent"),
      max_runs_per_hour: numberOrNull("token-hourly"),
      max_model_calls: numberOrNull("token-calls"),
    });
    $("new-token-value").textContent = made.token;
    $("new-token").hidden = false;
    say(`Created ${made.name}.`);
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

$("copy-token").addEventListener("click", async () => {
  const value = $("new-token-value").textContent;
  try {
    await navigator.clipboard.writeText(value);
    say("Token copied.");
  } catch (error) {
    // Clipboard refused (no permission, plain http): select it for a manual copy instead.
    window.getSelection().selectAllChildren($("new-token-value"));
    say("Select and copy the token by hand: the browser refused the clipboard.", true);
  }
});

load().catch((error) => say(error.message, true));
