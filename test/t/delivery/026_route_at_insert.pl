# 026_route_at_insert.pl
#   Rows are routed when they are inserted (docs/design/claim.md, "Routed
#   at insert"): the outbox_route trigger gives a row its topic's
#   destination and hold 'intake', by the routes the workers published or
#   a configure() published at its commit.  A row no route matches stays
#   unrouted and goes dead at its claim; a row inserted with a hold is left
#   alone; a savepoint rolled back over a configure() publishes nothing of
#   it; routes that do not fit in shared memory are logged and rows are
#   routed at their claim; a database the workers do not serve routes
#   nothing.  Every row is delivered once, where its route said at insert.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink_a = qb_sink_start(name => 'route_a');
my $sink_b = qb_sink_start(name => 'route_b');
my $node = qb_node('route');

sub config
{
	my (@routes) = @_;
	return qb_config_yaml(
		destinations => {
			a => { type => 'http', baseUrl => $sink_a->{url}, path => '/a' },
			b => { type => 'http', baseUrl => $sink_b->{url}, path => '/b' },
		},
		routes => [ map { { topicPattern => $_->[0], destination => $_->[1] } } @routes ]);
}
sub insert_routed
{
	my ($topic, $db) = @_;
	return $node->safe_psql($db // 'postgres',
		"INSERT INTO queuebox.outbox (topic, payload) VALUES ('$topic', '{}')"
		  . " RETURNING coalesce(destination, '-') || ':' || coalesce(hold, '-')");
}

qb_configure($node, config([ 'x.**', 'a' ], [ 'y.**', 'b' ]));
is(insert_routed('x.one'), 'a:intake', 'a row is routed at insert, right after configure() commits');
is(insert_routed('y.one'), 'b:intake', 'the second route names the other destination');
is(insert_routed('z.none'), '-:-', 'a topic no route matches stays unrouted');
is($node->safe_psql('postgres',
		q{INSERT INTO queuebox.outbox (topic, payload, hold) VALUES ('x.ready', '{}', 'ready')
		  RETURNING coalesce(destination, '-') || ':' || hold}),
	'-:ready', 'a row inserted with a hold is left as it is');
# counted in the inserting transaction: once it commits the workers claim the rows
is($node->safe_psql('postgres', q{
		BEGIN;
		INSERT INTO queuebox.outbox (topic, payload)
		SELECT 'x.many', '{}' FROM generate_series(1, 500);
		SELECT count(*) FROM queuebox.outbox WHERE topic = 'x.many' AND destination = 'a' AND hold = 'intake';
		COMMIT}),
	'500', 'a multi-row INSERT routes every row');

qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE state IN ('pending', 'processing')",
	'0', 'every row ends', timeout => 60);
is($node->safe_psql('postgres', q{SELECT state || ':' || (last_error LIKE 'no route matches topic "z.none"%')
		FROM queuebox.outbox WHERE topic = 'z.none'}),
	'dead:true', 'the unrouted row went dead at its claim: no route');
is($node->safe_psql('postgres', q{SELECT string_agg(DISTINCT topic || '>' || destination || ':' || state, ',' ORDER BY topic || '>' || destination || ':' || state)
		FROM queuebox.outbox WHERE topic <> 'z.none'}),
	'x.many>a:sent,x.one>a:sent,x.ready>a:sent,y.one>b:sent', 'the others were sent where their routes said');
is(scalar(@{ qb_sink_requests($sink_a) }), 502, 'sink a got its 502 rows');
is(scalar(@{ qb_sink_requests($sink_b) }), 1, 'sink b got its one row');

# ---- a route change applies to rows inserted after it; rows routed before keep theirs
is(insert_routed('x.before'), 'a:intake', 'a row inserted before the change goes to a');
qb_configure($node, config([ 'x.**', 'b' ]));
is(insert_routed('x.after'), 'b:intake', 'a row inserted after the change is routed by the new routes');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic IN ('x.before', 'x.after') AND state = 'sent'",
	'2', 'both are sent', timeout => 60);
is($node->safe_psql('postgres', q{SELECT string_agg(topic || '>' || destination, ',' ORDER BY id)
		FROM queuebox.outbox WHERE topic IN ('x.before', 'x.after')}),
	'x.before>a,x.after>b', 'each went where its route said when it was inserted');

# ---- a savepoint rolled back over a configure(): what commits is the first
$node->safe_psql('postgres', "BEGIN; SELECT queuebox.configure(\$\$" . config([ 'x.**', 'a' ]) . "\$\$);"
	  . " SAVEPOINT s; SELECT queuebox.configure(\$\$" . config([ 'x.**', 'b' ]) . "\$\$);"
	  . " ROLLBACK TO s; COMMIT;");
qb_wait_for(sub { insert_routed('x.probe') eq 'a:intake' }, 'after the savepoint, rows are routed by the configuration that committed',
	timeout => 30);
is(insert_routed('x.sp'), 'a:intake', 'and stay so');

# ---- routes that do not fit in shared memory: logged, rows routed at their claim
my $logpos = -s $node->logfile;
qb_configure($node, config(map { [ "r$_.**", 'b' ] } 1 .. 300));
like(qb_wait_log($node, qr/routes do not fit in shared memory/, $logpos, timeout => 30),
	qr/routes do not fit in shared memory; new outbox rows are routed at their first claim/,
	'300 routes: the log says they are routed at their first claim');
qb_wait_for(sub { insert_routed('r7.x') eq '-:-' }, 'a row is inserted unrouted', timeout => 30);
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'r7.x' AND state = 'sent' AND destination = 'b'",
	$node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE topic = 'r7.x'"),
	'and is routed at its claim and sent', timeout => 60);

# ---- a database the workers do not serve: its rows are not routed by these routes
$node->safe_psql('postgres', 'CREATE DATABASE elsewhere');
$node->safe_psql('elsewhere', 'CREATE EXTENSION queuebox');
qb_configure($node, config([ 'x.**', 'a' ]));
qb_wait_for(sub { insert_routed('x.back') eq 'a:intake' }, 'the served database routes again', timeout => 30);
is(insert_routed('x.other', 'elsewhere'), '-:-', 'a row of another database is not routed by the served database\'s routes');
qb_configure($node, config([ 'x.**', 'b' ]), 'elsewhere');
is(insert_routed('x.back2'), 'a:intake', 'a configure() in another database does not change the served routes');

qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE state IN ('pending', 'processing')",
	'0', 'every row of the served database ends', timeout => 60);
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state = 'dead'"), '1',
	'only the row without a route is dead');
my %mids;
$mids{ $_->{mid} }++ for @{ qb_sink_requests($sink_a) }, @{ qb_sink_requests($sink_b) };
is(scalar(grep { $_ > 1 } values %mids), 0, 'no row was delivered twice');
is(scalar(keys %mids), $node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'"),
	'every sent row reached a sink');

$node->stop;
qb_sink_stop($_) for $sink_a, $sink_b;
done_testing();
