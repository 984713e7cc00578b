// The reviewers' queue. Server values go in with textContent only (never innerHTML).
"use strict";

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
const AGENTS = { planner: "Planner", research: "Research" };
const VERBS = { approve: "Approved", edit: "Edited", reject: "Rejected" };

function plan(details) {
  const box = el("div");
  box.append(el("div", `Goal: ${details.goal || "(none given)"}`, "text"));
  const steps = el("ol", undefined, "steps");
  for (const step of details.plan || []) steps.append(el("li", String(step)));
  box.append(steps);
  const figures = [];
  if (details.estimated_model_calls) figures.push(`about ${details.estimated_model_calls} model calls`);
  if (details.estimated_tokens) {
    const cost = details.estimated_cost ? `, est. $${Number(details.estimated_cost).toFixed(4)}` : "";
    figures.push(`≈ ${Number(details.estimated_tokens).toLocaleString()} tokens${cost}`);
  }
  if (details.step_budget) figures.push(`step budget ${details.step_budget}`);
  if ((details.completed || []).length) figures.push(`${details.completed.length} steps already run`);
  if (figures.length) box.append(el("div", figures.join(" · "), "meta"));
  return box;
}

async function decide(review, decision, text) {
  try {
    await api("POST", `/api/reviews/${encodeURIComponent(review.id)}/decide`, { decision, text });
    say(`${VERBS[decision]}: the run goes on for ${review.requester}.`);
  } catch (error) {
    say(error.message, true);
  }
  await load();
}

function pendingRow(review) {
  const item = el("li");
  item.dataset.id = review.id;
  item.append(el("div", `${AGENTS[review.agent] || review.agent} plan from ${review.requester}`, "text"));
  item.append(el("div", `asked ${when(review.created_at)}`, "meta"));
  item.append(plan(review.details));
  const actions = el("div", undefined, "actions");
  const approve = el("button", "Approve");
  const edit = el("button", "Edit");
  const reject = el("button", "Reject", "destructive");
  for (const b of [approve, edit, reject]) b.type = "button";
  const editor = el("div", undefined, "editor");
  editor.hidden = true;
  const text = document.createElement("textarea");
  text.maxLength = 4000;
  text.setAttribute("aria-label", "New steps or feedback");
  text.value = (review.details.plan || []).map((s, i) => `${i + 1}. ${s}`).join("\n");
  const send = el("button", "Send edit");
  send.type = "button";
  editor.append(text, send);
  approve.addEventListener("click", () => decide(review, "approve", ""));
  reject.addEventListener("click", () => decide(review, "reject", ""));
  edit.addEventListener("click", () => {
    editor.hidden = false;
    text.focus();
  });
  send.addEventListener("click", () => decide(review, "edit", text.value));
  actions.append(approve, edit, reject);
  item.append(actions, editor);
  return item;
}

function decidedRow(review) {
  const item = el("li");
  const verb = VERBS[review.status] || review.status;
  item.append(el("div", `${verb}: ${review.details.goal || "a plan"} (from ${review.requester})`, "text"));
  item.append(el("div", `decided ${when(review.decided_at)}`, "meta"));
  return item;
}

async function load() {
  let data;
  try {
    data = await api("GET", "/api/reviews");
  } catch (error) {
    if (error.status === 404) {
      say("Nothing to review here: choose a team you review for on the Workspace page.", true);
      $("pending").replaceChildren();
      $("decided").replaceChildren();
      return;
    }
    throw error;
  }
  $("pending").replaceChildren(...data.pending.map(pendingRow));
  if (!data.pending.length) $("pending").append(el("li", "Nothing is waiting.", "meta"));
  $("decided").replaceChildren(...data.decided.map(decidedRow));
}

load().catch((error) => say(error.message, true));
