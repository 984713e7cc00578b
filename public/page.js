// What Cairn's own pages share (memory, tokens, workspace, review): the page's request header
// on every call, the status line, and elements filled with textContent only (never innerHTML).
"use strict";

const HEADERS = { "Content-Type": "application/json", "X-Cairn-Request": "1" };
const $ = (id) => document.getElementById(id);

function say(text, isError = false) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", isError);
}

// A signed-out session goes to the sign-in page; any other refusal is thrown with the
// server's words (and its status, for a page that tells a 404 from the rest).
async function api(method, url, body) {
  const response = await fetch(url, {
    method,
    headers: HEADERS,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    window.location.href = "/login";
    throw new Error("Please sign in again.");
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(typeof data.detail === "string" ? data.detail : "Something went wrong.");
    error.status = response.status;
    throw error;
  }
  return data;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (className) node.className = className;
  return node;
}
