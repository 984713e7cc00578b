// The memory & data page. Every value from the server is put in the page with textContent
// (never innerHTML), so a stored fact cannot inject markup.
"use strict";

let state = null;

function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? "" : date.toLocaleString();
}

// The server's names for category keys ("finance_sensitive" reads "Finance (sensitive)").
function categoryName(key) {
  const labels = state.category_labels || {};
  return labels[key] || labels.other || "Other";
}

function conversationLink(threadId, name) {
  const link = el("a", name || "a conversation");
  link.href = "/thread/" + encodeURIComponent(threadId);
  return link;
}

async function load() {
  try {
    const [memory, shared] = await Promise.all([api("GET", "/api/memory"), api("GET", "/api/shares")]);
    state = memory;
    state.shares = shared.shares;
  } catch (error) {
    say(error.message, true);
    return;
  }
  render();
}

function render() {
  $("who").textContent = state.display_name;
  renderSettings();
  renderSuggestions();
  renderMemories();
  renderSources();
  renderPlans();
  renderConversations();
  renderShares();
}

function renderSettings() {
  const s = state.settings;
  $("memory-enabled").checked = s.enabled;
  const box = $("opt-in");
  box.replaceChildren();
  for (const category of s.sensitive_categories) {
    const label = el("label", null, "check");
    const input = document.createElement("input");
    input.type = "checkbox";
    input.value = category;
    input.checked = s.opted_in.includes(category);
    label.append(input, " " + categoryName(category));
    box.append(label);
  }
  $("retention").value = s.retention_days ? String(s.retention_days) : "";
  const days = s.retention_days || s.default_retention_days;
  $("retention-text").textContent = days + " days without activity";
  renderUsage(state.usage);
}

function renderUsage(u) {
  if (!u) {
    $("usage").textContent = "";
    return;
  }
  const money = (x) => "$" + x.toFixed(x < 1 ? 4 : 2);
  let text = "This month: " + u.tokens.toLocaleString() + " tokens in " + u.runs +
    " run(s), about " + money(u.estimated_cost) + " at the configured prices.";
  if (u.token_budget) text += " Budget: " + u.token_budget.toLocaleString() + " tokens.";
  if (u.cost_budget) text += " Budget: " + money(u.cost_budget) + ".";
  $("usage").textContent = text;
}

function renderSuggestions() {
  const list = $("suggestions");
  list.replaceChildren();
  $("suggestions-section").hidden = state.suggestions.length === 0;
  for (const s of state.suggestions) {
    const item = el("li", null, "suggestion");
    item.dataset.id = s.id;
    item.append(el("div", s.content, "text"));
    const meta = el("div", s.category_label || categoryName(s.category), "meta");
    if (s.thread_id && s.conversation) {
      meta.append(" · from ", conversationLink(s.thread_id, s.conversation));
    }
    const actions = el("div", null, "actions");
    const yes = el("button", "Confirm");
    const no = el("button", "Reject", "destructive");
    yes.type = no.type = "button";
    yes.addEventListener("click", () => answer(s, "confirm"));
    no.addEventListener("click", () => answer(s, "reject"));
    actions.append(yes, no);
    item.append(meta, actions);
    list.append(item);
  }
}

async function answer(suggestion, decision) {
  try {
    const result = await api("POST", "/api/memory/suggestions/" + suggestion.id, { decision });
    say(result.stored ? "Stored: " + suggestion.content : "Not stored.");
  } catch (error) {
    say(error.message, true);
  }
  await load();
}

let searchHits = null;

function renderMemories() {
  const categories = [...new Set(state.memories.map((m) => m.category))].sort();
  const select = $("category-filter");
  const chosen = select.value;
  select.replaceChildren(el("option", "All categories"));
  select.firstChild.value = "";
  for (const c of categories) {
    const option = el("option", categoryName(c));
    option.value = c;
    select.append(option);
  }
  select.value = categories.includes(chosen) ? chosen : "";

  const needle = $("filter").value.trim().toLowerCase();
  const used = $("used-filter").value;
  const shown = state.memories.filter(
    (m) =>
      (!select.value || m.category === select.value) &&
      usedMatches(m, used) &&
      (!needle || m.content.toLowerCase().includes(needle) || (searchHits && searchHits.has(m.key)))
  );
  const box = $("memories");
  box.replaceChildren();
  if (shown.length === 0) {
    box.append(el("p", state.memories.length ? "No memory matches." : "Nothing remembered yet.", "hint"));
    return;
  }
  if ($("sort").value === "last-used") {
    // One list, most recently used first; never-used memories last.
    const list = el("ul", null, "list");
    const byUse = [...shown].sort((a, b) => usedAt(b) - usedAt(a) || a.content.localeCompare(b.content));
    for (const m of byUse) list.append(memoryRow(m));
    box.append(list);
    revealLinked();
    return;
  }
  const groups = new Map();
  for (const m of shown) {
    if (!groups.has(m.category)) groups.set(m.category, []);
    groups.get(m.category).push(m);
  }
  for (const [category, memories] of groups) {
    box.append(el("h3", categoryName(category)));
    const list = el("ul", null, "list");
    for (const m of memories) list.append(memoryRow(m));
    box.append(list);
  }
  revealLinked();
}

const DAY_MS = 24 * 60 * 60 * 1000;

function usedAt(m) {
  const t = m.last_recalled_at ? new Date(m.last_recalled_at).getTime() : NaN;
  return Number.isNaN(t) ? 0 : t;
}

// "", "never", or a number of days: used within that many days.
function usedMatches(m, used) {
  if (!used) return true;
  if (used === "never") return usedAt(m) === 0;
  return usedAt(m) > 0 && Date.now() - usedAt(m) <= Number(used) * DAY_MS;
}

// A reply's "Memory recall" step links here as /memory#memory-<key>: show that entry.
let revealed = false;
function revealLinked() {
  if (revealed || !window.location.hash.startsWith("#memory-")) return;
  const key = decodeURIComponent(window.location.hash.slice("#memory-".length));
  const row = document.getElementById("memory-" + key);
  if (!row) return;
  revealed = true;
  row.classList.add("linked");
  row.scrollIntoView({ block: "center" });
}

function memoryRow(m) {
  const row = $("memory-row").content.firstElementChild.cloneNode(true);
  row.dataset.key = m.key;
  row.id = "memory-" + m.key;
  row.querySelector(".text").textContent = m.content;
  const meta = row.querySelector(".meta");
  const used = el("span", m.last_recalled_at ? "last used " + when(m.last_recalled_at) : "not used in a reply yet", "used");
  meta.append(used, " · updated " + when(m.edited_at || m.updated_at));
  if (m.edited_at) meta.append(" · edited by you");
  if (m.source.thread_id && m.source.conversation) {
    meta.append(" · from ", conversationLink(m.source.thread_id, m.source.conversation));
  } else if (m.source.thread_id) {
    meta.append(" · from a deleted conversation");
  }
  row.querySelector(".edit").addEventListener("click", () => startEdit(row, m));
  row.querySelector(".delete").addEventListener("click", () => removeMemory(m));
  return row;
}

function startEdit(row, m) {
  const text = row.querySelector(".text");
  const input = document.createElement("textarea");
  input.value = m.content;
  input.maxLength = 300;
  input.setAttribute("aria-label", "Memory text");
  const save = el("button", "Save");
  const cancel = el("button", "Cancel");
  save.type = cancel.type = "button";
  const editor = el("div", null, "editor");
  editor.append(input, save, cancel);
  text.replaceWith(editor);
  input.focus();
  cancel.addEventListener("click", () => editor.replaceWith(text));
  save.addEventListener("click", async () => {
    try {
      await api("PUT", "/api/memory/items/" + encodeURIComponent(m.key), { content: input.value });
      say("Saved.");
      await load();
    } catch (error) {
      say(error.message, true);
    }
  });
}

async function removeMemory(m) {
  if (!window.confirm("Delete this memory?\n\n" + m.content)) return;
  try {
    await api("DELETE", "/api/memory/items/" + encodeURIComponent(m.key));
    say("Deleted. Cairn will not use or learn it again.");
  } catch (error) {
    say(error.message, true);
  }
  await load();
}

// Where an agent memory came from: links to the user's conversations that still exist.
function fromConversations(meta, items, unnamed) {
  const named = items.filter((c) => c.conversation);
  named.forEach((c, i) => meta.append(i ? ", " : " · from ", conversationLink(c.thread_id, c.conversation)));
  if (unnamed || named.length < items.length) {
    meta.append(named.length ? " and earlier or deleted conversations" : " · from earlier or deleted conversations");
  }
}

function deleteButton(label, onClick) {
  const button = el("button", label, "delete destructive");
  button.type = "button";
  button.addEventListener("click", onClick);
  const actions = el("div", null, "actions");
  actions.append(button);
  return actions;
}

function renderSources() {
  const list = $("sources");
  list.replaceChildren();
  if (state.research_sources.length === 0) {
    list.append(el("li", "No source ratings yet.", "hint"));
    return;
  }
  for (const s of state.research_sources) {
    const item = el("li", null, "source");
    item.dataset.id = s.id;
    item.append(el("div", s.source, "text"));
    const meta = el("div", s.passed + " of " + s.total + " quoted excerpts held up · last cited " + s.last_cited, "meta");
    fromConversations(meta, s.conversations, s.from_unnamed_conversations);
    item.append(meta, deleteButton("Delete", () => removeAgentMemory(
      "/api/memory/sources/", s.id, "Delete what Research learned about " + s.source + "?", "Deleted.")));
    list.append(item);
  }
}

const OUTCOMES = {
  answered: "ended with an answer",
  partial: "ended with a partial answer",
  rejected: "plan rejected",
  failed: "failed",
};

function renderPlans() {
  const list = $("plans");
  list.replaceChildren();
  if (state.plan_examples.length === 0) {
    list.append(el("li", "No plan examples yet.", "hint"));
    return;
  }
  for (const p of state.plan_examples) {
    const item = el("li", null, "plan");
    item.dataset.key = p.key;
    item.append(el("div", p.goal, "text"));
    const steps = el("ol", null, "steps");
    for (const step of p.steps) steps.append(el("li", step));
    const meta = el("div", (OUTCOMES[p.outcome] || "ended") + " · " + when(p.at), "meta");
    if (p.thread_id) fromConversations(meta, [{ thread_id: p.thread_id, conversation: p.conversation }], false);
    item.append(steps, meta, deleteButton("Delete", () => removeAgentMemory(
      "/api/memory/plans/", p.key, "Delete this plan example?\n\n" + p.goal, "Deleted. The Planner will not use it again.")));
    list.append(item);
  }
}

async function removeAgentMemory(base, id, question, done) {
  if (!window.confirm(question)) return;
  try {
    await api("DELETE", base + encodeURIComponent(id));
    say(done);
  } catch (error) {
    say(error.message, true);
  }
  await load();
}

function renderConversations() {
  const list = $("conversations");
  list.replaceChildren();
  if (state.conversations.length === 0) {
    list.append(el("li", "No conversations.", "hint"));
    return;
  }
  for (const c of state.conversations) {
    const item = el("li", null, "conversation");
    item.dataset.id = c.id;
    const title = el("div", null, "text");
    title.append(conversationLink(c.id, c.name));
    const meta = el("div", c.agent + " · last active " + when(c.last_active_at), "meta");
    if (c.temporary) meta.append(" · temporary");
    if (c.support_opened_at) {
      const notice = el("span", " · opened by Cairn support " + when(c.support_opened_at) +
        (c.support_forks ? " (forked " + c.support_forks + "×)" : ""), "support-notice");
      meta.append(notice);
    }
    const forget = document.createElement("input");
    forget.type = "checkbox";
    forget.className = "forget";
    const label = el("label", null, "check");
    label.append(forget, " also forget what was learned from it");
    const remove = el("button", "Delete conversation", "destructive");
    remove.type = "button";
    remove.addEventListener("click", () => removeConversation(c, forget.checked));
    const actions = el("div", null, "actions");
    actions.append(label, remove);
    if (c.workspace_id) {
      const share = el("button", "Share with the team", "share");
      share.type = "button";
      share.addEventListener("click", () => shareConversation(c));
      actions.append(share);
    }
    item.append(title, meta, actions);
    list.append(item);
  }
}

const INCLUDED = { memory_notes: "memory notes", recall: "recall details", attachments: "attachments" };

function renderShares() {
  const list = $("shares");
  list.replaceChildren();
  if (state.shares.length === 0) {
    list.append(el("li", "Nothing shared.", "hint"));
    return;
  }
  for (const s of state.shares) {
    const item = el("li", null, "shared");
    item.dataset.id = s.id;
    const title = el("div", null, "text");
    const link = el("a", s.conversation);
    link.href = s.url;
    title.append(link);
    const audience = s.audience === "workspace"
      ? "the whole team"
      : s.members.map((m) => m.name || m.user_id).join(", ") || "nobody (its members left)";
    const included = Object.keys(INCLUDED).filter((k) => s.include[k]).map((k) => INCLUDED[k]);
    const meta = el("div", "with " + audience + " · shared " + when(s.created_at) +
      (included.length ? " · includes " + included.join(", ") : ""), "meta");
    const copy = el("div", null, "copy-row");
    copy.append(el("code", window.location.origin + s.url));
    const revoke = el("button", "Revoke", "destructive revoke");
    revoke.type = "button";
    revoke.addEventListener("click", () => revokeShare(s));
    const actions = el("div", null, "actions");
    actions.append(revoke);
    item.append(title, meta, copy, actions);
    list.append(item);
  }
}

async function shareConversation(c) {
  try {
    const share = await api("POST", "/api/threads/" + encodeURIComponent(c.id) + "/shares", { audience: "workspace" });
    say("Shared with the team: " + window.location.origin + share.url);
  } catch (error) {
    say(error.message, true);
  }
  await load();
}

async function revokeShare(s) {
  if (!window.confirm('Stop sharing "' + s.conversation + '"?')) return;
  try {
    await api("POST", "/api/shares/" + encodeURIComponent(s.id) + "/revoke", {});
    say("Share revoked: the link no longer opens.");
  } catch (error) {
    say(error.message, true);
  }
  await load();
}

async function removeConversation(c, forget) {
  if (!window.confirm('Delete "' + c.name + '"? This cannot be undone.')) return;
  try {
    const result = await api("POST", "/api/conversations/" + encodeURIComponent(c.id) + "/delete", { forget });
    say("Conversation deleted" + (forget ? "; forgot " + result.forgotten + " memories." : "."));
  } catch (error) {
    say(error.message, true);
  }
  await load();
}

function wireForms() {
  $("settings-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const opted = [...$("opt-in").querySelectorAll("input:checked")].map((i) => i.value);
    const retention = $("retention").value;
    try {
      const result = await api("PUT", "/api/memory/settings", {
        enabled: $("memory-enabled").checked,
        opted_in: opted,
        retention_days: retention ? Number(retention) : null,
      });
      say("Settings saved." + (result.cancelled_jobs ? " Cancelled " + result.cancelled_jobs + " waiting memory updates." : ""));
    } catch (error) {
      say(error.message, true);
    }
    await load();
  });

  $("wipe-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const result = await api("POST", "/api/account/wipe", { confirm: $("wipe-confirm").value });
      document.body.replaceChildren(
        el("main", null, "done"),
      );
      const main = document.body.firstChild;
      main.append(
        el("h1", result.verified ? "All your data was deleted." : "Your data is being deleted."),
        el("p", "You have been signed out everywhere."),
      );
      const again = el("a", "Sign in");
      again.href = "/login";
      main.append(again);
    } catch (error) {
      say(error.message, true);
    }
  });

  $("sign-out-everywhere-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const result = await api("POST", "/api/account/sign-out-everywhere", {});
      document.body.replaceChildren(el("main", null, "done"));
      const main = document.body.firstChild;
      main.append(
        el("h1", "You have been signed out everywhere."),
        el("p", result.tokens_revoked ? result.tokens_revoked + " access tokens were revoked." : "No access tokens needed revoking."),
      );
      const again = el("a", "Sign in");
      again.href = "/login";
      main.append(again);
    } catch (error) {
      say(error.message, true);
    }
  });

  let timer = null;
  $("filter").addEventListener("input", () => {
    clearTimeout(timer);
    searchHits = null;
    renderMemories();
    const q = $("filter").value.trim();
    if (!q) return;
    // Also match by meaning ("where do I live" finds the home city), after a short pause.
    timer = setTimeout(async () => {
      try {
        const found = await api("GET", "/api/memory/search?q=" + encodeURIComponent(q));
        searchHits = new Set(found.keys);
        renderMemories();
      } catch (error) {
        say(error.message, true);
      }
    }, 300);
  });
  $("category-filter").addEventListener("change", renderMemories);
  $("used-filter").addEventListener("change", renderMemories);
  $("sort").addEventListener("change", renderMemories);
  window.addEventListener("hashchange", () => {
    revealed = false;
    revealLinked();
  });
}

wireForms();
load();
