/*
 * The QueueBox console (docs/console.md).  Served with script-src 'self';
 * everything the server sends (names, errors, payloads, headers) is put in
 * the page with textContent, never as HTML.  Writes carry X-QueueBox-CSRF,
 * which no cross-site form can send; the session is an HttpOnly cookie this
 * script never sees.  Pages are hash routes: #/overview, #/dead/outbox,
 * #/dead/inbox, #/outbox/<id>, #/inbox/<id>, #/keys, #/lookup.
 */
'use strict';

const REFRESH_MS = 5000;
const PAGE = 50;				/* dead rows per page */
const CSRF = { 'X-QueueBox-CSRF': '1' };
const VIEWS = ['overview', 'dead', 'detail', 'keys', 'lookup'];
let timer = null;
let previous = null;			/* the last overview and when it came, for the rates */
let current = null;				/* the row shown in the detail view */
/* the dead-letter lists: the filters searched and the pages' cursors */
const lists = {
	outbox: { query: {}, cursors: [] },
	inbox: { query: {}, cursors: [] },
};
let table = 'outbox';			/* the dead-letter tab shown */
/* the dead-letter lists' columns: a field (or a function of the row) and its class */
const COLUMNS = {
	outbox: [['id', 'num'], ['created_at'], ['destination'], ['topic'], ['key'],
		[(d) => text(d.attempt) + ' / ' + text(d.max_attempts), 'num'], ['last_error', 'error'],
		[(d) => d.holds_key ? 'yes' : '']],
	inbox: [['id', 'num'], ['created_at'], ['source'], ['event_type'], ['idempotency_key'],
		['aggregate_id'], ['attempt', 'num'], ['last_error', 'error']],
};
let view = null;				/* the view the hash names */
let loads = 0;					/* list and row reads: only the latest one is shown */

function $(id) { return document.getElementById(id); }

function text(v) {
	return v == null ? '' : String(v);
}

function cell(row, value, cls) {
	const td = document.createElement('td');
	td.textContent = text(value);
	if (cls)
		td.className = cls;
	row.appendChild(td);
	return td;
}

function button(label, onclick, cls) {
	const b = document.createElement('button');
	b.type = 'button';
	b.textContent = label;
	if (cls)
		b.className = cls;
	b.addEventListener('click', onclick);
	return b;
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

/* a definition list of [label, value] pairs */
function fields(dlId, pairs) {
	const dl = $(dlId);
	dl.replaceChildren();
	for (const [label, value] of pairs) {
		const dt = document.createElement('dt');
		const dd = document.createElement('dd');
		dt.textContent = label;
		dd.textContent = text(value);
		dl.append(dt, dd);
	}
}

/* JSON as indented text */
function pretty(v) {
	return v === undefined ? '' : JSON.stringify(v, null, 2);
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

/* ---- talking to the admin routes ---------------------------------- */

function problem(message) {
	$('error').textContent = message;
	$('error').hidden = message === '';
}

function said(message) {
	$('result').textContent = message;
	$('result').hidden = message === '';
}

/*
 * api: one admin request; {status, ok, data} with data the parsed answer
 * (or {reason} when it is not JSON).  A 401 shows the login form and
 * answers null: the caller stops.
 */
async function api(method, path, body) {
	const init = { method: method, credentials: 'same-origin', cache: 'no-store', headers: {} };
	let res;

	if (method !== 'GET')
		Object.assign(init.headers, CSRF);
	if (body !== undefined) {
		init.headers['Content-Type'] = 'application/json';
		init.body = JSON.stringify(body);
	}
	try {
		res = await fetch(path, init);
	} catch (e) {
		problem('the server did not answer: ' + e.message);
		return { status: 0, ok: false, data: { reason: e.message } };
	}
	if (res.status === 401) {
		clearTimeout(timer);
		previous = null;
		show('login');
		return null;
	}
	let data;
	try { data = await res.json(); } catch (e) { data = { reason: res.statusText }; }
	return { status: res.status, ok: res.ok, data: data, headers: res.headers };
}

function reason(r) {
	const d = r.data || {};
	return r.status + ' ' + text(d.reason || d.error || JSON.stringify(d));
}

function query(params) {
	const q = new URLSearchParams();
	for (const [k, v] of Object.entries(params))
		if (v != null && v !== '')
			q.set(k, v);
	const s = q.toString();
	return s ? '?' + s : '';
}

/* ---- the views and the routes -------------------------------------- */

function show(which) {
	const logged = which !== 'login';

	$('login').hidden = logged;
	$('nav').hidden = !logged;
	$('logout').hidden = !logged;
	for (const v of VIEWS)
		$(v).hidden = v !== which;
	for (const a of $('nav').querySelectorAll('a'))
		a.classList.toggle('current', a.dataset.view === (which === 'detail' ? 'dead' : which));
	if (!logged) {
		$('updated').textContent = '';
		problem('');
		said('');
	}
}

function route() {
	const parts = location.hash.replace(/^#\/?/, '').split('/');

	clearTimeout(timer);
	problem('');
	said('');
	const row = (parts[0] === 'outbox' || parts[0] === 'inbox') && /^\d+$/.test(parts[1] || '');

	view = parts[0] === 'dead' || parts[0] === 'keys' || parts[0] === 'lookup' ? parts[0] :
		row ? 'detail' : 'overview';
	if (parts[0] === 'dead') {
		table = parts[1] === 'inbox' ? 'inbox' : 'outbox';
		openDead();
	} else if (row)
		openDetail(parts[0], parts[1]);
	else if (parts[0] === 'keys')
		openKeys();
	else if (parts[0] === 'lookup')
		openLookup();
	else
		refresh();
}

/* ---- overview ------------------------------------------------------ */

function destinationActions(td, name) {
	td.append(
		button('Pause', () => pause(name)),
		button('Resume', () => act('Resume ' + name + '? Its circuit closes, its failures and any pause are cleared.',
			'/admin/destinations/' + encodeURIComponent(name) + '/resume')),
		button('Reset circuit', () => act('Reset the circuit of ' + name + '? It closes and its failures are cleared; a pause stays.',
			'/admin/destinations/' + encodeURIComponent(name) + '/reset')));
}

/* a destination's limits: "50/s (burst 50), 4 at once (1 in use); waited 12", or "" */
function limitText(l, waits) {
	const parts = [];

	if (!l)
		return '';
	if (l.perSecond !== undefined)
		parts.push(l.perSecond + '/s (burst ' + l.burst + ')');
	if (l.maxConcurrent !== undefined)
		parts.push(l.maxConcurrent + ' at once (' + l.inUse + ' in use)');
	return parts.join(', ') + '; waited ' + (waits || 0);
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
		cell(tr, limitText(d.limit, d.limit_waits));
		cell(tr, d.last_error, 'error');
		destinationActions(cell(tr, '', 'actions'), d.destination);
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
	/* the workers, when this server reports them */
	$('workers-part').hidden = !Array.isArray(o.workers);
	if (Array.isArray(o.workers))
		fill('workers', o.workers, (tr, w) => {
			const rest = Object.entries(w).filter(([k]) => !['name', 'pid', 'state', 'since'].includes(k));

			cell(tr, w.name);
			cell(tr, w.pid, 'num');
			cell(tr, w.state);
			cell(tr, w.since);
			cell(tr, rest.map(([k, v]) => k + ': ' + (typeof v === 'object' ? JSON.stringify(v) : text(v))).join(', '));
		});
	const names = $('source-names');
	names.replaceChildren();
	for (const s of o.sources) {
		const opt = document.createElement('option');
		opt.value = s.name;
		names.appendChild(opt);
	}
	previous = { o: o, at: now };
	$('updated').textContent = 'updated ' + new Date(now).toLocaleTimeString();
}

async function refresh() {
	clearTimeout(timer);
	const r = await api('GET', '/admin/overview');

	/* logged out, or the operator went to another page meanwhile */
	if (r == null || view !== 'overview')
		return;
	if (!r.ok)
		problem('overview: ' + reason(r));
	else {
		problem('');
		render(r.data);
		show('overview');
	}
	timer = setTimeout(refresh, REFRESH_MS);
}

/* a destination action, once confirmed; the answer shown, the overview refreshed */
async function act(question, path, body) {
	if (!window.confirm(question))
		return;
	const r = await api('POST', path, body);
	if (r == null)
		return;
	if (r.ok)
		said(path + ': ' + JSON.stringify(r.data));
	else
		problem(path + ': ' + reason(r));
	refresh();
}

async function pause(name) {
	const answer = window.prompt('Pause ' + name + ' for how many minutes? Nothing is sent to it until then (Resume ends it early).', '15');
	if (answer == null)
		return;
	const minutes = Number(answer);
	if (!Number.isFinite(minutes) || minutes <= 0 || minutes > 525600) {
		problem('pause ' + name + ': "' + answer + '" is not a number of minutes from 1 to 525600');
		return;
	}
	const r = await api('POST', '/admin/destinations/' + encodeURIComponent(name) + '/pause',
		{ seconds: Math.max(1, Math.round(minutes * 60)) });
	if (r == null)
		return;
	if (r.ok)
		said('paused ' + name + ': ' + JSON.stringify(r.data));
	else
		problem('pause ' + name + ': ' + reason(r));
	refresh();
}

/* ---- dead letters -------------------------------------------------- */

function openDead() {
	const other = table === 'outbox' ? 'inbox' : 'outbox';

	show('dead');
	$('filter-' + table).hidden = false;
	$('filter-' + other).hidden = true;
	$('dead-' + table).hidden = false;
	$('dead-' + other).hidden = true;
	$('tab-' + table).classList.add('current');
	$('tab-' + other).classList.remove('current');
	loadDead();
}

function search(ev) {
	const form = ev.target;
	const l = lists[form.dataset.table];

	ev.preventDefault();
	l.query = Object.fromEntries(new FormData(form));
	l.cursors = [];
	loadDead();
}

async function loadDead() {
	const l = lists[table];
	const after = l.cursors.length ? l.cursors[l.cursors.length - 1] : null;
	const mine = ++loads;
	const r = await api('GET', '/admin/' + table + '/dead' + query(Object.assign({}, l.query, { after: after, limit: PAGE })));

	if (r == null || mine !== loads)
		return;
	if (!r.ok) {
		problem('dead ' + table + ' rows: ' + reason(r));
		fill('dead-' + table, [], () => {});
		$('page-info').textContent = '';
		return;
	}
	const rows = r.data;
	fill('dead-' + table, rows, (tr, d) => {
		for (const [field, cls] of COLUMNS[table])
			cell(tr, typeof field === 'function' ? field(d) : d[field], cls);
		opens(tr, table, d.id);
	});
	/*
	 * the server names where the next page starts (X-QueueBox-Next-After,
	 * empty at the end); without it, after this page's last id when it is full
	 */
	const next = r.headers.get('X-QueueBox-Next-After');
	l.last = next != null ? (next === '' ? null : next) :
		rows.length === PAGE ? rows[rows.length - 1].id : null;
	$('next-page').disabled = l.last == null;
	$('first-page').disabled = l.cursors.length === 0;
	$('page-info').textContent = rows.length === 0 ? 'no dead ' + table + ' rows' +
		(Object.values(l.query).some((v) => v !== '') ? ' match these filters' : '') :
		'page ' + (l.cursors.length + 1) + ': ' + rows.length + (rows.length === 1 ? ' row, ids ' : ' rows, ids ') + rows[0].id + ' to ' + rows[rows.length - 1].id;
}

/* a click on a row opens its detail */
function opens(tr, which, id) {
	tr.className = 'opens';
	tr.tabIndex = 0;
	tr.title = 'show ' + which + ' row ' + id;
	tr.addEventListener('click', () => { location.hash = '#/' + which + '/' + id; });
	tr.addEventListener('keydown', (e) => {
		if (e.key === 'Enter')
			location.hash = '#/' + which + '/' + id;
	});
}

function nextPage() {
	const l = lists[table];
	if (l.last != null) {
		l.cursors.push(l.last);
		loadDead();
	}
}

function firstPage() {
	lists[table].cursors = [];
	loadDead();
}

/* ---- one row ------------------------------------------------------- */

async function openDetail(which, id) {
	show('detail');
	$('edit').hidden = true;
	current = null;
	$('detail-title').textContent = which + ' row ' + id;
	const mine = ++loads;
	const r = await api('GET', '/admin/' + which + '/' + id);
	if (r == null || mine !== loads)
		return;
	if (!r.ok) {
		problem(which + ' row ' + id + ': ' + reason(r));
		fields('detail-fields', []);
		$('detail-payload').textContent = '';
		fill('detail-headers', [], () => {});
		fill('detail-audit', [], () => {});
		return;
	}
	const d = r.data;
	current = { table: which, row: d };
	const common = [['State', d.state], ['Hold', d.hold],
		['Attempts', d.max_attempts != null ? text(d.attempt) + ' / ' + text(d.max_attempts) : d.attempt],
		['Created', d.created_at], ['Scheduled', d.scheduled_at], ['Last error', d.last_error]];
	if (which === 'outbox')
		fields('detail-fields', [['Id', d.id], ['Message id', d.message_id], ['Topic', d.topic], ['Key', d.key],
			['Destination', d.destination]].concat(
			// fan-out: every delivery of the message, each at its destination
			Array.isArray(d.deliveries) ? [['Deliveries', d.deliveries.map((c) =>
				c.destination + ' #' + c.id + ' ' + c.state).join(', ')]] : [], common));
	else
		fields('detail-fields', [['Id', d.id], ['Source', d.source], ['Idempotency key', d.idempotency_key],
			['Event type', d.event_type], ['Aggregate id', d.aggregate_id],
			['Consumption', d.consumption]].concat(common));
	$('detail-payload').textContent = pretty(d.payload);
	let headers = d.headers;
	if (typeof headers === 'string') {
		try { headers = JSON.parse(headers); } catch (e) { headers = { '(not JSON)': headers }; }
	}
	fill('detail-headers', Object.entries(headers || {}), (tr, [k, v]) => {
		cell(tr, k);
		cell(tr, typeof v === 'string' ? v : JSON.stringify(v));
	});
	$('detail-audit-part').hidden = !Array.isArray(d.audit);
	fill('detail-audit', d.audit || [], (tr, a) => {
		cell(tr, a.action);
		cell(tr, a.done_by);
		cell(tr, a.done_at);
		cell(tr, a.payload_before == null ? '' : pretty(a.payload_before), 'json');
		cell(tr, a.payload_after == null ? '' : pretty(a.payload_after), 'json');
	});
	const dead = d.state === 'dead';
	$('do-requeue').disabled = !dead;
	$('do-edit').disabled = !dead;
	$('do-skip').hidden = d.hold !== 'dead';
}

/* an action on the row shown: confirmed, its answer shown, the row read again */
async function rowAction(verb, question, body) {
	if (current == null || !window.confirm(question))
		return false;
	const { table: which, row } = current;
	const path = '/admin/' + which + '/' + row.id + '/' + verb;
	const r = await api('POST', path, body);
	if (r == null)
		return false;
	if (r.status === 404 && /no such admin route/.test(text(r.data.reason))) {
		problem(verb + ': this server has no such action for ' + which + ' rows (' + reason(r) + ')');
		return false;
	}
	await openDetail(which, row.id);
	if (r.ok)
		said(verb + ' ' + which + ' row ' + row.id + ': ' + JSON.stringify(r.data));
	else
		problem(verb + ' ' + which + ' row ' + row.id + ': ' + reason(r));
	return r.ok;
}

function editPayload() {
	if (current == null)
		return;
	$('edit-payload').value = JSON.stringify(current.row.payload, null, 2);
	$('edit').hidden = false;
	$('edit-payload').focus();
}

async function sendEdited(ev) {
	ev.preventDefault();
	let payload;
	try {
		payload = JSON.parse($('edit-payload').value);
	} catch (e) {
		problem('the edited payload is not JSON (' + e.message + '); nothing was sent');
		return;
	}
	problem('');
	const which = current.table;
	const id = current.row.id;
	if (!await rowAction('requeue', 'Requeue ' + which + ' row ' + id +
		' with the edited payload? The original is kept in the audit.', { payload: payload }))
		return;
	/* a server without edited requeues for this table requeues the row as it was: say so */
	if (current != null && current.row.id === id && canonical(current.row.payload) !== canonical(payload))
		problem('the server requeued ' + which + ' row ' + id + ' but kept its payload: it has no edited requeue for ' +
			which + ' rows');
}

/* JSON text the same for the same value, whatever the order of its keys */
function canonical(v) {
	const sort = (x) => Array.isArray(x) ? x.map(sort) : x !== null && typeof x === 'object' ?
		Object.fromEntries(Object.keys(x).sort().map((k) => [k, sort(x[k])])) : x;
	return JSON.stringify(sort(v));
}

/* ---- held keys and held aggregates --------------------------------- */

/* a held head's action: table outbox (a key) or inbox (an aggregate) */
async function headAction(table, id, what, verb, question) {
	if (!window.confirm(question))
		return;
	const r = await api('POST', '/admin/' + table + '/' + id + '/' + verb);
	if (r == null)
		return;
	if (r.ok)
		said(verb + ' ' + table + ' row ' + id + ' (' + what + '): ' + JSON.stringify(r.data));
	else
		problem(verb + ' ' + table + ' row ' + id + ': ' + reason(r));
	loadKeys();
}

function headLink(tr, table, id) {
	const head = cell(tr, '', 'num');
	const a = document.createElement('a');
	a.href = '#/' + table + '/' + encodeURIComponent(id);
	a.textContent = text(id);
	head.appendChild(a);
}

function headButtons(tr, table, id, what) {
	cell(tr, '', 'actions').append(
		button('Requeue head', () => headAction(table, id, what, 'requeue', 'Requeue ' + table + ' row ' + id +
			' as it is? ' + what + ' goes on after it.')),
		button('Skip head', () => headAction(table, id, what, 'skip', 'Skip ' + table + ' row ' + id +
			'? It stays dead and ' + what + ' goes on without it.')));
}

function openKeys() {
	show('keys');
	loadKeys();
}

async function loadKeys() {
	const [keys, aggs] = await Promise.all([api('GET', '/admin/outbox/held?limit=1000'),
		api('GET', '/admin/inbox/held?limit=1000')]);
	if (keys == null || aggs == null)
		return;
	if (!keys.ok) {
		problem('held keys: ' + reason(keys));
		return;
	}
	fill('held', keys.data, (tr, k) => {
		cell(tr, k.key);
		cell(tr, k.destination);
		headLink(tr, 'outbox', k.head_id);
		cell(tr, k.head_state, 'head-' + k.head_state);
		cell(tr, k.behind, 'num');
		cell(tr, k.since);
		if (k.head_state === 'dead')
			headButtons(tr, 'outbox', k.head_id, 'key ' + k.key);
		else
			cell(tr, '');
	});
	$('keys-info').textContent = keys.data.length === 0 ? 'No key is held.' : '';
	/* a server without the inbox's route (404) has no held aggregates to show */
	const held = aggs.ok ? aggs.data : [];
	fill('held-aggregates', held, (tr, g) => {
		cell(tr, g.aggregate_id);
		cell(tr, g.source);
		headLink(tr, 'inbox', g.head_id);
		cell(tr, g.behind, 'num');
		cell(tr, g.since);
		headButtons(tr, 'inbox', g.head_id, 'aggregate ' + g.aggregate_id);
	});
	$('aggregates-info').textContent = !aggs.ok ? 'held aggregates: ' + reason(aggs) :
		held.length === 0 ? 'No aggregate is held.' : '';
}

/* ---- inbox lookup -------------------------------------------------- */

function openLookup() {
	show('lookup');
}

async function lookup(ev) {
	ev.preventDefault();
	const q = Object.fromEntries(new FormData(ev.target));
	const r = await api('GET', '/admin/inbox/lookup' + query(q));

	if (r == null)
		return;
	fields('lookup-fields', []);
	$('lookup-payload').hidden = true;
	if (r.status === 404) {
		$('lookup-answer').textContent = 'Did not arrive: ' + text(r.data.reason || r.data.error);
		$('lookup-answer').className = 'absent';
		return;
	}
	if (!r.ok) {
		$('lookup-answer').textContent = '';
		problem('lookup: ' + reason(r));
		return;
	}
	const d = r.data;
	$('lookup-answer').textContent = 'Arrived: inbox row ' + d.id;
	$('lookup-answer').className = 'present';
	const link = document.createElement('a');
	link.href = '#/inbox/' + encodeURIComponent(d.id);
	link.textContent = 'open row ' + d.id;
	$('lookup-answer').append(' (', link, ')');
	fields('lookup-fields', [['State', d.state], ['Received', d.created_at], ['Event type', d.event_type],
		['Aggregate id', d.aggregate_id], ['Attempts', d.attempt], ['Last error', d.last_error]]);
	$('lookup-payload').textContent = pretty(d.payload);
	$('lookup-payload').hidden = false;
}

/* ---- login --------------------------------------------------------- */

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
		start();
		return;
	}
	let why = res.statusText;

	try { why = (await res.json()).reason; } catch (e) { /* not JSON */ }
	$('login-error').textContent = why;
}

async function logout() {
	clearTimeout(timer);
	try {
		await fetch('/console/logout', { method: 'POST', credentials: 'same-origin', headers: CSRF });
	} finally {
		previous = null;
		show('login');
	}
}

document.addEventListener('DOMContentLoaded', () => {
	$('login').addEventListener('submit', login);
	$('logout').addEventListener('click', logout);
	$('filter-outbox').addEventListener('submit', search);
	$('filter-inbox').addEventListener('submit', search);
	$('next-page').addEventListener('click', nextPage);
	$('first-page').addEventListener('click', firstPage);
	$('do-requeue').addEventListener('click', () => rowAction('requeue', 'Requeue ' + current.table +
		' row ' + current.row.id + ' as it is?'));
	$('do-replay').addEventListener('click', () => rowAction('replay', 'Replay ' + current.table +
		' row ' + current.row.id + ' as a new row?'));
	$('do-skip').addEventListener('click', () => rowAction('skip', 'Skip ' + current.table + ' row ' +
		current.row.id + '? It stays dead and its key goes on without it.'));
	$('do-edit').addEventListener('click', editPayload);
	$('edit').addEventListener('submit', sendEdited);
	$('edit-cancel').addEventListener('click', () => { $('edit').hidden = true; });
	$('lookup-form').addEventListener('submit', lookup);
	window.addEventListener('hashchange', route);
	start();
});

/* the first look: logged in (else the login form), the source names for the lookup's list */
async function start() {
	const r = await api('GET', '/admin/overview');
	if (r == null)
		return;
	if (r.ok)
		render(r.data);
	route();
}
