// The console in headless Chromium (test/t/console/052_console.pl runs it and sets
// the rows up; console-page.js launches it). The tests run in order, on one
// page, as one operator would.
// Env: QB_CONSOLE_URL, QB_ADMIN_TOKEN, QB_XSS (markup: the down
// destination's last_error, and the payload, a header and the error of dead
// outbox row QB_XSS_ID), QB_HELD_HEAD (the dead head of key cust-7, two rows
// behind it), QB_SKIP_HEAD (the dead head of key cust-9), QB_SINK_LOG (the
// HTTP sink's JSONL log), QB_WEBHOOK_KEY (an idempotency key the stripe
// source received), QB_CONSOLE_SCREENSHOTS (a folder: save the pages'
// screenshots there).
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { launch, until, login, search: searchIn, cellsOf: cellsIn, lookup } = require('./console-page');

const base = process.env.QB_CONSOLE_URL;
const token = process.env.QB_ADMIN_TOKEN;
const xss = process.env.QB_XSS;
const xssId = process.env.QB_XSS_ID;
const heldHead = process.env.QB_HELD_HEAD;
const skipHead = process.env.QB_SKIP_HEAD;
const aggHead = process.env.QB_AGG_HEAD;
const sinkLog = process.env.QB_SINK_LOG;
const webhookKey = process.env.QB_WEBHOOK_KEY;
const shots = process.env.QB_CONSOLE_SCREENSHOTS;
let browser;
let page;
let violations;
let posts;					/* every POST the page sent, as its path */
let asked;					/* every dialog's question */
let dialogs;				/* how the next confirm() or prompt() is answered */

async function shot(name) {
	if (shots)
		await page.screenshot({ path: path.join(shots, name), fullPage: true });
}

/* the sink's 2xx requests for key, as seq, with "e" for an edited body */
function delivered(key) {
	const out = [];
	for (const line of fs.readFileSync(sinkLog, 'utf8').split('\n')) {
		if (line === '')
			continue;
		const r = JSON.parse(line);
		let b;
		try { b = JSON.parse(r.body); } catch (e) { continue; }
		if (r.status >= 200 && r.status < 300 && b.key === key)
			out.push(b.seq + (b.edited ? 'e' : ''));
	}
	return out;
}

const search = (tbl, values) => searchIn(page, tbl, values);
const cellsOf = (selector) => cellsIn(page, selector);

before(async () => {
	({ browser, page, violations, posts, asked, dialogs } = await launch());
});

after(async () => {
	await browser?.close();
});

test('without the token: the login form, and the API refuses', async () => {
	await page.goto(base + '/console');
	await page.locator('#login').waitFor({ state: 'visible' });
	assert.equal(await page.locator('#overview').isVisible(), false);
	assert.equal(await page.locator('#nav').isVisible(), false);
	const status = await page.evaluate(async () => (await fetch('/admin/overview')).status);
	assert.equal(status, 401);
	await shot('console-login.png');
});

test('a wrong token is refused with the reason', async () => {
	await page.fill('#token', 'wrong-token-0123456789');
	await page.click('#login button[type=submit]');
	await page.locator('#login-error').filter({ hasText: 'admin authentication failed' }).waitFor();
	assert.equal(await page.locator('#overview').isVisible(), false);
	assert.equal(await page.inputValue('#token'), '', 'the field is cleared');
});

test('login shows the overview: the down destination open', async () => {
	await login(page, token);
	const row = page.locator('#destinations tbody tr', { hasText: 'down' });
	await row.waitFor();
	assert.equal(await row.locator('td').nth(1).textContent(), 'open');
	assert.equal(await row.locator('td').nth(3).textContent(), '1', 'one row pending');
	assert.equal(await page.locator('#sources tbody tr td').first().textContent(), 'stripe');
	assert.equal(await page.evaluate(() => document.cookie.includes('queuebox_admin')), false,
		'the session cookie is HttpOnly');
});

test('markup in an error is shown as text: no script runs', async () => {
	const cell = page.locator('#destinations tbody tr', { hasText: 'down' }).locator('td.error');
	assert.equal(await cell.textContent(), xss);
	assert.equal(await cell.locator('script, img').count(), 0, 'no element was made from it');
	assert.equal(await page.evaluate(() => window.qbPwned), undefined, 'no handler ran');
	// it refreshes itself: the same page, a later update, still text
	const first = await page.textContent('#updated');
	await page.waitForFunction((t) => document.getElementById('updated').textContent !== t, first);
	assert.equal(await cell.textContent(), xss);
	assert.equal(await page.evaluate(() => window.qbPwned), undefined);
	assert.deepEqual(violations, [], 'the page needs nothing the CSP blocks');
	const workers = await page.evaluate(async () => (await (await fetch('/admin/overview')).json()).workers);
	if (Array.isArray(workers) && workers.length > 0)
		await page.locator('#workers tbody tr').first().waitFor();
	assert.equal(await page.locator('#workers-part').isVisible(), Array.isArray(workers),
		'the workers table is there when the overview has workers');
	await shot('console-overview.png');
});

test('destination actions: each asks first; pause, reset, resume call their routes', async () => {
	const row = page.locator('#destinations tbody tr', { hasText: 'shop' });
	const n = posts.length;

	// a dismissed question sends nothing
	Object.assign(dialogs, { accept: false });
	await row.getByRole('button', { name: 'Reset circuit' }).click();
	await row.getByRole('button', { name: 'Pause' }).click();
	await until('the questions', () => asked.length >= 2);
	assert.deepEqual(posts.slice(n), [], 'nothing was sent');

	Object.assign(dialogs, { accept: true, text: '10' });
	await row.getByRole('button', { name: 'Pause' }).click();
	await page.locator('#result').filter({ hasText: 'paused shop' }).waitFor();
	assert.match(await page.textContent('#result'), /"paused_until":"[^"]+"/);
	assert.match(await page.textContent('#result'), /"known":true/);
	await page.locator('#destinations tbody tr', { hasText: 'shop' }).getByRole('button', { name: 'Reset circuit' }).click();
	await page.locator('#result').filter({ hasText: '/admin/destinations/shop/reset' }).waitFor();
	await page.locator('#destinations tbody tr', { hasText: 'shop' }).getByRole('button', { name: 'Resume' }).click();
	await page.locator('#result').filter({ hasText: '/admin/destinations/shop/resume' }).waitFor();
	assert.match(await page.textContent('#result'), /"known":true/);
	assert.deepEqual(posts.slice(n), ['/admin/destinations/shop/pause', '/admin/destinations/shop/reset',
		'/admin/destinations/shop/resume']);
	assert.match(asked[asked.length - 1], /Resume shop\?/);
});

test('dead letters: filters, pages of rows, next page', async () => {
	await page.click('#nav a[data-view=dead]');
	await page.locator('#dead').waitFor({ state: 'visible' });
	assert.equal(await page.locator('#overview').isVisible(), false);
	await search('outbox', { topic: 'bulk.x' });
	await page.locator('#page-info').filter({ hasText: 'page 1: 50 rows' }).waitFor();
	const firstIds = (await cellsOf('#dead-outbox tbody tr')).map((c) => Number(c[0]));
	assert.equal(firstIds.length, 50);
	assert.deepEqual(firstIds, [...firstIds].sort((a, b) => a - b), 'oldest first');
	await page.click('#next-page');
	await page.locator('#page-info').filter({ hasText: 'page 2: 5 rows' }).waitFor();
	const next = (await cellsOf('#dead-outbox tbody tr')).map((c) => Number(c[0]));
	assert.equal(next.length, 5);
	assert.ok(next[0] > firstIds[49], 'the next page starts after the last id');
	assert.equal(await page.locator('#next-page').isDisabled(), true, 'no page after the last');
	await page.click('#first-page');
	await page.locator('#page-info').filter({ hasText: 'page 1: 50 rows' }).waitFor();

	// the held key's dead head, by key and error text
	await search('outbox', { key: 'cust-7', error: '500' });
	await page.locator('#page-info').filter({ hasText: 'page 1: 1 row,' }).waitFor();
	const [row] = await cellsOf('#dead-outbox tbody tr');
	assert.equal(row[0], heldHead);
	assert.equal(row[2], 'shop');
	assert.equal(row[4], 'cust-7');
	assert.equal(row[7], 'yes', 'it holds its key');
	await shot('console-dead.png');

	await search('outbox', { key: 'cust-7', error: 'no such error text' });
	await page.locator('#page-info').filter({ hasText: 'no dead outbox rows match these filters' }).waitFor();

	// a filter the server refuses: its reason, as text
	await search('outbox', { since: 'yesterday <b>' });
	await page.locator('#error').filter({ hasText: '400' }).waitFor();
	assert.match(await page.textContent('#error'), /since/);
	assert.equal(await page.locator('#error b').count(), 0);
});

test('keys: the held key, its head and the rows behind; skip a head', async () => {
	await page.click('#nav a[data-view=keys]');
	const row = page.locator('#held tbody tr', { hasText: 'cust-7' });
	await row.waitFor();
	const cells = await row.locator('td').allTextContents();
	assert.deepEqual(cells.slice(0, 5), ['cust-7', 'shop', heldHead, 'dead', '2']);
	assert.ok(cells[5] !== '', 'since when');
	await shot('console-keys.png');

	const skip = page.locator('#held tbody tr', { hasText: 'cust-9' });
	await skip.getByRole('button', { name: 'Skip head' }).click();
	await page.locator('#result').filter({ hasText: 'skip outbox row ' + skipHead }).waitFor();
	assert.match(await page.textContent('#result'), /"skipped":true/);
	await page.locator('#held tbody tr', { hasText: 'cust-9' }).waitFor({ state: 'detached' });

	// the head's link opens its detail
	await page.locator('#held tbody tr', { hasText: 'cust-7' }).getByRole('link', { name: heldHead }).click();
	await page.locator('#detail').waitFor({ state: 'visible' });
	assert.equal(await page.textContent('#detail-title'), 'outbox row ' + heldHead);
});

test('keys: a held aggregate (the relay\'s order), its head; skip it', async () => {
	await page.click('#nav a[data-view=keys]');
	const row = page.locator('#held-aggregates tbody tr', { hasText: 'acct-4' });
	await row.waitFor();
	const cells = await row.locator('td').allTextContents();
	assert.deepEqual(cells.slice(0, 4), ['acct-4', 'ledger', aggHead, '1']);
	assert.ok(cells[4] !== '', 'since when');
	const n = posts.length;
	await row.getByRole('button', { name: 'Skip head' }).click();
	await page.locator('#result').filter({ hasText: 'skip inbox row ' + aggHead }).waitFor();
	assert.match(await page.textContent('#result'), /"skipped":true/);
	assert.deepEqual(posts.slice(n), ['/admin/inbox/' + aggHead + '/skip']);
	await page.locator('#held-aggregates tbody tr', { hasText: 'acct-4' }).waitFor({ state: 'detached' });
	await page.locator('#aggregates-info').filter({ hasText: 'No aggregate is held.' }).waitFor();
});

test('a dead row: payload, headers, attempts, error; edit its payload, requeue, delivered in key order', async () => {
	await page.goto(base + '/console#/dead/outbox');
	await search('outbox', { key: 'cust-7' });
	await page.locator('#page-info').filter({ hasText: 'page 1: 1 row,' }).waitFor();
	await page.click('#dead-outbox tbody tr');
	await page.locator('#detail-title').filter({ hasText: 'outbox row ' + heldHead }).waitFor();
	await page.locator('#detail-fields').filter({ hasText: 'cust-7' }).waitFor();
	const payload = JSON.parse(await page.textContent('#detail-payload'));
	assert.deepEqual(payload, { key: 'cust-7', seq: 0, _sink: { status: 500 } });
	assert.match(await page.textContent('#detail-fields'), /Attempts1 \/ 1/);
	assert.match(await page.textContent('#detail-fields'), /500/);
	assert.equal(await page.locator('#do-skip').isVisible(), true, 'it holds its key: skip is offered');

	// not JSON: refused in the page, nothing sent
	const n = posts.length;
	await page.click('#do-edit');
	assert.deepEqual(JSON.parse(await page.inputValue('#edit-payload')), payload, 'the editor starts from the payload');
	await page.fill('#edit-payload', '{"key": "cust-7", "seq": 0,');
	await page.click('#edit button[type=submit]');
	await page.locator('#error').filter({ hasText: 'the edited payload is not JSON' }).waitFor();
	assert.deepEqual(posts.slice(n), [], 'nothing was sent');
	await shot('console-edit.png');

	await page.fill('#edit-payload', '{"key": "cust-7", "seq": 0, "edited": true}');
	await page.click('#edit button[type=submit]');
	await page.locator('#result').filter({ hasText: 'requeue outbox row ' + heldHead }).waitFor();
	assert.match(await page.textContent('#result'), /"requeued":true/);
	assert.deepEqual(posts.slice(n), ['/admin/outbox/' + heldHead + '/requeue']);
	assert.match(asked[asked.length - 1], /edited payload/);

	// the endpoint gets the edited head first, then the rest of the key in order
	await until('the sink to receive cust-7\'s three rows', () => delivered('cust-7').length >= 3);
	assert.deepEqual(delivered('cust-7'), ['0e', '1', '2']);

	// the row again: sent, the edit in its audit (who, when, before, after)
	await until('the row to show sent', async () => {
		await page.reload();
		await page.locator('#detail-fields').filter({ hasText: 'cust-7' }).waitFor();
		return /Statesent/.test(await page.textContent('#detail-fields'));
	});
	const [audit] = await cellsOf('#detail-audit tbody tr');
	assert.equal(audit[0], 'requeue');
	assert.ok(audit[1] !== '' && audit[2] !== '', 'who and when');
	assert.deepEqual(JSON.parse(audit[3]), payload, 'the payload before');
	assert.deepEqual(JSON.parse(audit[4]), { key: 'cust-7', seq: 0, edited: true }, 'the payload after');
	assert.equal(await page.locator('#do-requeue').isDisabled(), true, 'a sent row is not requeued');
	await shot('console-detail.png');
});

test('markup in a payload, a header and an error is shown as text', async () => {
	await page.goto(base + '/console#/outbox/' + xssId);
	await page.locator('#detail-fields').filter({ hasText: 'xss-1' }).waitFor();
	assert.equal(JSON.parse(await page.textContent('#detail-payload')).note, xss);
	const [header] = await cellsOf('#detail-headers tbody tr');
	assert.deepEqual(header, ['X-Note', xss]);
	assert.ok((await page.textContent('#detail-fields')).includes(xss), 'the last error');
	assert.equal(await page.locator('#detail script, #detail img').count(), 0, 'no element was made from it');
	assert.equal(await page.evaluate(() => window.qbPwned), undefined, 'no handler ran');
	// in the list too
	await page.goto(base + '/console#/dead/outbox');
	await search('outbox', { key: 'xss-1' });
	await page.locator('#dead-outbox tbody tr td.error').filter({ hasText: xss }).waitFor();
	assert.equal(await page.locator('#dead script, #dead img').count(), 0);
	assert.equal(await page.evaluate(() => window.qbPwned), undefined);
	assert.deepEqual(violations, []);
});

test('dead inbox rows: the inbox tab, its filters, a row', async () => {
	await page.click('#tab-inbox');
	await page.locator('#filter-inbox').waitFor({ state: 'visible' });
	assert.equal(await page.locator('#filter-outbox').isVisible(), false);
	await search('inbox', { source: 'stripe', event_type: 'charge.failed' });
	await page.locator('#page-info').filter({ hasText: 'page 1: 1 row,' }).waitFor();
	const [row] = await cellsOf('#dead-inbox tbody tr');
	assert.deepEqual(row.slice(2, 6), ['stripe', 'charge.failed', 'evt_dead_1', 'cus_1']);
	assert.equal(row[7], 'the consumer failed: timeout');
	await shot('console-dead-inbox.png');
	await page.click('#dead-inbox tbody tr');
	await page.locator('#detail-fields').filter({ hasText: 'evt_dead_1' }).waitFor();
	assert.deepEqual(JSON.parse(await page.textContent('#detail-payload')), { id: 'evt_dead_1', type: 'charge.failed' });
	assert.equal(await page.locator('#do-requeue').isDisabled(), false);
});

test('inbox lookup: a webhook that arrived, and one that did not', async () => {
	await page.click('#nav a[data-view=lookup]');
	await lookup(page, 'stripe', webhookKey);
	await page.locator('#lookup-answer').filter({ hasText: 'Arrived: inbox row' }).waitFor();
	assert.match(await page.textContent('#lookup-fields'), /Statepending/);
	assert.equal(JSON.parse(await page.textContent('#lookup-payload')).id, webhookKey);
	await shot('console-lookup.png');

	await lookup(page, 'stripe', 'evt_never_sent');
	await page.locator('#lookup-answer').filter({ hasText: 'Did not arrive' }).waitFor();
	assert.match(await page.textContent('#lookup-answer'), /evt_never_sent/);
	assert.equal(await page.locator('#lookup-payload').isVisible(), false);
});

test('logout ends the session', async () => {
	await page.click('#logout');
	await page.locator('#login').waitFor({ state: 'visible' });
	const status = await page.evaluate(async () => (await fetch('/admin/overview')).status);
	assert.equal(status, 401);
	await page.reload();
	await page.locator('#login').waitFor({ state: 'visible' });
	assert.equal(await page.locator('#dead').isVisible(), false);
	assert.deepEqual(violations, [], 'no page needed anything the CSP blocks');
});
