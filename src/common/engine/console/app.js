/*
 * The QueueBox console (docs/console.md).  Served with script-src 'self';
 * everything the server sends (names, errors, payloads) is put in the page
 * with textContent, never as HTML.  Writes carry X-QueueBox-CSRF, which no
 * cross-site form can send; the session is an HttpOnly cookie this script
 * never sees.
 */
'use strict';

const REFRESH_MS = 5000;
const CSRF = { 'X-QueueBox-CSRF': '1' };
let timer = null;
let previous = null;			/* the last overview and when it came, for the rates */

function $(id) { return document.getElementById(id); }

function cell(row, text, cls) {
	const td = document.createElement('td');
	td.textContent = text == null ? '' : String(text);
	if (cls)
		td.className = cls;
	row.appendChild(td);
	return td;
}

function fill(tableId, rows, render) {
	const body = $(tableId).tBodies[0];
	body.replaceChildren();
	for (const r of rows) {
		const tr = document.createElement('tr');
		render(tr, r);
		body.appendChild(tr);
	}
}

function age(sec) {
	if (sec == null || sec <= 0)
		return '';
	if (sec < 120)
		return Math.round(sec) + ' s';
	if (sec < 7200)
		return Math.round(sec / 60) + ' min';
	return (sec / 3600).toFixed(1) + ' h';
}

/* a counter's rate per minute since the last refresh, '' on the first */
function perMinute(kind, name, field, now, value) {
	if (previous == null)
		return '';
	const before = previous.o[kind].find((x) => x.name === name || x.destination === name);
	const minutes = (now - previous.at) / 60000;
	if (before == null || minutes <= 0 || value < before[field])
		return '';
	return ((value - before[field]) / minutes).toFixed(1);
}

function show(which) {
	$('login').hidden = which !== 'login';
	$('overview').hidden = which !== 'overview';
	$('logout').hidden = which !== 'overview';
}

function render(o) {
	const now = Date.now();

	fill('destinations', o.destinations, (tr, d) => {
		cell(tr, d.destination);
		cell(tr, d.state, 'circuit-' + d.state);
		cell(tr, d.failures, 'num');
		cell(tr, d.pending, 'num');
		cell(tr, d.intake, 'num');
		cell(tr, d.retrying, 'num');
		cell(tr, d.parked, 'num');
		cell(tr, d.held, 'num');
		cell(tr, age(d.oldest_pending_sec));
		cell(tr, perMinute('destinations', d.destination, 'delivered', now, d.delivered), 'num');
		cell(tr, perMinute('destinations', d.destination, 'failed', now, d.failed), 'num');
		cell(tr, d.last_error, 'error');
	});
	fill('queues', ['outbox', 'inbox'], (tr, t) => {
		const q = o[t];

		cell(tr, t);
		cell(tr, q.pending, 'num');
		cell(tr, q.processing, 'num');
		cell(tr, q.dead, 'num');
		cell(tr, age(q.oldest_pending_sec));
	});
	fill('sources', o.sources, (tr, s) => {
		cell(tr, s.name);
		cell(tr, s.received, 'num');
		cell(tr, s.duplicates, 'num');
		cell(tr, s.refused, 'num');
		cell(tr, perMinute('sources', s.name, 'received', now, s.received), 'num');
		cell(tr, perMinute('sources', s.name, 'refused', now, s.refused), 'num');
	});
	previous = { o: o, at: now };
	$('updated').textContent = 'updated ' + new Date(now).toLocaleTimeString();
}

async function refresh() {
	clearTimeout(timer);
	let res;

	try {
		res = await fetch('/admin/overview', { credentials: 'same-origin', cache: 'no-store' });
	} catch (e) {
		$('error').textContent = 'the server did not answer: ' + e.message;
		$('error').hidden = false;
		timer = setTimeout(refresh, REFRESH_MS);
		return;
	}
	if (res.status === 401) {
		previous = null;
		show('login');
		return;
	}
	if (!res.ok) {
		let reason = res.statusText;

		try { reason = (await res.json()).reason; } catch (e) { /* not JSON */ }
		$('error').textContent = 'overview: ' + res.status + ' ' + reason;
		$('error').hidden = false;
	} else {
		$('error').hidden = true;
		render(await res.json());
		show('overview');
	}
	timer = setTimeout(refresh, REFRESH_MS);
}

async function login(ev) {
	ev.preventDefault();
	const res = await fetch('/console/login', {
		method: 'POST',
		credentials: 'same-origin',
		headers: Object.assign({ 'Content-Type': 'application/json' }, CSRF),
		body: JSON.stringify({ token: $('token').value }),
	});

	$('token').value = '';
	if (res.ok) {
		$('login-error').textContent = '';
		refresh();
		return;
	}
	let reason = res.statusText;

	try { reason = (await res.json()).reason; } catch (e) { /* not JSON */ }
	$('login-error').textContent = reason;
}

async function logout() {
	clearTimeout(timer);
	await fetch('/console/logout', { method: 'POST', credentials: 'same-origin', headers: CSRF });
	previous = null;
	show('login');
}

document.addEventListener('DOMContentLoaded', () => {
	$('login').addEventListener('submit', login);
	$('logout').addEventListener('click', logout);
	refresh();
});
