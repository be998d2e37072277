// The console in headless Chromium (test/t/052_console.pl runs it).
// Debian's chromium, driven by playwright-core: no browser download.
// Env: QB_CONSOLE_URL, QB_ADMIN_TOKEN, QB_XSS (the down destination's
// last_error, markup in it), QB_CONSOLE_SCREENSHOTS (a folder: save the
// pages' screenshots there).
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { chromium } = require('playwright-core');

const base = process.env.QB_CONSOLE_URL;
const token = process.env.QB_ADMIN_TOKEN;
const xss = process.env.QB_XSS;
const shots = process.env.QB_CONSOLE_SCREENSHOTS;
let browser;
let page;
const violations = [];

async function shot(name) {
	if (shots)
		await page.screenshot({ path: path.join(shots, name), fullPage: true });
}

before(async () => {
	browser = await chromium.launch({
		executablePath: '/usr/bin/chromium',
		args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
	});
	page = await browser.newPage({ viewport: { width: 1280, height: 560 } });
	// a script blocked by the CSP is reported here: there must be none
	page.on('console', (m) => {
		if (/Content Security Policy/i.test(m.text()))
			violations.push(m.text());
	});
});

after(async () => {
	await browser?.close();
});

test('without the token: the login form, and the API refuses', async () => {
	await page.goto(base + '/console');
	await page.locator('#login').waitFor({ state: 'visible' });
	assert.equal(await page.locator('#overview').isVisible(), false);
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
	await page.fill('#token', token);
	await page.click('#login button[type=submit]');
	await page.locator('#overview').waitFor({ state: 'visible' });
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
	await shot('console-overview.png');
});

test('logout ends the session', async () => {
	await page.click('#logout');
	await page.locator('#login').waitFor({ state: 'visible' });
	const status = await page.evaluate(async () => (await fetch('/admin/overview')).status);
	assert.equal(status, 401);
	await page.reload();
	await page.locator('#login').waitFor({ state: 'visible' });
});
