// The console on the daemon's ingress role, in headless Chromium
// (test/t/daemon/030_daemon_inbox.pl runs it; console-page.js launches it): the
// pages read through the libpq store.  TAP 052 has the whole scenario on the
// extension; test/t/sqlserver/031_mssql.pl runs it on SQL Server through the ODBC
// store.  Env: QB_CONSOLE_URL, QB_ADMIN_TOKEN, QB_DEAD_ID (the dead pull row
// of source tasks, last error "poison"), QB_WEBHOOK_KEY (an idempotency key
// the tasks source received), QB_DESTINATIONS (the destinations' names,
// comma-separated; default bus,web).
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { launch, login, search, cellsOf, lookup } = require('./console-page');

const base = process.env.QB_CONSOLE_URL;
const token = process.env.QB_ADMIN_TOKEN;
const deadId = process.env.QB_DEAD_ID;
const webhookKey = process.env.QB_WEBHOOK_KEY;
const destinations = (process.env.QB_DESTINATIONS || 'bus,web').split(',');
let s;

before(async () => {
	s = await launch();
});

after(async () => {
	await s?.browser.close();
});

test('login, then the overview of the daemon', async () => {
	await s.page.goto(base + '/console');
	await login(s.page, token);
	const names = await s.page.locator('#destinations tbody tr td:first-child').allTextContents();
	assert.deepEqual(names, destinations);
});

test('the dead pull row, found by source, and its page', async () => {
	const page = s.page;
	await page.goto(base + '/console#/dead/inbox');
	await search(page, 'inbox', { source: 'tasks', error: 'poison' });
	await page.locator('#page-info').filter({ hasText: 'page 1: 1 row,' }).waitFor();
	const [row] = await cellsOf(page, '#dead-inbox tbody tr');
	assert.equal(row[0], deadId);
	assert.equal(row[2], 'tasks');
	await page.click('#dead-inbox tbody tr');
	await page.locator('#detail-title').filter({ hasText: 'inbox row ' + deadId }).waitFor();
	await page.locator('#detail-fields').filter({ hasText: 'poison' }).waitFor();
	const payload = await page.textContent('#detail-payload');
	assert.doesNotThrow(() => JSON.parse(payload), 'its payload, as JSON');
});

test('an inbox lookup', async () => {
	const page = s.page;
	await page.click('#nav a[data-view=lookup]');
	await lookup(page, 'tasks', webhookKey);
	await page.locator('#lookup-answer').filter({ hasText: 'Arrived: inbox row' }).waitFor();
	await lookup(page, 'tasks', 'never-sent');
	await page.locator('#lookup-answer').filter({ hasText: 'Did not arrive' }).waitFor();
	assert.deepEqual(s.violations, [], 'no page needed anything the CSP blocks');
});
