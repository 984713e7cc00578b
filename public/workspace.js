// The workspaces page. Server values go in with textContent only (never innerHTML).
"use strict";

let current = null;

function button(text, onClick, className) {
  const node = el("button", text, className);
  node.type = "button";
  node.addEventListener("click", async () => {
    node.disabled = true;
    try {
      await onClick();
    } catch (error) {
      say(error.message, true);
    } finally {
      node.disabled = false;
    }
  });
  return node;
}

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
const path = (...parts) => "/api/workspaces/" + parts.map(encodeURIComponent).join("/");

function memberRow(member, data) {
  const item = el("li");
  item.dataset.user = member.user_id;
  item.append(el("div", member.name, "text"));
  const state = member.disabled ? " · disabled" : "";
  item.append(el("div", `${member.role}${state} · joined ${when(member.joined_at)}`, "meta"));
  const mine = member.user_id === data.me;
  if (data.manages && !mine) {
    const actions = el("div", undefined, "actions");
    const role = document.createElement("select");
    role.setAttribute("aria-label", `Role of ${member.name}`);
    for (const name of data.roles) role.append(new Option(name, name, false, name === member.role));
    role.addEventListener("change", async () => {
      try {
        await api("POST", path(current.id, "members", member.user_id, "role"), { role: role.value });
        say(`${member.name} is now ${role.value}.`);
      } catch (error) {
        say(error.message, true);
      }
      await load();
    });
    actions.append(role);
    const disable = member.disabled ? "Enable" : "Disable";
    actions.append(
      button(
        disable,
        async () => {
          await api("POST", path(current.id, "members", member.user_id, "disable"), {
            disabled: !member.disabled,
          });
          say(member.disabled ? `${member.name} is enabled.` : `${member.name} is disabled; their sessions ended.`);
          await load();
        },
        member.disabled ? "" : "destructive",
      ),
    );
    item.append(actions);
  }
  return item;
}

function inviteRow(invite) {
  const item = el("li");
  const state = invite.expired ? "expired" : `expires ${when(invite.expires_at)}`;
  item.append(el("div", `${invite.role} · made ${when(invite.created_at)} · ${state}`, "meta"));
  const actions = el("div", undefined, "actions");
  actions.append(
    button(
      "Revoke",
      async () => {
        await api("POST", path(current.id, "invites", invite.id, "revoke"));
        say("Invitation revoked.");
        await load();
      },
      "destructive",
    ),
  );
  item.append(actions);
  return item;
}

// A Delete button for a manager: asks first, then reloads the page's lists.
function deleteButton(question, route, done) {
  const actions = el("div", undefined, "actions");
  actions.append(
    button(
      "Delete",
      async () => {
        if (!window.confirm(question)) return;
        await api("DELETE", route);
        say(done);
        await load();
      },
      "destructive",
    ),
  );
  return actions;
}

function galleryRow(entry, canDelete) {
  const item = el("li");
  item.append(el("div", entry.goal, "text"));
  const steps = el("ol");
  for (const step of entry.steps) steps.append(el("li", step));
  item.append(steps);
  item.append(el("div", `${entry.outcome} · by a member · ${when(entry.at)}`, "meta"));
  if (canDelete) {
    item.append(
      deleteButton(
        "Delete this plan from the team's gallery? It is not shown again.",
        path(current.id, "gallery", entry.key),
        "Plan deleted from the gallery.",
      ),
    );
  }
  return item;
}

function sourceRow(source, canDelete) {
  const item = el("li");
  item.append(el("div", source.source, "text"));
  const shown = `${source.passed}/${source.total} quoted excerpts verified · last cited ${source.last}`;
  item.append(el("div", shown, "meta"));
  if (canDelete) {
    item.append(
      deleteButton(
        "Delete what the team learned about this source? It is not counted again from pages already read.",
        path(current.id, "sources", source.id),
        "Source rating deleted.",
      ),
    );
  }
  return item;
}

// A list of the team's (the gallery, the sources) with its empty line.
async function loadList(id, route, key, row, empty) {
  const found = await api("GET", route);
  $(id).replaceChildren(...found[key].map((item) => row(item, found.can_delete)));
  if (!found[key].length) $(id).append(el("li", empty, "meta"));
}

const loadGallery = () =>
  loadList("gallery", path(current.id, "gallery"), "entries", galleryRow, "No approved plans yet.");
const loadSources = () =>
  loadList(
    "sources",
    path(current.id, "sources"),
    "sources",
    sourceRow,
    "Nothing learned about sources yet.",
  );

function auditRow(entry) {
  const item = el("li");
  const who = entry.actor || "Cairn";
  const about = entry.subject && entry.subject !== entry.actor ? ` → ${entry.subject}` : "";
  item.append(el("div", `${entry.action}: ${who}${about}`, "text"));
  const detail = Object.keys(entry.detail || {}).length ? ` · ${JSON.stringify(entry.detail)}` : "";
  item.append(el("div", `${when(entry.at)}${detail}`, "meta"));
  return item;
}

function showLimits(limits) {
  if (!limits) return;
  const { budget, month } = limits;
  const of = (used, cap, fmt) => (cap ? `${fmt(used)} of ${fmt(cap)}` : `${fmt(used)} (no budget)`);
  const tokens = (n) => n.toLocaleString();
  const cost = (n) => n.toFixed(4);
  $("team-month").textContent =
    `Team: ${month.runs} runs · ${of(month.tokens, budget.tokens, tokens)} tokens · ` +
    `${of(month.cost, budget.cost, cost)} estimated` +
    (limits.max_runs ? ` · at most ${limits.max_runs} runs at once` : "");
  $("limit-tokens").value = budget.tokens ?? "";
  $("limit-cost").value = budget.cost ?? "";
  $("limit-runs").value = limits.max_runs ?? "";
}

const numberOrNull = (id) => ($(id).value === "" ? null : Number($(id).value));

async function load() {
  const data = await api("GET", "/api/workspaces");
  current = data.active;
  const select = $("switch");
  select.replaceChildren(
    ...data.workspaces.map(
      (w) => new Option(w.personal ? "Personal" : `${w.name} (${w.role})`, w.id, false, w.id === current.id),
    ),
  );
  $("invite-role").replaceChildren(...data.invitable.map((r) => new Option(r, r, false, r === "member")));
  $("team").hidden = current.personal;
  $("gallery-section").hidden = current.personal;
  $("sources-section").hidden = current.personal;
  $("manage").hidden = current.personal || !["owner", "admin"].includes(current.role);
  if (current.personal) return;
  const details = await api("GET", path(current.id));
  const manages = !$("manage").hidden;
  $("team-name-shown").textContent = current.name;
  $("reviewer-link").hidden = current.role !== "reviewer";
  const view = { manages, roles: data.roles, me: details.me };
  $("members").replaceChildren(...details.members.map((m) => memberRow(m, view)));
  await loadGallery();
  await loadSources();
  if (!manages) return;
  const agents = $("review-agents");
  agents.querySelectorAll("label").forEach((label) => label.remove());
  for (const agent of details.review.agents) {
    const label = el("label", undefined, "check");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.name = "review";
    box.value = agent.key;
    box.checked = Boolean(details.review.required[agent.key]);
    label.append(box, ` ${agent.profile}`);
    agents.append(label);
  }
  $("retention-days").value = details.retention_days ?? "";
  const invites = details.invites || [];
  $("invites").replaceChildren(...invites.map(inviteRow));
  if (!invites.length) $("invites").append(el("li", "No invitations waiting.", "meta"));
  $("usage").replaceChildren(
    ...(details.usage || []).map((u) =>
      el("li", `${u.name}: ${u.runs} runs · ${u.tokens} tokens · ${u.cost.toFixed(4)}`, "meta"),
    ),
  );
  showLimits(details.limits);
  const log = await api("GET", path(current.id, "audit"));
  $("audit").replaceChildren(...log.entries.map(auditRow));
}

$("switch").addEventListener("change", async () => {
  try {
    const chosen = await api("POST", "/api/workspaces/switch", { workspace_id: $("switch").value });
    say(`Working in ${chosen.active.personal ? "your personal workspace" : chosen.active.name}.`);
    $("new-invite").hidden = true;
  } catch (error) {
    say(error.message, true);
  }
  await load().catch((error) => say(error.message, true));
});

$("create-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    const made = await api("POST", "/api/workspaces", { name: $("team-name").value });
    $("team-name").value = "";
    say(`Created ${made.active.name}; you are working in it.`);
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

$("join-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    const joined = await api("POST", "/api/workspaces/join", { code: $("join-code").value });
    $("join-code").value = "";
    say(`You joined ${joined.active.name} as ${joined.active.role}.`);
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

$("invite-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    const made = await api("POST", path(current.id, "invites"), {
      role: $("invite-role").value,
      days: Number($("invite-days").value),
    });
    $("new-invite-link").textContent = made.link;
    $("new-invite").hidden = false;
    say(`Invitation for a ${made.role} made.`);
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

$("retention-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = $("retention-days").value;
  try {
    const saved = await api("POST", path(current.id, "retention"), {
      days: value === "" ? null : Number(value),
    });
    say(
      saved.retention_days
        ? `The team's inactive conversations are deleted after ${saved.retention_days} days.`
        : "Each member's own retention applies to the team's conversations.",
    );
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

$("review-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const review = {};
  for (const box of document.querySelectorAll("input[name=review]")) review[box.value] = box.checked;
  try {
    await api("POST", path(current.id, "settings"), { review });
    say("Approval settings saved.");
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

$("limits-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await api("POST", path(current.id, "limits"), {
      budget: { tokens: numberOrNull("limit-tokens"), cost: numberOrNull("limit-cost") },
      max_runs: numberOrNull("limit-runs"),
    });
    say("Budget and run cap saved.");
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

$("copy-invite").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText($("new-invite-link").textContent);
    say("Link copied.");
  } catch (error) {
    window.getSelection().selectAllChildren($("new-invite-link"));
    say("Select and copy the link by hand: the browser refused the clipboard.", true);
  }
});

$("leave").addEventListener("click", async () => {
  if (!window.confirm(`Leave ${current.name}? Your conversations there stop being usable.`)) return;
  try {
    await api("POST", path(current.id, "leave"));
    say(`You left ${current.name}.`);
    await load();
  } catch (error) {
    say(error.message, true);
  }
});

// An invitation link carries its code in the fragment (never sent to a server): fill it in,
// then drop it from the address bar and history.
const fragment = new URLSearchParams(window.location.hash.slice(1));
if (fragment.get("join")) {
  $("join-code").value = fragment.get("join");
  history.replaceState(null, "", window.location.pathname);
  say("Press Join to accept the invitation.");
}

load().catch((error) => say(error.message, true));
