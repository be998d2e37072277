# 065_mssql_trace.pl
#   SQL Server carries trace context as PostgreSQL does (issue 40, part 2;
#   docs/sqlserver.md "Trace context", docs/observability.md), on
#   QUEUEBOX_TEST_MSSQL_URL (skipped, saying why, when it is not set), with
#   queuebox-mssqld delivering to the real sink and exporting spans to a
#   real OTLP receiver (test/node/otlp_receiver.mjs):
#   - docs/sqlserver.md's example, as written there: the business write and
#     the outbox row commit together; the row carries the session's
#     traceparent and tracestate beside its own header; the sink's request
#     carries a child of it (same trace, a span id of its own) and the
#     exported delivery span, with that span id, has the session's span id
#     as its parent;
#   - the same transaction rolled back: neither the business write nor the
#     row; a malformed traceparent or tracestate: the insert refused with
#     the format, the business write rolled back with it;
#   - a row's own traceparent (any letter case) wins; every row of a
#     several-row INSERT takes the session's; no context or an empty one:
#     no header;
#   - a member of queuebox_writer (INSERT and SELECT only) gets its rows
#     traced;
#   - the relay's forward span is the child of the webhook's traceparent
#     (_relay_claim returns it: schema 0.3.6).
#   Every case counts rows before and after.  The suite drops and recreates
#   schema queuebox (and dbo.orders) in the database the URL names.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxMssql;

BEGIN { QueueBoxMssql::mssql_skip_unless_url(); }

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use QueueBoxTest;
use QueueBoxDaemon;
use QueueBoxOtlp;

qb_mssql_alone();
my $url = mssql_url();
my $dbh = mssql_connect($url);
my $json = JSON::PP->new->canonical(1);
my $http = HTTP::Tiny->new(timeout => 30, keep_alive => 0);
my $sink = qb_sink_start(name => 'mssql_trace');
my $babelfish = defined mssql_value($dbh, q{SELECT CAST(SERVERPROPERTY('BabelfishVersion') AS NVARCHAR(20))});
my $TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
my $SPAN = '00f067aa0ba902b7';
my $TP = "00-$TRACE-$SPAN-01";
my $TS = 'congo=t61rcWkgMzE';

# ---- an OTLP receiver (as TAP 056 runs it), stopped at the end
my $rx = otlp_receiver();

sub count
{
	my ($table, $where, @bind) = @_;
	return mssql_value($dbh, "SELECT COUNT(*) FROM $table" . ($where ? " WHERE $where" : ''), @bind);
}

sub headers_of
{
	my ($where, @bind) = @_;
	return [ map { $json->decode($_->[0]) }
		  @{ mssql_rows($dbh, "SELECT headers FROM queuebox.outbox WHERE $where ORDER BY id", @bind) } ];
}

# a batch of several statements, each run and its results read (a driver
# that stopped at the first result would leave the rest unrun)
sub batch
{
	my ($sql, @bind) = @_;
	my $sth = $dbh->prepare($sql);
	$sth->execute(@bind);
	do { 1 while $sth->{NUM_OF_FIELDS} && $sth->fetchrow_arrayref } while ($sth->{odbc_more_results});
	return;
}

sub context
{
	my ($tp, $ts) = @_;
	mssql_do($dbh, q{EXEC sp_set_session_context N'queuebox.traceparent', ?}, $tp);
	mssql_do($dbh, q{EXEC sp_set_session_context N'queuebox.tracestate', ?}, $ts);
	return;
}

# ---- the daemon: its schema, delivery to the sink, a webhook source, spans
mssql_reset($dbh);
my $port = qb_free_port();
my $yaml = qb_config_yaml(
	outbox => { pollIntervalMs => 100 },
	destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/in', timeoutMs => 3000 } },
	routes => [ { topicPattern => '**', destination => 'web' } ],
	database => { url => $url, connectTimeoutMs => 3000, idlePollMaxMs => 500 },
	daemon => { outboxWorkers => 1, shutdownGraceMs => 5000 },
	telemetry => { otlp => { endpoint => "http://127.0.0.1:$rx->{port}", flushIntervalMs => 100, timeoutMs => 2000 } })
  # a TDS engine compiles each procedure on a session's first call (docs/sqlserver.md)
  . "http: { listen: \"127.0.0.1:$port\", storeTimeoutMs: " . ($babelfish ? 30000 : 5000) . " }\n"
  . "sources:\n  shop: { type: http, path: /shop, idempotencyKeyPath: \$.id, eventTypePath: \$.type,"
  . " topic: \"shop.{{ eventType }}\" }\n"
  . "inbox:\n  relay: { pollIntervalMs: 50 }\n";
my $d = qbd_start(undef, $yaml, name => 'mssql_trace');
qb_wait_for(sub { ($http->get("http://127.0.0.1:$port/readyz")->{status} // 0) == 200 },
	'the daemon made its schema and is ready', timeout => 60);
is(mssql_value($dbh, 'SELECT queuebox._schema_version()'), $QB_LATEST, "schema $QB_LATEST (0.3.6 or later)");
mssql_do($dbh, q{IF OBJECT_ID(N'dbo.orders') IS NOT NULL DROP TABLE dbo.orders});
mssql_do($dbh, q{CREATE TABLE dbo.orders (id INT PRIMARY KEY, status NVARCHAR(20) NOT NULL)});
mssql_do($dbh, q{INSERT INTO dbo.orders (id, status) VALUES (42, N'new'), (43, N'new')});

# ---- docs/sqlserver.md's example, as written there
my ($example) = slurp_file("$FindBin::RealBin/../../../docs/sqlserver.md")
  =~ /^### Trace context\n.*?^<!-- doc-test: skip \(needs SQL Server: TAP 065[^\n]*-->\n```sql\n(.*?)^```$/ms;
ok($example, 'docs/sqlserver.md has the trace context example');
batch($example);
is(mssql_value($dbh, q{SELECT status FROM dbo.orders WHERE id = 42}), 'paid', 'the example: the business write committed');
my $h = headers_of(q{[key] = N'order-42'});
is(scalar(@$h), 1, 'the example: its outbox row committed with it');
is($json->encode($h->[0]), $json->encode({ 'X-Correlation-Id' => 'c-42', traceparent => $TP, tracestate => $TS }),
	'the row carries the session\'s traceparent and tracestate beside its own header');
is(mssql_value($dbh, q{SELECT CAST(SESSION_CONTEXT(N'queuebox.traceparent') AS NVARCHAR(100))}), undef,
	'the example clears the session\'s context');

# the delivery: a child of the session's context, at the sink and in the spans
my $mid = lc mssql_value($dbh, q{SELECT CONVERT(NVARCHAR(36), message_id) FROM queuebox.outbox WHERE [key] = N'order-42'});
my $req;
qb_wait_for(sub { ($req) = grep { $_->{mid} eq $mid } @{ qb_sink_requests($sink) }; $req },
	'the sink gets the row', timeout => 60);
my ($req_span) = ($req->{headers}{traceparent} // '') =~ /^00-$TRACE-([0-9a-f]{16})-01$/;
ok($req_span && $req_span ne $SPAN, 'the request\'s traceparent: the session\'s trace, a span id of its own')
  or diag "traceparent: " . ($req->{headers}{traceparent} // 'none');
is($req->{headers}{tracestate}, $TS, 'the request carries the session\'s tracestate');
my $sp;
qb_wait_for(sub { ($sp) = grep { $_->{name} eq 'deliver web' && $_->{traceId} eq $TRACE } @{ otlp_spans($rx) }; $sp },
	'the delivery\'s span is exported', timeout => 30);
is("$sp->{spanId} $sp->{parentSpanId}", ($req_span // '?') . " $SPAN",
	'the delivery span is the request\'s traceparent, and its parent is the session\'s span');
is($sp->{traceState}, $TS, 'with the session\'s tracestate');

# ---- rolled back together
{
	my $n = count('queuebox.outbox');
	context($TP, undef);
	batch(q{BEGIN TRANSACTION; UPDATE dbo.orders SET status = N'paid' WHERE id = 43;
		INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'orders.paid', N'order-43', N'{"id": 43}');
		ROLLBACK;});
	is(count('queuebox.outbox') . ' ' . mssql_value($dbh, q{SELECT status FROM dbo.orders WHERE id = 43}), "$n new",
		'rolled back: neither the outbox row nor the business write');
}

# ---- a malformed context: refused with the format, the business write with it
for my $bad ([ 'an upper-case traceparent', uc($TP), undef, qr/not a valid traceparent: "\Q${\ uc($TP)}\E"\. A traceparent is 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>, lower case, ids not all zero/ ],
	[ 'a traceparent with a blank after it', "$TP ", undef, qr/not a valid traceparent/ ],
	[ 'an all-zero trace id', '00-' . ('0' x 32) . "-$SPAN-01", undef, qr/not a valid traceparent/ ],
	[ 'version ff', "ff-$TRACE-$SPAN-01", undef, qr/not a valid traceparent/ ],
	[ 'a tracestate with a quote', $TP, 'a="b"', qr/not a valid tracestate\. A tracestate is at most 512 printable ASCII characters/ ])
{
	my ($what, $tp, $ts, $re) = @$bad;
	my $n = count('queuebox.outbox');
	context($tp, $ts);
	eval {
		batch(q{BEGIN TRANSACTION; UPDATE dbo.orders SET status = N'paid' WHERE id = 43;
			INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'orders.paid', N'order-43', N'{"id": 43}');
			COMMIT;});
	};
	like($@, $re, "$what: the insert is refused, saying the format");
	mssql_do($dbh, q{IF @@TRANCOUNT > 0 ROLLBACK});
	is(count('queuebox.outbox') . ' ' . mssql_value($dbh, q{SELECT status FROM dbo.orders WHERE id = 43}), "$n new",
		"$what: no outbox row, and the business write rolled back with it");
}
# a later version may add fields after a '-' (qb_trace_parse accepts it)
context("01-$TRACE-$SPAN-01-later", undef);
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'trace.v1', N'v1', N'{}')});
is(headers_of(q{[key] = N'v1'})->[0]{traceparent}, "00-$TRACE-$SPAN-01",
	'a later version with more fields is taken as version 00 of its first 55 characters, as on PostgreSQL');

# ---- the row's own wins; several rows; no context, an empty one
context($TP, $TS);
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, headers) VALUES
	(N'trace.own', N'own', N'{}', N'{"TraceParent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'),
	(N'trace.many', N'm1', N'{}', N'{"x-a": "1"}'), (N'trace.many', N'm2', N'{}', N'{}'), (N'trace.many', N'm3', N'{}', N'{}')});
is($json->encode(headers_of(q{[key] = N'own'})->[0]),
	$json->encode({ TraceParent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' }),
	'a row with its own traceparent (another letter case) keeps it, and takes no tracestate');
is(join(' ', map { ($_->{traceparent} // 'none') . '/' . ($_->{tracestate} // 'none') } @{ headers_of(q{topic = N'trace.many'}) }),
	join(' ', ("$TP/$TS") x 3), 'each row of a several-row INSERT takes the session\'s context');
is(headers_of(q{[key] = N'm1'})->[0]{'x-a'}, '1', 'and keeps its other headers');
context(undef, undef);
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'trace.none', N'none', N'{}')});
context('', '');
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'trace.none', N'empty', N'{}')});
is($json->encode(headers_of(q{topic = N'trace.none'})), '[{},{}]', 'no context, or an empty one: no header');
is(count('queuebox.outbox', q{topic LIKE N'trace.%'}), 7, 'seven rows of these cases, each inserted once');

# ---- a member of queuebox_writer, which may only INSERT and SELECT, gets
# its rows traced: on SQL Server by ownership chaining; Babelfish, where a
# procedure runs with its caller's rights, checks the trigger's call of
# _trace_error (roles.sql grants the writer EXECUTE on it) but not its
# UPDATE
{
	my $w = mssql_connect(mssql_login_add($dbh, $url, 'qb_writer65', 'queuebox_writer'));
	my $insert = sub {
		my ($key) = @_;
		my $n = count('queuebox.outbox');
		eval { mssql_do($w, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'writer.a', ?, N'{}')}, $key) };
		return ($@, count('queuebox.outbox') - $n);
	};
	my ($err, $added) = $insert->('w0');
	is("$err$added", '1', 'a queuebox_writer member without a context inserts as before');
	mssql_do($w, q{EXEC sp_set_session_context N'queuebox.traceparent', ?}, $TP);
	($err, $added) = $insert->('w1');
	is("$err$added", '1', 'a queuebox_writer member inserts under a session context');
	is(headers_of(q{[key] = N'w1'})->[0]{traceparent} // 'none', $TP, 'its row carries the context');
	is(headers_of(q{[key] = N'w0'})->[0]{traceparent} // 'none', 'none', 'the one before the context carries none');
	$w->disconnect;
	mssql_login_drop($dbh, 'qb_writer65');
}

# ---- the relay: its forward span is the child of the webhook's traceparent
{
	my $TRACE3 = '0af7651916cd43dd8448eb211c80319c';
	my $n = count('queuebox.inbox');
	my $r = $http->request('POST', "http://127.0.0.1:$port/inbox/shop", {
		content => $json->encode({ id => 'w-65', type => 'paid' }),
		headers => { 'Content-Type' => 'application/json', traceparent => "00-$TRACE3-b7ad6b7169203331-01" } });
	is($r->{status}, 202, 'a traced webhook is accepted');
	is(count('queuebox.inbox') - $n, 1, 'and stored once');
	my $fw;
	qb_wait_for(sub { ($fw) = grep { $_->{name} eq 'forward shop' } @{ otlp_spans($rx) }; $fw },
		'the relay\'s forward span is exported', timeout => 60);
	is("$fw->{traceId} " . ($fw->{parentSpanId} || 'none'), "$TRACE3 b7ad6b7169203331",
		'the forward is a child of the inbox row\'s traceparent');
	is($fw->{attributes}{'queuebox.outcome'}, 'forwarded', 'it forwarded the row');
	mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'shop.paid' AND state = N'sent'}, [], 1,
		'the relayed row is delivered');
}

qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');
ok(!-e "$rx->{out}.bad", 'every OTLP post decoded');
mssql_do($dbh, q{DROP TABLE dbo.orders});
mssql_reset($dbh);
$dbh->disconnect;
done_testing();
