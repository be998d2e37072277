# 061_chaos.pl
#   Chaos with a checker (issue 38): every fault, one after another at random
#   intervals, while writers commit outbox rows over many keys; then the
#   independent checker (bench/chaos/check.pl) reads only what the writers
#   know committed and what the receiver recorded, and must find nothing
#   lost, nothing reordered, no phantom row, no duplicate without a fault
#   around it, no dead letter the run did not ask for.
#
#   First the checker itself, on small histories doctored by hand: a good
#   one passes; a lost row, a reordering, a duplicate with no fault, a
#   phantom (a delivered row whose transaction rolled back), a dead letter
#   not asked for, a committed transaction missing from the database, a
#   webhook stored twice each fail it, with that finding named.  A row sent again after later rows of
#   its key, inside a fault, is a duplicate, not a reordering.
#
#   Then the run (QB_CHAOS_SECONDS, default 120: the suite's short mode;
#   bench/chaos/run.sh runs the same file for 10 minutes), on two
#   QueueBoxes: the extension and the daemon on PostgreSQL, each with its
#   own cluster and receiver (test/sink/qb_sink, logging every request;
#   in network namespaces of their own when they can be made,
#   test/perl/QueueBoxNetns.pm, as TAP 048):
#   - writers (QB_CHAOS_WRITERS 2 into the extension's cluster,
#     QB_CHAOS_DAEMON_WRITERS 1 into the daemon's), each owning a share of
#     QB_CHAOS_KEYS (200) keys, commit QB_CHAOS_TX_RATE (10) transactions a
#     second of QB_CHAOS_ROWS (8) outbox rows on distinct keys, each payload
#     {tx, key, seq: the key's next number}, plus a business row (table
#     chaos_tx, the transaction's token) in the same transaction.  One row
#     in 500 is poison (the receiver answers it 422, max_attempts 2: a dead
#     letter the run asks for).  A transaction whose COMMIT got no answer
#     (psql lost its server, or could not reach it) is "unknown" in the
#     writer's log: its outcome is learned after the run, from chaos_tx;
#   - the nemesis, one fault at a time, each type in turn in a shuffled
#     order, 2 to 5 s apart once deliveries resumed after the last: kill -9
#     of an outbox worker (the cluster crash-restarts), of the postmaster
#     and its children (started again 1 to 2 s later), of the daemon (a new
#     one started) and of one of its outbox roles; the receiver answering
#     500, 429 with Retry-After, 410 (the operator resumes the destination
#     after it), after the destination's timeout, or cutting its answer
#     mid-body; a partition and 10 % packet loss between the extension and
#     its receiver, and between the daemon and its database (only with
#     namespaces); a configuration reload of each (queuebox.configure()
#     with another batch size and pg_reload_conf(); the daemon's file
#     rewritten and SIGHUP).  A fault that lasts lasts 3 to 6 s.  The run
#     lasts QB_CHAOS_SECONDS and until every type was made once.
#   When it is over the writers stop, every row settles (sent or dead), the
#   business rows and the dead letters are read into files, and the
#   checker's verdict is asserted; its report (per fault type: count, time
#   to resume, longest stall, duplicates) is printed with note.
#   QB_CHAOS_OUT=DIR keeps the history and the report there
#   (bench/chaos/run.sh).  bench/chaos/README.md defines each term.
#
#   Also a NATS writer (rows of topic chaos.nats to JetStream, the nemesis
#   restarting nats-server; the stream dumped after the run is that
#   receiver's record), a RabbitMQ writer (rows of topic chaos.rmq to a
#   durable queue, the nemesis stopping rabbitmq-server gracefully or with
#   kill -9 and starting it again; a consumer that reconnects records each
#   message as it arrives, QueueBoxRabbit's rmq_consume) and a webhook sender (one webhook at a time to the
#   extension's ingress, source hooks, idempotency key the token, aggregate
#   the key; its 2xx is the answered COMMIT, the inbox's keys after the run
#   its business rows; the relay forwards them to the receiver, per
#   aggregate in order).
use strict;
use warnings;

use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxNetns;
my $NETNS;
BEGIN { $NETNS = qbn_enter(optional => 1); }

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use File::Copy qw(copy);
use File::Path qw(make_path);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use List::Util qw(shuffle);
use POSIX qw(WNOHANG);
use Time::HiRes qw(time usleep);

use QueueBoxTest;
use QueueBoxDaemon;
use QueueBoxNats;
use QueueBoxRabbit;

my $ROOT = "$FindBin::RealBin/../../..";
my $CHECK = "$ROOT/bench/chaos/check.pl";
my $json = JSON::PP->new->canonical(1);

my $SECONDS = $ENV{QB_CHAOS_SECONDS} // 120;
my $WRITERS = $ENV{QB_CHAOS_WRITERS} // 2;
my $DWRITERS = $ENV{QB_CHAOS_DAEMON_WRITERS} // 1;
my $TX_RATE = $ENV{QB_CHAOS_TX_RATE} // 10;
my $ROWS = $ENV{QB_CHAOS_ROWS} // 8;
my $KEYS = $ENV{QB_CHAOS_KEYS} // 200;
my $POISON = 1 / 500;
my $TIMEOUT_MS = 1000;
my $CLAIM_MS = 4000;

sub write_file
{
	my ($path, @lines) = @_;
	open(my $fh, '>', $path) or die "$path: $!";
	print $fh @lines;
	close $fh;
}

sub run_check
{
	my ($dir) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $^X, $CHECK, $dir ], '>', \$out, '2>', \$err);
	return ($? >> 8, $out . $err);
}

# ---------------------------------------------------------------- the checker

# a history of two keys by hand: each case changes it, then the checker reads it
sub doctored
{
	my ($name, %c) = @_;
	(my $tag = $name) =~ s/\W+/_/g;
	my $dir = "$PostgreSQL::Test::Utils::tmp_check/check_$tag";
	make_path($dir);
	my @w = (
		{ ev => 'try', tx => 'w0-1', t => 1, rows => [ { key => 'a', seq => 1, poison => 0 }, { key => 'b', seq => 1, poison => 0 } ] },
		{ ev => 'commit', tx => 'w0-1', t => 1.1 },
		{ ev => 'try', tx => 'w0-2', t => 2, rows => [ { key => 'a', seq => 2, poison => 0 }, { key => 'b', seq => 2, poison => 1 } ] },
		{ ev => 'unknown', tx => 'w0-2', t => 2.1, why => 'server closed the connection' },
		{ ev => 'try', tx => 'w0-3', t => 3, rows => [ { key => 'a', seq => 3, poison => 0 } ] },
		{ ev => 'unknown', tx => 'w0-3', t => 3.1, why => 'could not connect' },
		{ ev => 'try', tx => 'w0-4', t => 4, rows => [ { key => 'a', seq => 4, poison => 0 } ] },
		{ ev => 'commit', tx => 'w0-4', t => 4.1 });
	my @committed = ('w0-1', 'w0-2', 'w0-4');    # w0-3 rolled back
	# [t, key, seq, status]
	my @r = ([ 10, 'a', 1, 200 ], [ 10.5, 'b', 1, 200 ], [ 11, 'a', 2, 500 ], [ 12, 'a', 2, 200 ],
		[ 12.5, 'b', 2, 422 ], [ 13, 'b', 2, 422 ], [ 14, 'a', 4, 200 ]);
	my @faults = ({ fault => 'kill9_worker', start => 11.5, end => 11.5 });
	my @dead = ({ key => 'b', seq => 2 });
	$c{edit}->(\@w, \@committed, \@r, \@faults, \@dead) if $c{edit};
	write_file("$dir/writer-0.jsonl", map { $json->encode($_) . "\n" } @w);
	write_file("$dir/committed.txt", map { "$_\n" } @committed);
	write_file("$dir/receiver-0.jsonl", map {
		$json->encode({ t_us => int($_->[0] * 1e6), status => $_->[3], headers => { 'x-message-id' => "m-$_->[1]-$_->[2]" },
			body => $json->encode({ key => $_->[1], seq => $_->[2], tx => 'x' }) }) . "\n" } @r);
	write_file("$dir/faults.jsonl", map { $json->encode($_) . "\n" } @faults);
	write_file("$dir/dead.jsonl", map { $json->encode($_) . "\n" } @dead);
	write_file("$dir/meta.json", $json->encode({ slack_before_s => 2, slack_after_s => 2 }));
	write_file("$dir/$_", $c{files}{$_}) for keys %{ $c{files} // {} };
	my ($rc, $out) = run_check($dir);
	if ($c{expect})
	{
		is($rc, 1, "checker, $name: fails") or diag $out;
		like($out, $c{expect}, "checker, $name: says what") or diag $out;
	}
	else
	{
		is($rc, 0, "checker, $name: passes") or diag $out;
	}
	return $out;
}

my $good = doctored('good history');
like($good, qr/^rows: 5 committed over 2 keys \(1 poison\), 4 delivered; 0 lost, 0 reordered, 0 phantom$/m,
	'checker, good history: counts the committed rows (an unknown outcome learned from the business rows)')
  or diag $good;
like($good, qr/^transactions: 4 tried, 2 COMMIT answered, 2 outcome unknown \(1 of them committed\)$/m,
	'checker, good history: counts the transactions') or diag $good;
doctored('lost row', edit => sub { my (undef, undef, $r) = @_; @$r = grep { "$_->[1]$_->[2]" ne 'a4' } @$r },
	expect => qr/^FAIL: lost: committed row a\/4 \(transaction w0-4, COMMIT answered\)/m);
doctored('lost row of an unknown outcome',
	edit => sub { my (undef, undef, $r) = @_; @$r = grep { "$_->[1]$_->[2]" ne 'a2' || $_->[3] != 200 } @$r },
	expect => qr/^FAIL: lost: committed row a\/2 \(transaction w0-2, outcome learned afterwards\)/m);
doctored('reordered', edit => sub { my (undef, undef, $r) = @_; $_->[0] = 9 for grep { "$_->[1]$_->[2]" eq 'a4' } @$r },
	expect => qr/^FAIL: reordered: key a: row 4 first delivered at 9\.0+, before row 2 \(first at 12\.0+\)$/m);
my $redo = doctored('sent again after a later row, inside a fault',
	edit => sub { my (undef, undef, $r) = @_; push @$r, [ 12.2, 'a', 1, 200 ] });
like($redo, qr/^duplicates: 1 \(0 unexplained by a fault; 1 sent again after a later row of their key was delivered, e\.g\. a\/1 /m,
	'checker: that is one duplicate, sent after a later row of its key') or diag $redo;
like($redo, qr/^last deliveries out of order: 1 rows .* e\.g\. a\/1 \(last 12\.20+, after a\/2 last 12\.0+\)$/m,
	'checker: and the key\'s last delivery is the older row') or diag $redo;
doctored('a duplicate with no fault around it',
	edit => sub { my (undef, undef, $r) = @_; push @$r, [ 20, 'a', 4, 200 ] },
	expect => qr/^FAIL: unexplained duplicate: row a\/4 first delivered at 14\.0+, again at 20\.0+/m);
doctored('a duplicate inside a fault about another receiver only',
	edit => sub { my (undef, undef, $r, $f) = @_; push @$r, [ 11.6, 'a', 1, 200 ]; $f->[0]{receiver} = 'receiver-9' },
	expect => qr/^FAIL: unexplained duplicate: row a\/1 first delivered at 10\.0+, again at 11\.60+/m);
doctored('a fault naming a receiver that has no record',
	edit => sub { my (undef, undef, undef, $f) = @_; $f->[0]{receiver} = 'receiver-0 receiver-9' },
	expect => qr/^FAIL: the kill9_worker fault at 11\.5 names a receiver with no record: receiver-9$/m);
doctored('a duplicate inside a fault about its receiver among others',
	edit => sub { my (undef, undef, $r, $f) = @_; push @$r, [ 11.6, 'a', 1, 200 ]; $f->[0]{receiver} = 'receiver-1 receiver-0' },
	files => { 'receiver-1.jsonl' => '' });
doctored('phantom', edit => sub { my (undef, undef, $r) = @_; push @$r, [ 13.5, 'a', 3, 200 ] },
	expect => qr/^FAIL: phantom: row a\/3 of transaction w0-3, which did not commit, was delivered$/m);
doctored('a dead letter not asked for', edit => sub { my (undef, undef, undef, undef, $d) = @_; push @$d, { key => 'a', seq => 4 } },
	expect => qr/^FAIL: dead letter a\/4 was not asked for/m);
doctored('a poison row delivered', edit => sub { my (undef, undef, $r) = @_; push @$r, [ 13.2, 'b', 2, 200 ] },
	expect => qr/^FAIL: poison row b\/2 was delivered/m);
doctored('a webhook stored twice', edit => sub { my (undef, $c) = @_; push @$c, 'w0-1' },
	expect => qr/^FAIL: business row w0-1 is stored 2 times$/m);
doctored('an answered COMMIT missing from the database',
	edit => sub { my (undef, $c) = @_; @$c = grep { $_ ne 'w0-4' } @$c },
	expect => qr/^FAIL: committed transaction w0-4 \(its COMMIT was answered\) has no business row after the run$/m);

# ---------------------------------------------------------------- the cluster and the receiver

my $dir = "$PostgreSQL::Test::Utils::tmp_check/chaos_history";
make_path($dir);
my ($sink, $dsink, @types);
my $dconf = '';
if ($NETNS)
{
	# the extension's receiver at 10.231.2.2, across a veth from the cluster
	# (10.231.2.1); the daemon at 10.231.1.2, across a veth from its
	# database (10.231.1.1) and its receiver (10.231.1.3)
	qbn_sh(qw(ip link set lo up));
	qbn_ns_new('dest');
	qbn_ns_new('daemon');
	qbn_veth('dest', 'qbs0', 'qbs1', ['10.231.2.1'], '10.231.2.2');
	qbn_veth('daemon', 'qbd0', 'qbd1', [ '10.231.1.1', '10.231.1.3' ], '10.231.1.2');
	$sink = qb_sink_start(name => 'chaos', bind => '10.231.2.2', wrap => [ qbn_in_ns('dest') ]);
	$dsink = qb_sink_start(name => 'chaos_daemon', bind => '10.231.1.3');
	$dconf = "listen_addresses = '127.0.0.1,10.231.1.1'\n";
	push @types, qw(partition loss daemon_db_partition daemon_db_loss);
}
else
{
	note "no partition and no loss: $QueueBoxNetns::why";
	$sink = qb_sink_start(name => 'chaos');
	$dsink = qb_sink_start(name => 'chaos_daemon');
}
push @types, qw(kill9_worker kill9_postmaster http_500 http_429 http_410 timeout cut config_reload
  kill9_daemon kill9_role daemon_reload nats_restart rabbit_restart rabbit_kill9);

# the broker: JetStream, stream CHAOS, the extension's rows of topic
# chaos.nats published on chaos.<key>
my $nats = nats_start(name => 'chaos');
nats_add_stream($nats, 'CHAOS', 'chaos.>');

# and RabbitMQ: the extension's rows of topic chaos.rmq to exchange chaos,
# bound to a durable queue; a consumer records each message as it arrives
# (flushed before its ack), reconnecting after each restart
my $rmq = rmq_start(name => 'chaos');
rmq_tool($rmq, exchange => 'chaos', 'direct', queue => 'chaos.rmq', bind => 'chaos.rmq', 'chaos', 'chaos.rmq');
my $rmq_raw = "$dir/rabbit-consumed.jsonl";
my $rmq_consumer = rmq_consume($rmq, 'chaos.rmq', $rmq_raw, "$dir/rabbit-stop");

my $node = qb_node('chaos', conf => "restart_after_crash = on\n");
my $dnode = qbd_node('chaos_db', conf => $dconf);
if ($NETNS)
{
	$dnode->append_conf('pg_hba.conf', "host all all 10.231.1.0/24 trust\n");
	$dnode->reload;
}
$_->safe_psql('postgres', 'CREATE TABLE chaos_tx (token text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())')
  for $node, $dnode;

# the settings both share: rows retried for ever (only poison rows die),
# a short backoff, a circuit that probes again after 1 s
sub chaos_yaml
{
	my ($batch, $url, %more) = @_;
	my $dests = delete $more{more_destinations} // {};
	return qb_config_yaml(
		outbox => {
			batchSize => $batch,
			claimTimeoutMs => $CLAIM_MS,
			maxAttempts => 1000000,
			backoff => { initialMs => 50, maxMs => 500 }
		},
		destinations => {
			web => {
				type => 'http',
				baseUrl => $url,
				path => '/chaos',
				timeoutMs => $TIMEOUT_MS,
				circuitBreaker => { cooldownMs => 1000 }
			},
			%$dests
		},
		routes => [ { topicPattern => '**', destination => 'web' } ],
		%more);
}

# the extension's webhook ingress: the relay forwards what it stores into
# the outbox (topic chaos.hook, the aggregate as the key), to the receiver
my $hooks_port = qb_free_port();
my $hooks_url = "http://127.0.0.1:$hooks_port";

sub configure
{
	my ($batch) = @_;
	qb_configure($node, chaos_yaml($batch, $sink->{url},
		# the same 1 s cooldown as web's: a restart's resume measures QueueBox, not the 30 s default
		more_destinations => {
			bus => { type => 'nats', url => $nats->{url}, subject => 'chaos.{{ key }}', circuitBreaker => { cooldownMs => 1000 } },
			mq => { type => 'rabbitmq', url => $rmq->{url}, exchange => 'chaos', circuitBreaker => { cooldownMs => 1000 } } },
		http => { listen => "127.0.0.1:$hooks_port" },
		sources => {
			hooks => {
				type => 'http',
				path => '/hooks',
				idempotencyKeyPath => '$.tx',
				aggregateIdPath => '$.key',
				topic => 'chaos.hook'
			} },
		routes => [
			{ topicPattern => 'chaos.nats', destination => 'bus' },
			{ topicPattern => 'chaos.rmq', destination => 'mq' },
			{ topicPattern => '**', destination => 'web' } ]));
}
configure(50);

# the daemon: from its namespace, its connections with TCP settings that
# find a dead peer within about 4 s (as TAP 048's database partition)
my $durl = $NETNS
  ? sprintf('postgres://qbd@10.231.1.1:%d/postgres?keepalives_idle=2&keepalives_interval=1'
	  . '&keepalives_count=2&tcp_user_timeout=4000', $dnode->port)
  : qbd_url($dnode);
my @dwrap = $NETNS ? (wrap => [ qbn_in_ns('daemon') ]) : ();
sub daemon_yaml
{
	my ($batch) = @_;
	return chaos_yaml($batch, $dsink->{url},
		database => { url => $durl, connectTimeoutMs => 2000, statementTimeoutMs => 10000 },
		daemon => { outboxWorkers => 2, shutdownGraceMs => 2000 });
}
my $dconf_file = qbd_write_conf(daemon_yaml(50), 'chaos_daemon');
my $r = qbd_run('--config', $dconf_file, '--migrate');
is($r->[0], 0, 'daemon: the schema is installed') or diag $r->[2];
my $daemon = qbd_start($dnode, undef, name => 'chaos_daemon', conf => $dconf_file, @dwrap);
my @dlogs = ($daemon->{log});
qbd_wait_daemon_log($daemon, qr/outbox 1\[\d+\]: started/);

# ---------------------------------------------------------------- the writers

# writer($w): a process committing transactions until $dir/stop exists
# ($sys: x the extension's cluster, d the daemon's, n and r the extension's
# cluster on topic chaos.nats and chaos.rmq (to the brokers), h webhooks to
# the extension's ingress; writer $w of $nw there,
# owning keys $sys<i> with i % $nw == $w)
sub writer
{
	my ($sys, $w, $nw) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	return $pid if $pid;
	eval { write_loop($sys, $w, $nw) };
	POSIX::_exit($@ ? 1 : 0);
}

# write_loop($w): the writer's loop; it also stops when the test is gone
# (its parent changed) or long after the run should have ended
sub write_loop
{
	my ($sys, $w, $nw) = @_;
	my $parent = getppid();
	my $deadline = time + $SECONDS + 900;
	srand($$ ^ int(time * 1000));
	open(my $log, '>>', "$dir/writer-$sys$w.jsonl") or POSIX::_exit(1);
	$log->autoflush(1);
	my @keys = map { "$sys$_" } grep { $_ % $nw == $w } 0 .. $KEYS - 1;
	my $conn = ($sys eq 'd' ? $dnode : $node)->connstr('postgres');
	my (%seq, $n);
	while (!-e "$dir/stop" && getppid() == $parent && time < $deadline)
	{
		my $t0 = time;
		my $tok = "$sys$w-" . ++$n;
		my $nrows = $sys eq 'h' ? 1 : $ROWS;
		my @pick = (shuffle @keys)[ 0 .. ($nrows > @keys ? $#keys : $nrows - 1) ];
		# (no poison row for the broker or the webhooks: neither can refuse one)
		my @rows = map { { key => $_, seq => ++$seq{$_}, poison => $sys =~ /[xd]/ && rand() < $POISON ? 1 : 0 } } @pick;
		print $log $json->encode({ ev => 'try', tx => $tok, t => $t0, rows => \@rows }), "\n";
		my ($ok, $err) = $sys eq 'h' ? send_webhook($tok, $rows[0]) : commit_rows($conn, $sys, $tok, @rows);
		if ($ok)
		{
			print $log $json->encode({ ev => 'commit', tx => $tok, t => time }), "\n";
		}
		else
		{
			my ($why) = split /\n/, $err;
			print $log $json->encode({ ev => 'unknown', tx => $tok, t => time, why => $why // '' }), "\n";
			usleep(100_000);
		}
		my $left = 1 / $TX_RATE - (time - $t0);
		usleep($left * 1e6) if $left > 0;
	}
	close $log;
	return;
}

# commit_rows($conn, $sys, $tok, @rows): the business row and the outbox
# rows in one transaction (one psql session); (1) when COMMIT was answered,
# else (0, why): the outcome is unknown until the business rows are read
sub commit_rows
{
	my ($conn, $sys, $tok, @rows) = @_;
	my $values = join(', ', map {
		my %p = (tx => $tok, key => $_->{key}, seq => $_->{seq});
		$p{_sink} = { status => 422 } if $_->{poison};
		'(' . qb_sql_quote({ n => 'chaos.nats', r => 'chaos.rmq' }->{$sys} // 'chaos') . ', ' . qb_sql_quote($_->{key}) . ', '
		  . qb_sql_quote($json->encode(\%p)) . '::jsonb, ' . ($_->{poison} ? 2 : 'NULL') . ')'
	} @rows);
	my $sql = 'BEGIN; INSERT INTO chaos_tx (token) VALUES (' . qb_sql_quote($tok) . '); '
	  . "INSERT INTO queuebox.outbox (topic, key, payload, max_attempts) VALUES $values; COMMIT;";
	my ($out, $err) = ('', '');
	my $ok = eval {
		IPC::Run::run([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $conn, '-c', $sql ],
			'>', \$out, '2>', \$err, IPC::Run::timeout(30));
	};
	return (1) if $ok && $? == 0;
	return (0, $@ || $err || "psql exit $?");
}

# send_webhook($tok, $row): one webhook to the extension's ingress, its
# idempotency key the token, its aggregate the key; (1) on a 2xx (the
# ingress stored it), else (0, why): the outcome is learned from the inbox
sub send_webhook
{
	my ($tok, $r) = @_;
	my $a = HTTP::Tiny->new(timeout => 5, keep_alive => 0)->post("$hooks_url/inbox/hooks",
		{ content => $json->encode({ tx => $tok, key => $r->{key}, seq => $r->{seq} }),
		  headers => { 'Content-Type' => 'application/json' } });
	return (1) if $a->{status} >= 200 && $a->{status} < 300;
	return (0, "HTTP $a->{status}: " . substr($a->{content} // '', 0, 200));
}

# ---------------------------------------------------------------- the nemesis

my $http = HTTP::Tiny->new(timeout => 10);

sub sink_fault
{
	my ($f) = @_;
	my $r = $http->post("$sink->{url}/_sink/fault", { content => $json->encode($f) });
	die "sink fault: $r->{status} $r->{content}" unless $r->{success};
}

# a fault that lasts: on, 3 to 6 s, off; returns [start, end]
sub lasting
{
	my ($on, $off) = @_;
	my $t0 = time;
	$on->();
	usleep((3 + rand(3)) * 1e6);
	$off->();
	return [ $t0, time ];
}

# the broker down one way, started again 1 to 2 s later on its port and data
sub rabbit_down
{
	my ($down) = @_;
	my $t = time;
	$down->($rmq);
	usleep((1 + rand(1)) * 1e6);
	rmq_start($rmq);
	return [ $t, time ];
}

my ($batch, $dbatch) = (50, 50);
my %fault = (
	kill9_worker => sub {
		my @pids = qb_worker_pids($node);
		die 'no outbox worker to kill' unless @pids;
		my $t = time;
		kill 'KILL', $pids[ int(rand(@pids)) ];
		return [ $t, $t ];
	},
	kill9_postmaster => sub {
		my $t = time;
		qb_kill9_postmaster($node);
		usleep((1 + rand(1)) * 1e6);
		$node->start;
		return [ $t, time ];
	},
	http_500 => sub { lasting(sub { sink_fault({ status => 500 }) }, sub { sink_fault({}) }) },
	http_429 => sub { lasting(sub { sink_fault({ status => 429, retry_after => '1' }) }, sub { sink_fault({}) }) },
	http_410 => sub {
		lasting(sub { sink_fault({ status => 410 }) }, sub {
			sink_fault({});
			# the operator resumes the destination; again if an answer of the
			# fault was still being settled when it did
			for (1 .. 20)
			{
				$node->safe_psql('postgres', q{SELECT queuebox.resume_destination('web')});
				usleep(500_000);
				my $st = qb_dest_status($node, 'web');
				last if $st && $st->{state} !~ /disabled/;
			}
		});
	},
	timeout => sub { lasting(sub { sink_fault({ delay_ms => $TIMEOUT_MS + 1000 }) }, sub { sink_fault({}) }) },
	cut => sub { lasting(sub { sink_fault({ cut => JSON::PP::true }) }, sub { sink_fault({}) }) },
	partition => sub {
		lasting(sub { qbn_fault_on('dest', 'iifname "qbs1"', 'oifname "qbs1"') }, sub { qbn_fault_off('dest') });
	},
	loss => sub { lasting(sub { qbn_fault_on('dest', $QBN_LOSS, $QBN_LOSS) }, sub { qbn_fault_off('dest') }) },
	config_reload => sub {
		my $t = time;
		$batch = $batch == 50 ? 20 : 50;
		configure($batch);
		$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
		return [ $t, time ];
	},
	kill9_daemon => sub {
		# the supervisor: its roles follow it; a new daemon takes over
		my $t = time;
		my $roles = qbd_role_pids($daemon);
		qbd_signal($daemon, 'KILL');
		qbd_wait_exit($daemon, 10);
		my $deadline = time + 30;
		usleep(20_000) while grep({ kill(0, $_) } values %$roles) && time < $deadline;
		$daemon = qbd_start($dnode, undef, name => 'chaos_daemon', conf => $dconf_file, @dwrap);
		push @dlogs, $daemon->{log};
		return [ $t, time ];
	},
	kill9_role => sub {
		my $roles = qbd_role_pids($daemon);
		my @outbox = grep { /^outbox/ } sort keys %$roles;
		die 'no outbox role to kill: ' . join(' ', keys %$roles) unless @outbox;
		my $t = time;
		kill 'KILL', $roles->{ $outbox[ int(rand(@outbox)) ] };
		return [ $t, $t ];
	},
	daemon_db_partition => sub {
		lasting(sub { qbn_fault_on('daemon', 'ip saddr 10.231.1.1', 'ip daddr 10.231.1.1') },
			sub { qbn_fault_off('daemon') });
	},
	daemon_db_loss => sub {
		lasting(sub { qbn_fault_on('daemon', "ip saddr 10.231.1.1 $QBN_LOSS", "ip daddr 10.231.1.1 $QBN_LOSS") },
			sub { qbn_fault_off('daemon') });
	},
	nats_restart => sub {
		my $t = time;
		nats_stop($nats);
		usleep((1 + rand(1)) * 1e6);
		$nats = nats_start(again => $nats);
		return [ $t, time ];
	},
	# rabbitmqctl stop (clients are told: connection.close 320), or the
	# Erlang VM killed (the node recovers its durable queue at start)
	rabbit_restart => sub { rabbit_down(\&rmq_stop) },
	rabbit_kill9 => sub { rabbit_down(\&rmq_kill) },
	daemon_reload => sub {
		# the file rewritten with another batch size, then SIGHUP
		my $t = time;
		$dbatch = $dbatch == 50 ? 20 : 50;
		open(my $fh, '>', $dconf_file) or die "$dconf_file: $!";
		print $fh daemon_yaml($dbatch);
		close $fh;
		qbd_signal($daemon, 'HUP');
		return [ $t, time ];
	});

# the receivers a fault is about: the daemon's for its faults, a broker's
# for its restarts, the extension's receiver for its faults, and all three
# the extension delivers to for a fault of its cluster or its workers
sub receiver_of
{
	my ($type) = @_;
	return 'receiver-d' if $type =~ /daemon|role/;
	return 'receiver-n' if $type =~ /nats/;
	return 'receiver-r' if $type =~ /rabbit/;
	return 'receiver-x receiver-n receiver-r' if $type =~ /kill9_worker|kill9_postmaster|config_reload/;
	return 'receiver-x';
}

# ---------------------------------------------------------------- the run

my @writers = ((map { writer('x', $_, $WRITERS) } 0 .. $WRITERS - 1),
	(map { writer('d', $_, $DWRITERS) } 0 .. $DWRITERS - 1), writer('n', 0, 1), writer('r', 0, 1), writer('h', 0, 1));
note "chaos: $WRITERS writers into the extension's cluster, $DWRITERS into the daemon's, 1 to NATS, 1 to RabbitMQ, 1 of webhooks, "
  . "$TX_RATE transactions a second each of $ROWS rows, $KEYS keys each, $SECONDS s; faults: @types";
my $t_start = time;
my $oks = sub { return (eval { qb_sink_stats($sink)->{ok} } // 0) + (eval { qb_sink_stats($dsink)->{ok} } // 0) };
qb_wait_for(sub { qb_sink_stats($sink)->{ok} > 0 && qb_sink_stats($dsink)->{ok} > 0 },
	'chaos: deliveries under way, by the extension and by the daemon', timeout => 60);
open(my $flog, '>', "$dir/faults.jsonl") or die $!;
$flog->autoflush(1);
my (@queue, %done);
while ((time - $t_start < $SECONDS || grep { !$done{$_} } @types) && time - $t_start < 3 * $SECONDS + 120)
{
	usleep((2 + rand(3)) * 1e6);
	@queue = shuffle @types unless @queue;
	my $type = shift @queue;
	my $span = $fault{$type}->();
	$done{$type}++;
	print $flog $json->encode({ fault => $type, start => $span->[0], end => $span->[1], receiver => receiver_of($type) }),
	  "\n";
	note sprintf('chaos: %s from %.1f to %.1f s', $type, $span->[0] - $t_start, $span->[1] - $t_start);
	# the next fault once deliveries resumed (bounded; the checker measures)
	my $s = $type =~ /daemon|role/ ? $dsink : $sink;
	my $count = $type =~ /nats/ ? sub { nats_count($nats, 'CHAOS') // 0 }
	  : $type =~ /rabbit/ ? sub { -s $rmq_raw // 0 }
	  : sub { eval { qb_sink_stats($s)->{ok} } // 0 };
	my $ok0 = $count->();
	my $deadline = time + 120;
	usleep(100_000) while time < $deadline && $count->() <= $ok0;
}
close $flog;
write_file("$dir/stop", '');
for my $pid (@writers)
{
	waitpid($pid, 0);
}
note sprintf('chaos: writers stopped after %.1f s', time - $t_start);
is(scalar(grep { !$done{$_} } @types), 0, 'chaos: every fault type was made at least once')
  or diag 'not made: ' . join(' ', grep { !$done{$_} } @types);

qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE state <> 'processed'}, '0',
	'chaos: the relay forwards every webhook the inbox stored', timeout => 300);
for my $n ([ $node, 'the extension' ], [ $dnode, 'the daemon' ])
{
	qb_wait_query($n->[0], q{SELECT count(*) FROM queuebox.outbox WHERE state NOT IN ('sent', 'dead')}, '0',
		"chaos, $n->[1]: every row settles (sent, or dead as asked) once the faults are over", timeout => 300);
}
# the business rows, and the webhooks the inbox stored (every row: a key
# stored twice would show twice)
write_file("$dir/committed.txt", (map { $_->safe_psql('postgres', 'SELECT token FROM chaos_tx ORDER BY token') . "\n" }
	  $node, $dnode), $node->safe_psql('postgres', q{SELECT idempotency_key FROM queuebox.inbox WHERE source = 'hooks'}) . "\n");
write_file("$dir/dead.jsonl", map { "$_\n" } grep { $_ ne '' } map { split /\n/, $_->safe_psql('postgres',
	q{SELECT json_build_object('key', key, 'seq', (payload->>'seq')::int) FROM queuebox.outbox WHERE state = 'dead' ORDER BY id}) }
	  $node, $dnode);
write_file("$dir/meta.json", $json->encode({
	seconds => $SECONDS, writers => $WRITERS, daemon_writers => $DWRITERS, tx_rate => $TX_RATE, rows_per_tx => $ROWS,
	keys => $KEYS, timeout_ms => $TIMEOUT_MS, claim_timeout_ms => $CLAIM_MS,
	slack_before_s => $TIMEOUT_MS / 1000 + 2, slack_after_s => $CLAIM_MS / 1000 + 10 }));
qbd_signal($daemon, 'TERM');
isnt(qbd_wait_exit($daemon, 30), undef, 'chaos: the daemon stops on SIGTERM');
qb_sink_stop($_) for $sink, $dsink;
copy($sink->{log}, "$dir/receiver-x.jsonl") or die "copy $sink->{log}: $!";
copy($dsink->{log}, "$dir/receiver-d.jsonl") or die "copy $dsink->{log}: $!";
# the stream, as the receivers' records: when it stored each message, its
# Nats-Msg-Id, its data (JetStream drops a repeated Nats-Msg-Id within its
# duplicate window, 2 minutes)
write_file("$dir/receiver-n.jsonl", map {
	$json->encode({ t_us => $_->{time_us}, status => 200, headers => { 'x-message-id' => $_->{headers}{'Nats-Msg-Id'} // '' },
		body => $_->{data}, seq => $_->{seq} }) . "\n" } @{ nats_dump($nats, 'CHAOS') });
nats_stop($nats);
# the queue's record: what the consumer got once every row is sent; a
# message the broker gave again (its ack lost in a restart) is left out
# when the consumer already has it: that is the broker's, not a send
write_file("$dir/rabbit-stop", '');
my ($gone, $reaped) = (time + 60, 0);
until ($reaped || time > $gone)
{
	$reaped = waitpid($rmq_consumer, WNOHANG) == $rmq_consumer;
	usleep(100_000) unless $reaped;
}
ok($reaped && $? == 0, 'chaos: the RabbitMQ consumer took every message and stopped');
rmq_stop($rmq);
my %consumed;
write_file("$dir/receiver-r.jsonl", map {
	my $m = decode_json($_);
	($m->{redelivered} && $consumed{ $m->{message_id} }++) ? () : do {
		$consumed{ $m->{message_id} }++;
		$json->encode({ t_us => $m->{t_us}, status => 200, headers => { 'x-message-id' => $m->{message_id} },
			body => $m->{body} }) . "\n" } } grep { /\S/ } split /\n/, slurp_file($rmq_raw));

my ($rc, $report) = run_check($dir);
note "the checker's report:\n$report";
write_file("$dir/report.txt", $report);
is($rc, 0, 'chaos: the checker finds nothing lost, reordered or unexplained') or diag $report;
like($report, qr/^rows: (\d+) committed .* 0 lost, 0 reordered, 0 phantom$/m, 'chaos: its counts say so');
if ($ENV{QB_CHAOS_OUT})
{
	make_path($ENV{QB_CHAOS_OUT});
	copy($_, $ENV{QB_CHAOS_OUT}) or die "copy $_: $!" for glob("$dir/*");
	copy($node->logfile, "$ENV{QB_CHAOS_OUT}/server.log");
	copy($dlogs[$_], "$ENV{QB_CHAOS_OUT}/daemon-$_.log") for 0 .. $#dlogs;
}

$_->stop for $node, $dnode;
done_testing();
