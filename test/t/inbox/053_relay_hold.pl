# 053_relay_hold.pl
#   onDead: holdKey on a source (docs/delivery.md, "Dead letters"), in the
#   relay's aggregate order, end to end: webhooks at the ingress, the relay,
#   the outbox and the HTTP sink, on the extension and on the daemon with
#   libpq.  A push row whose topic renders empty goes dead; under holdKey it
#   keeps its aggregate's later rows parked, new ones too, until an
#   operator acts through the admin routes: an edited requeue (after the
#   template is fixed) sends the edited row first, then the rest in order;
#   a skip lets the aggregate go on without its head.  A source left at
#   release (the default) lets the aggregate go on at once, as before.
#   Every step counts inbox and outbox rows.  pg_dump keeps the audit rows.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $json = JSON::PP->new->canonical(1);
my $http = HTTP::Tiny->new(timeout => 30, keep_alive => 0);
my $sink = qb_sink_start(name => 'relayhold');
my $token = 'admin-token-relayhold-0123456789';

# the document: both sources render their topic from the template given
sub yaml_for
{
	my ($port, $topic, %extra) = @_;
	my %src = (type => 'http', idempotencyKeyPath => '$.id', eventTypePath => '$.type',
		aggregateIdPath => '$.order', topic => $topic);
	return qb_config_yaml(
		outbox => { maxAttempts => 3 },
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/hooks' } },
		routes => [ { topicPattern => '**', destination => 'web' } ],
		sources => {
			held => { %src, path => '/held', onDead => 'holdKey' },
			loose => { %src, path => '/loose' },
		},
		http => { listen => "127.0.0.1:$port" },
		admin => { token => $token },
		inbox => { relay => { pollIntervalMs => 50 } },
		%extra);
}

# run($label, $node, $base, $reconfigure): the scenario on one host
sub run_case
{
	my ($label, $node, $base, $reconfigure) = @_;
	my $sql = sub { $node->safe_psql('postgres', $_[0]) };
	my %auth = (Authorization => "Bearer $token", 'Content-Type' => 'application/json');
	my $post = sub {
		my ($source, $order, $seq, $type) = @_;
		my %b = (id => "$label-$order-$seq", order => "$label-$order", seq => $seq, run => $label);
		$b{type} = $type if defined $type;
		my $r = $http->request('POST', "$base/inbox/$source",
			{ content => $json->encode(\%b), headers => { 'Content-Type' => 'application/json' } });
		is($r->{status}, 202, "$label: webhook $order/$seq stored") or diag $r->{content};
	};
	# ok deliveries of an aggregate, as seq ("e": an edited body), in log order
	my $delivered = sub {
		my ($order) = @_;
		my @seq;
		for my $r (@{ qb_sink_requests($sink) })
		{
			next unless $r->{path} eq '/hooks' && $r->{status} >= 200 && $r->{status} < 300;
			my $b = eval { $json->decode($r->{body}) } or next;
			next unless ($b->{order} // '') eq "$label-$order";
			push @seq, $b->{seq} . ($b->{edited} ? 'e' : '');
		}
		return join(',', @seq);
	};
	my $states = sub {
		my ($order) = @_;
		return $sql->(qq{
			SELECT string_agg((payload->>'seq') || ':' || state || ':' || coalesce(hold, '-'), ','
							  ORDER BY created_at, id)
			FROM queuebox.inbox WHERE aggregate_id = '$label-$order'});
	};
	my $outbox_of = sub { $sql->("SELECT count(*) FROM queuebox.outbox WHERE key = '$label-$_[0]'") };
	my $head = sub {
		my ($order, $seq) = @_;
		return $sql->("SELECT id FROM queuebox.inbox WHERE idempotency_key = '$label-$order-$seq'");
	};

	is($sql->('SELECT count(*) FROM queuebox.inbox') . '/' . $sql->('SELECT count(*) FROM queuebox.outbox'),
		'0/0', "$label: no inbox or outbox row before");

	# o1: 2 has no type (its topic renders empty: dead), 1, 3, 4 do;
	# o4: its head dies; o3 (source loose, release): its head dies too
	$post->('held', 'o1', 1, 'step');
	$post->('held', 'o1', 2, undef);
	$post->('held', 'o1', 3, 'step');
	$post->('held', 'o1', 4, 'step');
	$post->('held', 'o4', 1, undef);
	$post->('held', 'o4', 2, 'step');
	$post->('loose', 'o3', 1, undef);
	$post->('loose', 'o3', 2, 'step');

	# ---- release (the default): the aggregate goes on at once
	qb_wait_for(sub { $delivered->('o3') eq '2' }, "$label: release: o3's second row is delivered past its dead head");
	is($states->('o3'), '1:dead:-,2:processed:-', "$label: release: the head is dead and holds nothing");

	# ---- holdKey: the dead heads hold their aggregates
	qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE state = 'dead' AND hold = 'dead'",
		2, "$label: holdKey: the dead heads of o1 and o4 hold their aggregates");
	qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE state = 'pending' AND hold = 'aggregate'",
		3, "$label: holdKey: the rows behind them are parked");
	qb_wait_for(sub { $delivered->('o1') eq '1' }, "$label: o1's first row is delivered");
	is($states->('o1'), '1:processed:-,2:dead:dead,3:pending:aggregate,4:pending:aggregate',
		"$label: o1: head dead and holding, the rest parked");
	is($states->('o4'), '1:dead:dead,2:pending:aggregate', "$label: o4: the same");
	is($outbox_of->('o1') . '/' . $outbox_of->('o4'), '1/0', "$label: no outbox row from a held row");

	# a new row of a held aggregate waits too
	$post->('held', 'o1', 5, 'step');
	qb_wait_query($node, "SELECT hold FROM queuebox.inbox WHERE idempotency_key = '$label-o1-5'",
		'aggregate', "$label: a new row of a held aggregate is parked behind the dead head");
	is($outbox_of->('o1'), 1, "$label: still one outbox row for o1");

	my ($h1, $h4) = ($head->('o1', 2), $head->('o4', 1));
	is($sql->(q{SELECT string_agg(aggregate_id || ':' || source || ':' || head_id || ':' || behind, ','
				 ORDER BY aggregate_id) FROM queuebox.held_aggregates()}),
		"$label-o1:held:$h1:3,$label-o4:held:$h4:1", "$label: held_aggregates() lists both, their heads and the rows behind");
	my $r = $http->request('GET', "$base/admin/inbox/held?limit=10", { headers => \%auth });
	is($r->{status}, 200, "$label: GET /admin/inbox/held") or diag $r->{content};
	is(join(',', map { "$_->{aggregate_id}:$_->{head_id}:$_->{behind}" } @{ $json->decode($r->{content}) }),
		"$label-o1:$h1:3,$label-o4:$h4:1", "$label: the admin route lists the same");

	# ---- a skip: the head stays dead, the aggregate goes on without it
	$r = $http->request('POST', "$base/admin/inbox/$h4/skip", { headers => \%auth });
	is($r->{status}, 200, "$label: POST /admin/inbox/{id}/skip") or diag $r->{content};
	is($json->decode($r->{content})->{skipped}, JSON::PP::true, "$label: skipped: true");
	qb_wait_for(sub { $delivered->('o4') eq '2' }, "$label: the skipped aggregate goes on");
	is($states->('o4'), '1:dead:-,2:processed:-', "$label: skip: the head stays dead, holding nothing");
	$r = $http->request('POST', "$base/admin/inbox/$h4/skip", { headers => \%auth });
	is($r->{status}, 404, "$label: a second skip is 404");
	like($r->{content}, qr/holds its aggregate/, "$label: and says which rows can be skipped");

	# ---- an edited requeue, once the template renders a topic
	$r = $http->request('POST', "$base/admin/inbox/$h1/requeue", { headers => \%auth, content => '{"payload": 1, "x": 2}' });
	is($r->{status}, 400, "$label: an edited requeue with an unknown key: 400");
	$r = $http->request('POST', "$base/admin/inbox/" . $head->('o1', 3) . '/requeue',
		{ headers => \%auth, content => '{"payload": {}}' });
	is($r->{status}, 404, "$label: an edited requeue of a row that is not dead: 404");
	is($states->('o1'), '1:processed:-,2:dead:dead,3:pending:aggregate,4:pending:aggregate,5:pending:aggregate',
		"$label: refused requeues change nothing");
	$reconfigure->('{{ source }}');
	$r = $http->request('POST', "$base/admin/inbox/$h1/requeue", { headers => \%auth,
		content => $json->encode({ payload => { id => "$label-o1-2", order => "$label-o1", seq => 2, run => $label,
			edited => JSON::PP::true } }) });
	is($r->{status}, 200, "$label: POST /admin/inbox/{id}/requeue with an edited payload") or diag $r->{content};
	qb_wait_for(sub { $delivered->('o1') eq '1,2e,3,4,5' },
		"$label: the sink gets the edited row, then the rest of o1 in order") or diag $delivered->('o1');
	is($states->('o1'), '1:processed:-,2:processed:-,3:processed:-,4:processed:-,5:processed:-',
		"$label: o1 forwarded in full");
	is($sql->('SELECT count(*) FROM queuebox.held_aggregates()'), '0', "$label: no aggregate is held any more");
	is($sql->(q{SELECT string_agg(inbox_id || ':' || action || ':' || (done_by <> '') || ':'
				 || coalesce(payload_before->>'edited', '-') || ':' || coalesce(payload_after->>'edited', '-'), ','
				 ORDER BY id) FROM queuebox.inbox_audit}),
		"$h4:skip:true:-:-,$h1:requeue:true:-:true", "$label: the skip and the edit are audited: who, before and after");

	# ---- no row lost or added
	qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, 7,
		"$label: the outbox sent 7 rows (o1 x5, o4 and o3 one each)");
	is($sql->('SELECT count(*) FROM queuebox.inbox') . '/' . $sql->('SELECT count(*) FROM queuebox.outbox'),
		'9/7', "$label: 9 inbox rows, 7 outbox rows");
	is($sql->(q{SELECT string_agg(idempotency_key, ',' ORDER BY id) FROM queuebox.inbox WHERE state = 'dead'}),
		"$label-o4-1,$label-o3-1", "$label: dead: the skipped head and the released one");
	return;
}

# ---- the extension
{
	my $node = qb_node('relayhold');
	my $port = qb_free_port();
	my $base = "http://127.0.0.1:$port";
	qb_configure($node, yaml_for($port, '{{ eventType }}'));
	qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'extension: the ingress listens', timeout => 30);
	run_case('ext', $node, $base, sub { qb_configure($node, yaml_for($port, $_[0])) });

	# pg_dump keeps what operators did: both audit tables are the
	# extension's configuration tables (pg_extension_config_dump)
	$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload, state) VALUES ('x', '{}', 'dead');
		SELECT queuebox.requeue_outbox(id) FROM queuebox.outbox WHERE topic = 'x'});
	my $audits = q{SELECT (SELECT string_agg(inbox_id || ':' || action, ',' ORDER BY id) FROM queuebox.inbox_audit)
		|| '/' || (SELECT string_agg(outbox_id || ':' || action, ',' ORDER BY id) FROM queuebox.outbox_audit)};
	my $want = $node->safe_psql('postgres', $audits);
	my $dump = "$PostgreSQL::Test::Utils::tmp_check/053_relayhold_dump.sql";
	$node->command_ok([ 'pg_dump', '-d', $node->connstr('postgres'), '-f', $dump ], 'pg_dump of the extension database');
	$node->safe_psql('postgres', 'CREATE DATABASE restored');
	$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('restored'), '-f', $dump ],
		'the dump restores into a new database');
	is($node->safe_psql('restored', $audits), $want, 'pg_dump kept the inbox_audit and outbox_audit rows');
	$node->stop;
}

# ---- the daemon on PostgreSQL (libpq store)
{
	my $node = qbd_node('relayhold_daemon');
	my $port = qb_free_port();
	my $base = "http://127.0.0.1:$port";
	my %db = (database => { url => qbd_url($node) }, daemon => { outboxWorkers => 1 });
	my $d = qbd_start($node, yaml_for($port, '{{ eventType }}', %db), name => 'relayhold');
	qb_wait_for(sub { $http->get("$base/readyz")->{status} == 200 }, 'daemon: the ingress is ready', timeout => 30);
	run_case('daemon', $node, $base, sub {
		# the daemon reads its file at start: start it again with the new template
		qbd_signal($d, 'TERM');
		is(qbd_wait_exit($d, 30), 0, 'daemon: stops for the new template');
		$d = qbd_start($node, yaml_for($port, $_[0], %db), name => 'relayhold2');
		qb_wait_for(sub { $http->get("$base/readyz")->{status} == 200 }, 'daemon: ready again', timeout => 30);
	});
	qbd_signal($d, 'TERM');
	is(qbd_wait_exit($d, 30), 0, 'daemon: stops');
	$node->stop;
}

qb_sink_stop($sink);
done_testing();
