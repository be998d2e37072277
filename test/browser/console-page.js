// What the console's browser tests share (console.test.js, TAP 052, and
// console-daemon.test.js, TAP 030): Debian's chromium launched headless by
// playwright-core (no browser download), one page watched for CSP
// violations, POSTs and dialogs, and the page's common steps.
'use strict';

const assert = require('node:assert/strict');
const { chromium } = require('playwright-core');

/*
 * launch(): { browser, page, violations (CSP reports), posts (every POST's
 * path), asked (every dialog's text), dialogs ({accept, text}: how the next
 * confirm() or prompt() is answered; change its fields) }
 */
async function launch() {
	const browser = await chromium.launch({
		executablePath: '/usr/bin/chromium',
		args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
	});
	const page = await browser.newPage({ viewport: { width: 1280, height: 560 } });
	const s = { browser, page, violations: [], posts: [], asked: [], dialogs: { accept: true, text: '' } };

	// a script blocked by the CSP is reported here: there must be none
	page.on('console', (m) => {
		if (/Content Security Policy/i.test(m.text()))
			s.violations.push(m.text());
	});
	// for a failure's diagnosis: what the page threw, and requests that failed
	page.on('pageerror', (e) => console.error('page error: ' + e.message));
	page.on('requestfailed', (r) => console.error('request failed: ' + r.url() + ' ' + r.failure()?.errorText));
	page.on('response', (r) => {
		if (r.status() >= 400)
			console.error('answer ' + r.status() + ': ' + r.request().method() + ' ' + r.url());
	});
	page.on('request', (r) => {
		if (r.method() === 'POST')
			s.posts.push(new URL(r.url()).pathname);
	});
	page.on('dialog', (d) => {
		s.asked.push(d.message());
		if (!s.dialogs.accept)
			d.dismiss();
		else
			d.accept(d.type() === 'prompt' ? s.dialogs.text : undefined);
	});
	return s;
}

/* poll fn until it answers something true; fail after ms */
async function until(what, fn, ms = 60000) {
	const end = Date.now() + ms;
	for (;;) {
		const v = await fn();
		if (v)
			return v;
		if (Date.now() > end)
			assert.fail('waited ' + ms / 1000 + ' s for ' + what);
		await new Promise((r) => setTimeout(r, 200));
	}
}

/* log in with token from the login form; the overview shows */
async function login(page, token) {
	await page.fill('#token', token);
	await page.click('#login button[type=submit]');
	await page.locator('#overview').waitFor({ state: 'visible' });
}

/* a dead-letter search: every filter of the tab set (to '' when not given) */
async function search(page, tbl, values) {
	const form = page.locator('#filter-' + tbl);
	for (const input of await form.locator('input').all())
		await input.fill(values[await input.getAttribute('name')] ?? '');
	await form.locator('button[type=submit]').click();
}

/* the text of each cell of the rows selector matches, row by row */
async function cellsOf(page, selector) {
	return page.locator(selector).evaluateAll((rows) => rows.map((tr) =>
		Array.from(tr.cells, (td) => td.textContent)));
}

/* an inbox lookup from the lookup page */
async function lookup(page, source, key) {
	const form = page.locator('#lookup-form');
	await form.locator('input[name=source]').fill(source);
	await form.locator('input[name=idempotency_key]').fill(key);
	await form.locator('button[type=submit]').click();
}

module.exports = { launch, until, login, search, cellsOf, lookup };
